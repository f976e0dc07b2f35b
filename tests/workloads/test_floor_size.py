"""All-reduce floors judged at the size they are published at: the sweep's all-reduce goes on to
the profile's collective.floor_bytes, bounded by the GPUs' free memory and the launch's time, and
a floor the sweep could not reach is not judged at a smaller size (WARN, or FAIL against the
floor derived from the links). Through the CLI on scenarios, a real gloo launch and the rank
program's pieces in this process."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from checks.hw.measure import busbw
from checks.node import rules

GIB = 1 << 30


def by_id(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["id"]: c for c in report["checks"]}


def _scenario(tmp_path: Path, base: str, free_bytes: int) -> str:
    path = tmp_path / "scenario.yaml"
    path.write_text(f"extends: {base}\nmeasurements:\n  collectives:\n"
                    f"    free_bytes: {free_bytes}\n")
    return str(path)


# --- sizing (pure) ----------------------------------------------------------------------------

def test_only_all_reduce_goes_on_to_the_floor_which_is_swept_even_off_the_grid() -> None:
    assert busbw.op_sizes("all_gather", 8, 64, 2, 1024) == ([8, 16, 32, 64], [])
    assert busbw.op_sizes("all_reduce", 8, 64, 2, None) == ([8, 16, 32, 64], [])
    assert busbw.op_sizes("all_reduce", 8, 64, 2, 256) == ([8, 16, 32, 64], [128, 256])
    assert busbw.op_sizes("all_reduce", 8, 64, 8, 1000) == ([8, 64], [512, 1000])
    main, more = busbw.op_sizes("all_reduce", 8, 256 << 20, 2, 16 * GIB)
    assert main[-1] == 256 << 20 and more == [512 << 20, GIB, 2 * GIB, 4 * GIB, 8 * GIB, 16 * GIB]


def test_the_largest_verified_message_comes_from_free_memory() -> None:
    """Input, output and reference (+ the comparison's mask) per rank, and headroom for NCCL:
    a 16 GiB all-reduce needs 54 GiB free; an 80 GB GPU with 40 GiB used by another process
    holds at most 11.7 GiB, so the sweep stops at 8 GiB."""
    assert busbw.max_verified_bytes(int(3.25 * 16 * GIB) + busbw.VERIFY_HEADROOM_BYTES) == 16 * GIB
    assert busbw.max_verified_bytes(busbw.VERIFY_HEADROOM_BYTES - 1) == 0
    kept, why = busbw.memory_cut("all_reduce", [4 * GIB, 8 * GIB, 16 * GIB], 40 * GIB)
    assert kept == [4 * GIB, 8 * GIB]
    assert why is not None and "40 GiB of GPU memory free" in why and "11.7 GiB" in why
    assert busbw.memory_cut("all_reduce", [16 * GIB], None) == ([16 * GIB], None)
    assert busbw.memory_cut("broadcast", [16 * GIB], 40 * GIB) == ([16 * GIB], None)


# --- the check, through the CLI on scenarios -------------------------------------------------

def test_h100_sxm_floor_is_judged_at_16_gib(run_cli: Any) -> None:
    """Azure's ND H100 v5 gate (460 GB/s) runs all_reduce_perf at 16 GiB only: the h100-sxm
    floor is judged on a sweep that reaches 16 GiB, and the result says so."""
    code, report = run_cli("--simulate", "h100-sxm-8x-healthy", "--only", "nccl-allreduce")
    (result,) = by_id(report)["nccl-allreduce"]["results"]
    assert code == 0 and result["status"] == "PASS"
    assert max(r["bytes"] for r in result["details"]["curve"]) == 16 * GIB
    assert "published at 16 GiB" in result["expected"]
    assert result["details"]["sweep_reach"]["floor_bytes"] == 16 * GIB


def test_a_floor_the_free_memory_cannot_reach_is_not_judged_at_a_smaller_size(
        run_cli: Any, tmp_path: Path) -> None:
    """40 GiB free per GPU (another process holds the rest) holds a verified all-reduce of at
    most 11.7 GiB: the sweep stops at 4 GiB of the scenario's sizes and the 400 GB/s floor,
    published at 16 GiB, is not judged there: WARN naming the size and why, never a PASS."""
    code, report = run_cli("--simulate", _scenario(tmp_path, "h100-sxm-8x-healthy", 40 * GIB),
                           "--only", "nccl-allreduce")
    (result,) = by_id(report)["nccl-allreduce"]["results"]
    assert code == 0 and result["status"] == "WARN", result["message"]  # WARN: exit 0
    assert "could not reach the size the floor is published at (16 GiB)" in result["message"]
    assert "40 GiB of GPU memory free" in result["message"]
    assert max(r["bytes"] for r in result["details"]["curve"]) == 4 * GIB
    assert result["details"]["sweep_reach"]["all_reduce_reached_bytes"] == 4 * GIB
    assert result["remedy"] and "gpu-occupied" in result["remedy"]


def test_a_slow_node_that_cannot_reach_the_floors_size_still_fails_on_its_links(
        run_cli: Any, tmp_path: Path) -> None:
    """NCCL_P2P_DISABLE=1 (180 GB/s) with the memory short of 16 GiB: not judged against the
    profile's floor, but below the floor its NVLinks give (18 x 25 x 0.7 = 315) at the sizes
    reached: FAIL, saying both."""
    code, report = run_cli("--simulate", _scenario(tmp_path, "workload-low-busbw", 40 * GIB),
                           "--only", "nccl-allreduce")
    (result,) = by_id(report)["nccl-allreduce"]["results"]
    assert code == 1 and result["status"] == "FAIL"
    assert "below 315 GB/s derived from its links" in result["message"]
    assert "could not reach the size the floor is published at" in result["message"]


def test_an_unsized_floor_says_its_source_gives_no_size() -> None:
    from checks import profiles
    from checks.hw.fixture import FixtureBackend, load_scenario
    from checks.node.context import Context, Options
    from checks.node.suite.collective import busbw_threshold, gpu_sweep

    ctx = Context(FixtureBackend(load_scenario("blackwell-b200-8x-healthy")), profiles.load("b200"),
                  Options(level="standard"))
    threshold = busbw_threshold(ctx, 8)
    assert threshold is not None and threshold.value == 690
    assert ("its source states no message size; judged on the peak busbw of sizes up to "
            "256 MiB") in threshold.source
    assert "floor_bytes" not in gpu_sweep(ctx, dict(ctx.profile.get("collective.sweep_gpu")), 8)


# --- the rank program for real: gloo ranks under the launcher --------------------------------

SMALL = {"min_bytes": 8, "max_bytes": 65536, "factor": 8, "warmup": 1, "iters": 2,
         "check_iters": 1, "check_elems": 1001}


@pytest.mark.slow
def test_gloo_ranks_sweep_all_reduce_to_the_floor_within_the_memory_given(tmp_path: Path) -> None:
    """Two gloo ranks: all-reduce goes on past max_bytes to a floor off the factor's grid
    (1 MiB); told that only enough memory for a 300 kB verified all-reduce is free, they stop
    at 256 KiB and say why, and that measurement is not judged against the floor."""
    from checks.hw.measure import collective_run
    from checks.node.suite.collective import judge_collectives

    m = collective_run.run(nproc=2, sweep={**SMALL, "floor_bytes": 1 << 20}, backend="gloo",
                           timeout_s=90, stall_s=30, start_timeout_s=60)
    assert m["ok"], m["summary"] + m["log_tail"]
    assert [r["bytes"] for r in m["ops"]["all_reduce"]] == [8, 64, 512, 4096, 32768, 262144,
                                                            1 << 20]
    assert [r["bytes"] for r in m["ops"]["broadcast"]][-1] == 32768  # the others stop at max
    assert m["cut"] == {} and m["asked_bytes"]["all_reduce"] == 1 << 20
    assert all(r["wrong"] == 0 for rows in m["ops"].values() for r in rows)

    free = busbw.VERIFY_HEADROOM_BYTES + int(3.25 * 300_000)
    m = collective_run.run(nproc=2, sweep={**SMALL, "floor_bytes": 1 << 20, "free_bytes": free},
                           backend="gloo", timeout_s=90, stall_s=30, start_timeout_s=60)
    assert m["ok"], m["summary"] + m["log_tail"]
    assert [r["bytes"] for r in m["ops"]["all_reduce"]][-1] == 262144
    assert "verified all_reduce of at most" in m["cut"]["all_reduce"]
    assert m["free_bytes"] == free
    result = judge_collectives(m, rules.Threshold(1e9, "test floor"), on_gpu=True,
                               floor_bytes=1 << 20)
    assert result.status == "WARN"
    assert "could not reach the size the floor is published at (1 MiB)" in result.message


# --- the rank program's pieces in this process -----------------------------------------------

def test_the_sweep_stops_before_a_size_that_would_pass_the_deadline(one_rank_group: Any) -> None:
    from checks.hw.measure import collective_rank

    c, rank = one_rank_group
    pace = collective_rank.Pace(deadline=time.time() - 1)
    rows = collective_rank.sweep(c, rank, "all_reduce", [64, 4096, 65536], 1, 1, pace)
    assert [r["bytes"] for r in rows] == [64]
    assert pace.stopped and "4 KiB would take about" in pace.stopped
    assert "left before the launch's deadline" in pace.stopped
    # the next sweep does not start either: its first size is judged from the last one
    assert collective_rank.sweep(c, rank, "broadcast", [1 << 20], 1, 1, pace) == []
    slow = collective_rank.Pace(step_max_s=1e-9)
    rows = collective_rank.sweep(c, rank, "all_reduce", [64, 4096], 1, 1, slow)
    assert len(rows) == 1 and slow.stopped and "without a heartbeat" in slow.stopped
    assert len(collective_rank.sweep(c, rank, "all_reduce", [64, 4096], 1, 1,
                                     collective_rank.Pace())) == 2


@pytest.mark.parametrize("start,count", [(0, 1), (0, 1000), (250, 7), (12345, 3000)])
def test_patterns_are_the_exact_integers_without_int64_buffers(start: int, count: int) -> None:
    """The patterns are built from one period in float32 (one message-sized buffer): the same
    integers as the int64 formula they replaced, so every comparison stays exact."""
    import torch

    from checks.hw.measure import collective_rank

    rank = SimpleNamespace(rank=0, local_rank=0, world_size=8)
    c = collective_rank.Collectives(rank, torch.device("cpu"))  # type: ignore[arg-type]
    idx = torch.arange(start, start + count, dtype=torch.int64) % collective_rank.PERIOD
    for k in (0, 3):
        scale = collective_rank._scale(k)
        assert torch.equal(c.pattern(5, k, start, count), (6 * scale + idx).to(torch.float32))
        assert torch.equal(c.reduced(k, start, count),
                           (scale * 8 * 9 // 2 + 8 * idx).to(torch.float32))
