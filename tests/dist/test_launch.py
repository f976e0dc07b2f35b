"""checks.supervise.launch (forkrun: one host) with tests/dist/probe_rank.py: a clean run, and each
injected fault named on the right rank, in bounded time, with no process left behind."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from checks.supervise import launch, procs
from checks.supervise.rank import ENV_WORKDIR

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
# Only the hang test relies on the stall limit; the others keep it well above start-up time on
# a loaded 2-core machine.
ENV = {"PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT)])}


def run(tmp_path: Path, inject: str = "", iters: int = 5, stall_s: float = 30.0
        ) -> launch.LaunchOutcome:
    env = {**ENV, "NODECERT_INJECT": inject} if inject else ENV
    return launch.launch("probe_rank", [str(iters)], nproc=2, timeout_s=90, stall_s=stall_s,
                         start_timeout_s=60, env=env, workdir=tmp_path / "work")


def assert_nothing_left(outcome: launch.LaunchOutcome, tmp_path: Path) -> None:
    assert outcome.leftover_pids == []
    assert procs.with_env(ENV_WORKDIR, str(tmp_path / "work")) == []


def test_clean_run_reports_every_rank(tmp_path: Path) -> None:
    outcome = run(tmp_path)
    assert outcome.ok, outcome.summary + outcome.log_tail
    assert outcome.summary == "2 rank(s) finished"
    assert outcome.culprits == []
    assert {r: res["sum"] for r, res in outcome.results.items()} == {0: 3.0, 1: 3.0}
    assert_nothing_left(outcome, tmp_path)


def test_hung_rank_is_named_and_group_killed(tmp_path: Path) -> None:
    outcome = run(tmp_path, "hang:1@all_reduce iter 2", iters=20, stall_s=3)
    assert not outcome.ok and outcome.hung
    assert outcome.culprits == [1]
    assert "rank 1" in outcome.summary and "stopped heartbeating" in outcome.summary
    assert "all_reduce iter 1" in outcome.summary  # its last heartbeat
    assert outcome.ranks[1].state == "hung"
    assert outcome.duration_s < 60  # start-up + 3 s stall, not the 90 s hard limit
    assert_nothing_left(outcome, tmp_path)


@pytest.mark.parametrize("inject", ["exit:1@all_reduce iter 1", "exit:1"],
                         ids=["mid-run", "before-first-heartbeat"])
def test_rank_exiting_non_zero_is_named_with_its_status(tmp_path: Path, inject: str) -> None:
    outcome = run(tmp_path, inject)
    assert not outcome.ok and not outcome.hung
    assert outcome.culprits == [1]
    assert outcome.ranks[1].state == "crashed" and outcome.ranks[1].exitcode == 3
    assert "exit status 3" in outcome.summary
    assert_nothing_left(outcome, tmp_path)


@pytest.mark.parametrize(("states", "culprits"), [
    # rank 1 died at start-up; rank 0 had not heartbeated yet when torchrun stopped it (a loaded
    # host): the crash is the cause, the slow starter is not blamed
    ({0: "missing", 1: "crashed"}, [1]),
    # nobody failed on their own: the rank that never started is the one to look at
    ({0: "missing", 1: "error-peer"}, [0]),
    ({0: "error", 1: "error-peer"}, [0]),
], ids=["crash-beats-missing", "missing-beats-peer-loss", "own-error-beats-peer-loss"])
def test_culprit_is_the_rank_that_failed_on_its_own(states: dict[int, str],
                                                     culprits: list[int]) -> None:
    ranks = {}
    for rank, state in states.items():
        error = {"error-peer": "Connection reset by peer", "error": "ValueError: bad batch"}.get(state)
        ranks[rank] = launch.RankState(rank=rank, state=state.split("-")[0], error=error,
                                       exitcode=3 if state == "crashed" else None)
    outcome = launch.LaunchOutcome(ok=False, summary="", ranks=ranks, returncode=1)
    launch._judge(outcome, "job failed", world_size=2)
    assert outcome.culprits == culprits, outcome.summary


def test_rank_killed_by_a_signal_is_named(tmp_path: Path) -> None:
    outcome = run(tmp_path, "kill:0@all_reduce iter 1")
    assert not outcome.ok
    assert outcome.culprits == [0]
    assert "SIGKILL" in outcome.summary
    assert_nothing_left(outcome, tmp_path)


def test_rank_raising_is_named_with_its_error(tmp_path: Path) -> None:
    outcome = run(tmp_path, "raise:1@all_reduce iter 3")
    assert not outcome.ok
    assert outcome.culprits == [1]
    assert outcome.ranks[1].state == "error"
    assert "injected fault at all_reduce iter 3" in (outcome.ranks[1].error or "")
    assert_nothing_left(outcome, tmp_path)
