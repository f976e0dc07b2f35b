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
    assert ops == set(busbw.OPS)
    assert result["details"]["env"] == {} or "NODECERT_INJECT" not in result["details"]["env"]
    assert result["details"]["world_size"] == 3
