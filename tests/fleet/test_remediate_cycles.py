"""Flapping counts every drain/resume cycle, whoever resumed: the health check resumes its own
plain drains when it passes, before the remediation loop's next run, and each of those resumes
goes to the loop's action log (remediate_state.note_resume, called by the wrapper's resume), so a
node that drains and resumes by the health check alone still escalates."""

from __future__ import annotations

from pathlib import Path

from checks.fleet import remediate
from checks.fleet.remediate_state import Policy, Run, note_resume


def _run(state_dir: Path, node: str) -> Run:
    return Run(node=node, directory=state_dir / "remediation", state_dir=state_dir, prefix="NODECERT",
               apply=True, policy=Policy(), checks_args=[], textfile_dir=None)


def test_the_health_checks_resumes_count_as_cycles(tmp_path: Path) -> None:
    run = _run(tmp_path, "gpu07")
    assert remediate.count_cycles(run) == 0
    for _ in range(3):
        note_resume(tmp_path, "gpu07", "health check", "NODECERT: FAIL clock-throttle GPU3")
    note_resume(tmp_path, "gpu08", "health check", "NODECERT: FAIL clock-throttle GPU1")
    assert remediate.count_cycles(run) == 3
    assert remediate.count_cycles(_run(tmp_path, "gpu08")) == 1


def test_a_log_that_cannot_be_written_changes_nothing(tmp_path: Path) -> None:
    (tmp_path / "remediation").write_text("not a directory")
    note_resume(tmp_path, "gpu07", "health check", "NODECERT: FAIL")  # no exception
