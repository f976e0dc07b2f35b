"""The collective check for real: gloo over CPU processes under torchrun, healthy and with
injected faults (NODECERT_INJECT) -- named ranks, bounded time, nothing left running."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from checks.hw.measure import busbw
from checks.hw.measure import collective_run as collective
from checks.node.suite.collective import judge_collectives
from checks.supervise import procs
from checks.supervise.rank import ENV_WORKDIR

pytestmark = pytest.mark.slow

SMALL = {"min_bytes": 8, "max_bytes": 65536, "factor": 8, "warmup": 1, "iters": 2,
         "check_iters": 3, "check_elems": 1001}


def run(tmp_path: Path, nproc: int, inject: str = "", stall_s: float = 20.0) -> dict[str, Any]:
    env = {"NODECERT_INJECT": inject} if inject else {}
    return collective.run(nproc=nproc, sweep=SMALL, backend="gloo", timeout_s=90,
                          stall_s=stall_s, start_timeout_s=60, env=env,
                          workdir=tmp_path / "work")


def assert_nothing_left(m: dict[str, Any], tmp_path: Path) -> None:
    assert m["leftover_pids"] == []
    assert procs.with_env(ENV_WORKDIR, str(tmp_path / "work")) == []


def test_three_ranks_exact_with_odd_world_size_factors(tmp_path: Path) -> None:
    m = run(tmp_path, 3)
    assert m["ok"], m["summary"] + m["log_tail"]
    assert m["backend"] == "gloo" and m["world_size"] == 3 and m["errors"] == []
    assert set(m["ops"]) == set(busbw.OPS)
    for op, rows in m["ops"].items():
        assert [r["wrong"] for r in rows] == [0] * len(rows)
        for r in rows:
            assert r["busbw_gbs"] == pytest.approx(r["algbw_gbs"] * busbw.bus_factor(op, 3))
    # all-gather/reduce-scatter buffers are whole multiples of the world size
    assert all(r["count"] % 3 == 0 for r in m["ops"]["all_gather"])
    assert "# nodecert all_reduce: 3 ranks, gloo" in m["table"]
    result = judge_collectives(m, None, on_gpu=False)
    assert result.status == "PASS" and result.details["figures"]["allreduce_busbw_gbs"] > 0
    assert_nothing_left(m, tmp_path)


def test_hanging_rank_is_named_within_the_stall_timeout(tmp_path: Path) -> None:
    t0 = time.monotonic()
    m = run(tmp_path, 2, inject="hang:1@check all_reduce 1", stall_s=3)
    assert time.monotonic() - t0 < 60
    assert m["hung"] and m["culprits"] == [1]
    result = judge_collectives(m, None, on_gpu=False)
    assert result.status == "FAIL" and result.value == [1]
    assert "hung" in result.message and "rank 1" in result.message
    assert "check all_reduce 0" in result.message  # the last phase it reported
    assert_nothing_left(m, tmp_path)


def test_rank_exiting_non_zero_is_named(tmp_path: Path) -> None:
    m = run(tmp_path, 2, inject="exit:0@check broadcast 1")
    assert not m["ok"] and not m["hung"]
    assert m["culprits"] == [0]
    result = judge_collectives(m, None, on_gpu=False)
    assert result.status == "FAIL" and "rank 0" in result.message
    assert "exit status 3" in result.message
    assert_nothing_left(m, tmp_path)


def test_corrupt_contribution_fails_naming_the_rank_through_the_cli(
        run_cli: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("NODECERT_INJECT", "corrupt:1")
    code, report = run_cli("--only", "nccl-allreduce", "--nproc", "3")
    assert code == 1
    (chk,) = report["checks"]
    (result,) = chk["results"]
    assert result["status"] == "FAIL" and result["fault_code"] == "COL001"
    assert result["value"] == [1]
    assert "all_reduce on rank 0" in result["message"]
    assert "first at index 5" in result["message"]
    assert "contribution of rank(s) 1 was already wrong" in result["message"]
    ops = {e["op"] for e in result["details"]["errors"]}
    from checks.hw.measure.collective_rank import EXACT_OPS

    assert ops == set(busbw.OPS) | set(EXACT_OPS)  # the corrupt rank spoils every collective
    assert result["details"]["env"] == {} or "NODECERT_INJECT" not in result["details"]["env"]
    assert result["details"]["world_size"] == 3


# --- the collectives real training adds: all-to-all (MoE), float8 all-gather, FSDP sizes ------

FSDP_SMALL = {**SMALL, "fsdp_elems": 1 << 18}


def test_all_to_all_float8_and_fsdp_sizes_exact_on_3_ranks(tmp_path: Path) -> None:
    m = collective.run(nproc=3, sweep=FSDP_SMALL, backend="gloo", timeout_s=90, stall_s=20,
                       start_timeout_s=60, workdir=tmp_path / "work", ops=["all_reduce"])
    assert m["ok"] and m["errors"] == [], m["summary"] + m["log_tail"]
    # gloo carries float8 as its bytes (the torchao float8 all-gather's wire format)
    assert m["exact_ops"] == ["all_to_all", "all_gather_float8"] and m["exact_skipped"] == {}
    assert m["fsdp_checked"] == {"reduce_scatter": (1 << 18) // 3 * 3,
                                 "all_gather": (1 << 18) // 3 * 3}
    result = judge_collectives(m, None, on_gpu=False)
    assert result.status == "PASS", result.message
    assert "3 collectives exact (all_reduce, all_to_all, all_gather_float8), " \
           "reduce-scatter/all-gather also at 1 MiB" in result.message
    assert_nothing_left(m, tmp_path)


@pytest.mark.parametrize(("op", "rank"), [("all_to_all", 2), ("all_gather_float8", 1),
                                          ("reduce_scatter", 1)])
def test_a_corrupt_rank_fails_the_new_collectives_naming_it(tmp_path: Path, op: str,
                                                            rank: int) -> None:
    """One element off by one in one rank's contribution: the check FAILs naming that rank (the
    source whose block arrived wrong, or the sender blamed after a wrong reduction)."""
    m = collective.run(nproc=3, sweep=FSDP_SMALL, backend="gloo", timeout_s=90, stall_s=20,
                       start_timeout_s=60, workdir=tmp_path / "work",
                       env={"NODECERT_INJECT": f"corrupt:{rank}@{op}"}, ops=["reduce_scatter"])
    assert m["ok"], m["summary"] + m["log_tail"]
    wrong = [e for e in m["errors"] if e["op"] == op]
    assert wrong, m["errors"]
    result = judge_collectives(m, None, on_gpu=False)
    assert result.status == "FAIL" and rank in result.value, (result.message, result.value)
    assert f"{op} on rank" in result.message
    assert_nothing_left(m, tmp_path)


def test_float8_all_gather_skips_with_the_reason_where_unsupported(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from checks.hw.measure import collective_rank

    assert collective_rank.float8_unsupported(torch.device("cpu")) is None
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    why = collective_rank.float8_unsupported(torch.device("cuda", 0))
    assert why == ("GPU compute capability 8.0 has no float8 tensor cores (float8 training "
                   "needs 8.9 or later)")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert collective_rank.float8_unsupported(torch.device("cuda", 0)) is None
