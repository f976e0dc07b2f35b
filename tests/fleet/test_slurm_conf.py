"""The deadlines the Slurm wrappers take from slurm.conf (checks/fleet/slurm_conf.py): the whole
table of what fits and what is refused, from the limits slurm.conf(5) documents."""

from __future__ import annotations

from pathlib import Path

import pytest

from checks.fleet import slurm_conf
from checks.fleet.slurm_conf import DeadlineError, Limits


def _limits(tmp_path: Path, text: str) -> Limits:
    conf = tmp_path / "slurm.conf"
    conf.write_text(text)
    return slurm_conf.read(conf)


def test_parameters_skip_node_and_partition_lines_and_comments(tmp_path) -> None:
    limits = _limits(tmp_path, "# MessageTimeout=99\nmessagetimeout=20  # shared nodes\n"
                               "NodeName=gpu[001-004] MessageTimeout=1\n"
                               "SchedulerParameters=bf_continue,nohold_on_prolog_fail\n"
                               "PrologEpilogTimeout=120\n")
    assert limits.message_timeout_s == 20 and limits.prolog_epilog_timeout_s == 120
    assert limits.nohold_on_prolog_fail


def test_no_file_means_slurms_defaults(tmp_path) -> None:
    limits = slurm_conf.read(tmp_path / "absent.conf")
    assert (limits.message_timeout_s, limits.prolog_epilog_timeout_s, limits.source) == (
        10, None, "defaults")


# MessageTimeout, PrologEpilogTimeout, --timeout, --budget -> check deadline, or the refusal
TABLE = [
    ("10", None, None, None, 35.0),
    ("10", None, "35", "30", 35.0),
    ("5", None, None, None, 45.0),
    ("10", "40", None, None, 15.0),  # the Epilog's limit is the smaller
    ("10", "65534", None, None, 35.0),  # Slurm's "unset" value
    ("10", None, "36", None, "at most 35 s"),
    ("10", None, "120", None, "slurmd kills a HealthCheckProgram after 60 s"),
    ("10", None, None, "31", "--budget 31 s cannot fit"),
    ("10", "40", "20", None, "cannot fit the Epilog: PrologEpilogTimeout=40 leaves 15 s"),
    ("30", None, None, None, "no time left for the checks"),
    ("10", None, "0", None, "must be a positive number"),
    ("ten", None, None, None, "MessageTimeout=ten is not a whole number"),
]


@pytest.mark.parametrize(("message", "prolog_epilog", "timeout", "budget", "expected"), TABLE)
def test_the_deadline_table(tmp_path, message, prolog_epilog, timeout, budget, expected) -> None:
    text = f"MessageTimeout={message}\n" + (f"PrologEpilogTimeout={prolog_epilog}\n"
                                            if prolog_epilog else "")
    try:
        limits = _limits(tmp_path, text)
        plan = slurm_conf.plan(limits, float(timeout) if timeout else None,
                               float(budget) if budget else None)
    except DeadlineError as exc:
        assert isinstance(expected, str) and expected in str(exc), str(exc)
        assert "\n" not in str(exc)
        return
    assert plan.check_timeout_s == expected
    assert plan.check_timeout_s + slurm_conf.START_RESERVE_S + 2 * limits.message_timeout_s <= 60


def test_the_prolog_calls_fit_message_timeout(tmp_path) -> None:
    plan = slurm_conf.plan(_limits(tmp_path, "MessageTimeout=10\n"), None, None)
    assert plan.prolog_call_timeout_s * 2 + slurm_conf.START_RESERVE_S <= 10


@pytest.mark.parametrize(("sched", "noted"), [("", True), ("nohold_on_prolog_fail", False)])
def test_scripts_say_when_a_refused_job_would_be_held(tmp_path, capsys, sched, noted) -> None:
    """slurm.conf(5): a failed Prolog requeues the job held unless nohold_on_prolog_fail."""
    from checks.fleet import slurm

    conf = tmp_path / "slurm.conf"
    conf.write_text(f"MessageTimeout=10\nSchedulerParameters={sched}\n")
    assert slurm.main(["scripts", str(tmp_path / "bin"), "--slurm-conf", str(conf)]) == 0
    out = capsys.readouterr().out
    assert ("requeued held (launch_failed_requeued_held)" in out) is noted
    prolog = (tmp_path / "bin" / "nodecert-prolog").read_text()
    assert "prolog --apply" in prolog and "--slurm-timeout 2.5" in prolog


def test_scripts_warn_when_they_find_no_slurm_conf(tmp_path, capsys, monkeypatch) -> None:
    """The wrappers' Slurm calls need the slurm.conf slurmd uses; scripts says when it finds none
    (its deadlines then come from Slurm's defaults) and says nothing when it reads one."""
    from checks.fleet import slurm

    monkeypatch.delenv("SLURM_CONF", raising=False)
    missing = tmp_path / "nowhere" / "slurm.conf"
    assert slurm.main(["scripts", str(tmp_path / "bin"), "--slurm-conf", str(missing)]) == 0
    out = capsys.readouterr().out
    assert f"note: no slurm.conf at {missing} here" in out and "Slurm's defaults" in out
    conf = tmp_path / "slurm.conf"
    conf.write_text("MessageTimeout=10\n")
    assert slurm.main(["scripts", str(tmp_path / "bin2"), "--slurm-conf", str(conf)]) == 0
    assert "no slurm.conf" not in capsys.readouterr().out
