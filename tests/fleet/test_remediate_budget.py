"""The remediation budget's claim when claims interleave, against an in-process slurmctld that
stamps each reason with the second it was set (as sinfo %H shows it) and a clock the test moves.

CI's run of 4e28808 on the real three-node cluster: rm2 set its reason and read the cluster
before rm1 had claimed; rm1 claimed 25 ms later, read both and kept its place because its name
sorts first. Both rebooted at once with a budget of one. The claim is now a CLAIM reason, read
back once its second has passed on slurmctld's clock, with nodes past their claim always ahead."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from checks.fleet import remediate_guard, slurm_control
from checks.fleet.remediate_state import Policy, Record, Run

DRAINED = "NODECERT: FAIL GPU005 xid-events GPU0 Xid 79"
STAGE = "NODECERT: REBOOT GPU005 1/2, then verify standard"
T0 = 1_796_626_049.5  # 2026-12-07, the second of CI's race


class Clock:
    """time.time() and time.sleep() for remediate_guard; `during_sleep` runs once, inside the
    first sleep it is armed for, as another node's loop would run while this one waits."""

    def __init__(self, now: float) -> None:
        self.now = now
        self.during_sleep: Callable[[], None] | None = None

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        start, hook, self.during_sleep = self.now, self.during_sleep, None
        if hook:
            hook()
        self.now = max(self.now, start + seconds)


class Slurmctld:
    """sinfo -N -o '%N|%P|%T|%H|%E' and scontrol update ... Reason=, in one process."""

    def __init__(self, clock: Clock, names: list[str]) -> None:
        self.clock = clock
        self.reasons = {n: (DRAINED, int(T0) - 600) for n in names}

    def __call__(self, cmd: list[str], timeout_s: float | None = None) -> str:
        if cmd[0] == "sinfo":
            return "".join(
                f"{n}|gpu|drained|{time.strftime('%Y-%m-%dT%H:%M:%S', time.localtime(at))}|{r}\n"
                for n, (r, at) in sorted(self.reasons.items()))
        args = dict(a.split("=", 1) for a in cmd[2:])
        assert cmd[:2] == ["scontrol", "update"] and args["State"] == "DRAIN", cmd
        self.reasons[args["NodeName"]] = (args["Reason"], int(self.clock.now))
        return ""


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> tuple[Clock, Slurmctld]:
    clock = Clock(T0)
    ctld = Slurmctld(clock, ["rm1", "rm2", "rm3"])
    monkeypatch.setattr(remediate_guard, "time", clock)
    monkeypatch.setattr(slurm_control, "run", ctld)
    return clock, ctld


def _run(tmp_path: Path, node: str) -> Run:
    run = Run(node=node, directory=tmp_path / node / "remediation", state_dir=tmp_path / node,
              prefix="NODECERT", apply=True, policy=Policy(), checks_args=[], textfile_dir=None)
    run.look()
    return run


def _claim(tmp_path: Path, node: str, read_before: tuple[int, list[str]] | None = None) -> bool:
    """One node's claim; read_before: what its first read of the budget saw, taken earlier (the
    node read the cluster, then others wrote, then it claimed)."""
    run = _run(tmp_path, node)
    rec = Record(stage="detected", fault="GPU005", remedy="reboot", reason=DRAINED)
    if read_before is None:
        return remediate_guard.claim(run, rec, STAGE, "detected")
    real, views = remediate_guard.budget, [read_before]
    remediate_guard.budget = lambda run: views.pop() if views else real(run)  # type: ignore[assignment]
    try:
        return remediate_guard.claim(run, rec, STAGE, "detected")
    finally:
        remediate_guard.budget = real


def test_a_claim_read_before_another_was_made_gives_way_to_it(cluster, tmp_path: Path) -> None:
    """CI's order: rm1 and rm2 both find the budget free; rm2 claims and reads the cluster, then
    rm1 claims 25 ms later in the same second. One of three (the budget's 10 %, at least one)
    goes on, and the other sets its reason back."""
    clock, ctld = cluster
    rm1_read = remediate_guard.budget(_run(tmp_path, "rm1"))
    assert rm1_read == (1, [])
    results: dict[str, bool] = {}

    def rm1_claims() -> None:
        clock.now = T0 + 0.025
        results["rm1"] = _claim(tmp_path, "rm1", rm1_read)

    clock.during_sleep = rm1_claims
    results["rm2"] = _claim(tmp_path, "rm2")
    if "rm1" not in results:  # a claim that never waits: rm1 comes after rm2 has read
        rm1_claims()
    assert sorted(results.values()) == [False, True], results
    assert results == {"rm1": True, "rm2": False}  # the same second: the first name
    assert ctld.reasons["rm1"][0] == STAGE and ctld.reasons["rm2"][0] == DRAINED
    log = (tmp_path / "rm2/remediation/actions.jsonl").read_text()
    assert "claimed together with rm1, ahead of this node; at most 1 at once" in log


def test_the_earlier_second_goes_first_whatever_the_names(cluster, tmp_path: Path) -> None:
    clock, ctld = cluster
    results: dict[str, bool] = {}

    rm1_read = remediate_guard.budget(_run(tmp_path, "rm1"))

    def rm1_claims() -> None:
        clock.now = T0 + 0.6  # the next second
        results["rm1"] = _claim(tmp_path, "rm1", rm1_read)

    clock.during_sleep = rm1_claims
    results["rm3"] = _claim(tmp_path, "rm3")
    if "rm1" not in results:
        rm1_claims()
    assert results == {"rm1": False, "rm3": True}
    assert ctld.reasons["rm3"][0] == STAGE and ctld.reasons["rm1"][0] == DRAINED


def test_a_claim_waits_for_its_second_to_pass_and_no_longer(cluster, tmp_path: Path) -> None:
    clock, ctld = cluster
    assert _claim(tmp_path, "rm3")
    # stamped in T0's second: read back 1 s after that second ended (SETTLE_S), then the stage
    assert clock.now == int(T0) + 1 + remediate_guard.SETTLE_S
    assert ctld.reasons["rm3"] == (STAGE, int(T0) + 2)


def test_a_node_in_remediation_keeps_the_others_out(cluster, tmp_path: Path) -> None:
    clock, ctld = cluster
    ctld.reasons["rm3"] = ("NODECERT: VERIFY GPU005 after reboot 1/2, level standard", int(T0))
    assert not _claim(tmp_path, "rm1")
    assert ctld.reasons["rm1"][0] == DRAINED and clock.now == T0  # refused before any write


def test_the_health_check_leaves_a_claiming_node_to_the_loop() -> None:
    assert slurm_control.held_by_remediation(f"NODECERT: CLAIM {STAGE[10:]}", "NODECERT")
