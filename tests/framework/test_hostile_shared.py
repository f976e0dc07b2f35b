"""Shared directories and concurrent runs: a neighbour who holds a lock, a directory another user
can write while root reads or writes it, and two runs writing one report.

What is proved and how: the lock is a real flock held by this test; the directories are real
(chmod o+w, and chown to another uid when the test runs as root); "as root" is played by
monkeypatching safeio._euid where the test does not run as root (the rule applies only to
root); the two runs are two real `python -m checks` processes."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from checks import safeio
from checks.devtools import synthetic
from checks.devtools.synthetic import Broken
from checks.fleet import fleet_cli, history, slurm_gate
from checks.node import node_cli
from checks.report import aggregate

ROOT = Path(__file__).resolve().parents[2]
IS_ROOT = os.geteuid() == 0


@contextlib.contextmanager
def held_flock(directory: Path, release_after_s: float) -> Iterator[None]:
    """A neighbour's flock on `directory`, released after `release_after_s` at the latest (so
    the code from before the fix, which waited for ever, fails the test instead of hanging)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    timer = threading.Timer(release_after_s, fcntl.flock, (fd, fcntl.LOCK_UN))
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        os.close(fd)


def _one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


# --- a lock held by someone else ------------------------------------------------------------

def test_a_held_directory_lock_is_an_error_not_a_hang(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(safeio, "LOCK_WAIT_S", 0.5, raising=False)
    out = tmp_path / "shared"
    out.mkdir()
    with held_flock(out, release_after_s=8):
        t0 = time.monotonic()
        code = node_cli.main(["--simulate", "h100-sxm-8x-healthy", "--level", "quick", "-q",
                              "--json", str(out / "report.json")])
        waited = time.monotonic() - t0
    assert code == 2 and waited < 6, waited
    line = _one_error_line(capsys.readouterr().err)
    assert "lock on the directory" in line and "report.json" in line
    assert not list(out.iterdir())  # no report, no temporary left behind


def test_the_slurm_state_lock_has_a_deadline(tmp_path) -> None:
    state = tmp_path / "state"
    with slurm_gate.state_lock(state, wait_s=0) as first:
        assert first
        t0 = time.monotonic()
        with slurm_gate.state_lock(state, wait_s=0.3) as second:
            assert second is False
        assert time.monotonic() - t0 < 3


# --- two runs, one report -------------------------------------------------------------------

def _checks_process(scenario: str, target: Path) -> subprocess.Popen[str]:
    # a real `python -m checks` run, its directory-lock wait raised so the test decides the order
    code = ("import runpy, sys; import checks.safeio as s; s.LOCK_WAIT_S = 120; "
            f"sys.argv = ['checks', '--simulate', {scenario!r}, '--level', 'quick', '-q', "
            f"'--json', {str(target)!r}]; runpy.run_module('checks', run_name='__main__')")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)


def test_two_runs_writing_one_report_never_hide_one(tmp_path) -> None:
    """Both runs finish their checks before either writes (the test holds the directory lock
    until both temporaries exist): the second writer finds the report another run wrote after it
    started, keeps its own beside it and says so. Before, the last writer silently won."""
    out = tmp_path / "out"
    out.mkdir()
    target = out / "report.json"
    with held_flock(out, release_after_s=150):
        procs = [_checks_process("fault-xid-79", target), _checks_process("h100-sxm-8x-healthy", target)]
        try:
            deadline = time.monotonic() + 120
            while len(list(out.glob(".report.json.*.tmp"))) < 2:
                assert time.monotonic() < deadline, "the two runs did not reach their write"
                assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
                time.sleep(0.05)
        except BaseException:
            for p in procs:
                p.kill()
            raise
    results = [(p.wait(timeout=60), *p.communicate()) for p in procs]
    codes = sorted(r[0] for r in results)
    refused = [err for code, _, err in results if code == 2]
    assert len(refused) == 1, results
    line = _one_error_line(refused[0])
    assert "another run wrote it after this run started" in line and str(target) in line
    beside = [p for p in out.iterdir() if p.name.startswith("report.json.concurrent-")]
    assert len(beside) == 1 and beside[0].name in line
    verdicts = {json.loads(target.read_text())["verdict"], json.loads(beside[0].read_text())["verdict"]}
    assert verdicts == {"PASS", "FAIL"}  # neither run's result is lost
    assert codes in ([0, 2], [1, 2])
    assert oct(beside[0].stat().st_mode & 0o777) == "0o600"
    assert not list(out.glob(".*.tmp"))


def test_one_run_replaces_its_own_and_an_older_report(tmp_path) -> None:
    target = tmp_path / "report.json"
    target.write_text("{}")  # an earlier run's report: replaced as always
    argv = ["--simulate", "h100-sxm-8x-healthy", "--level", "quick", "-q", "--json", str(target)]
    assert node_cli.main(argv) == 0
    assert json.loads(target.read_text())["verdict"] == "PASS"
    assert node_cli.main(argv) == 0  # and again: its own file is no other run's
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]


# --- directories another user can write, as root ----------------------------------------------

@pytest.fixture()
def as_root(monkeypatch) -> None:
    monkeypatch.setattr(safeio, "_euid", lambda: 0, raising=False)


@pytest.fixture(scope="module")
def reports() -> list[dict[str, Any]]:
    base = synthetic.base_report("h100-sxm-8x-healthy")
    return synthetic.build(2, base=base, run_id="r1")


def _run_dir(parent: Path, docs: list[dict[str, Any]], name: str = "r1") -> Path:
    run = parent / name
    run.mkdir(parents=True)
    for doc in docs:
        (run / f"{doc['host']}.json").write_text(json.dumps(doc))
    return run


def test_root_refuses_a_reports_directory_others_can_write(tmp_path, reports, as_root, capsys) -> None:
    run = _run_dir(tmp_path / "reports", reports)
    run.chmod(0o1777)  # sticky does not help: anyone could still add a host report
    assert fleet_cli.main(["report", str(run), "--no-history", "-q"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "refusing the reports directory as root" in line and "writable by everyone" in line
    run.chmod(0o755)
    (tmp_path / "reports").chmod(0o777)  # a parent without the sticky bit: run could be swapped
    assert fleet_cli.main(["report", str(run), "--no-history", "-q"]) == 2
    assert "writable by everyone" in _one_error_line(capsys.readouterr().err)


def test_the_rule_is_for_root_only(tmp_path, reports, monkeypatch) -> None:
    monkeypatch.setattr(safeio, "_euid", lambda: 1000)
    run = _run_dir(tmp_path / "reports", reports)
    run.chmod(0o777)
    assert fleet_cli.main(["report", str(run), "--no-history", "-q"]) == 0


def _plant_failures(db: Path) -> None:
    """Two recorded runs in which node0001's GPU 5 failed: enough for a lemon (2 of 5). The
    synthetic fleet gives node0001 the same GPU UUIDs in every build."""
    ecc = Broken("node0001", "ecc-errors", gpu=5, message="GPU5: uncorrectable ECC")
    base = synthetic.base_report("h100-sxm-8x-healthy")
    for run_id in ("old1", "old2"):
        docs = synthetic.build(2, base=base, run_id=run_id, broken=[ecc])
        with history.History(db) as store:
            store.record(aggregate.from_reports(docs, run_id=run_id), run_id)


def test_a_planted_history_makes_no_lemon(tmp_path, reports, as_root, capsys) -> None:
    run = _run_dir(tmp_path / "reports", reports)
    db = tmp_path / "reports" / "history.sqlite"
    _plant_failures(db)
    # the control: the same history, trusted, does make node0001's GPU a lemon
    code = fleet_cli.main(["report", str(run), "-q", "--json", str(tmp_path / "fleet.json")])
    assert code == 1 and json.loads((tmp_path / "fleet.json").read_text())["lemons"]
    capsys.readouterr()
    if IS_ROOT:  # planted: owned by another user
        for path in tmp_path.joinpath("reports").glob("history.sqlite*"):
            os.chown(path, 4321, 4321)
    else:
        db.chmod(0o666)
    assert fleet_cli.main(["report", str(run), "-q"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "refusing the history database as root" in line
    assert ("owned by uid 4321" if IS_ROOT else "writable by everyone") in line


def test_root_refuses_a_slurm_state_directory_others_can_write(tmp_path, as_root) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / slurm_gate.RUNNING).write_text('{"role": "health-check", "at": "planted"}')
    state.chmod(0o777)
    with pytest.raises(safeio.UntrustedPath, match="the Slurm state directory"), \
            slurm_gate.state_lock(state, wait_s=0):
        pass
    with pytest.raises(safeio.UntrustedPath):  # the Prolog's reader
        slurm_gate.killed_run(state)
    state.chmod(0o755)
    assert slurm_gate.killed_run(state) is not None  # the same marker, trusted: read as before


@pytest.mark.skipif(not IS_ROOT, reason="chown to another user needs root")
def test_root_refuses_a_directory_owned_by_another_user(tmp_path, reports, capsys) -> None:
    run = _run_dir(tmp_path / "reports", reports)
    os.chown(run, 4321, 4321)
    assert fleet_cli.main(["report", str(run), "--no-history", "-q"]) == 2
    assert "owned by uid 4321" in _one_error_line(capsys.readouterr().err)
    os.chown(run, 0, 0)
    link = tmp_path / "link"
    link.symlink_to(run)
    os.lchown(link, 4321, 4321)  # another user's symlink on the way
    assert fleet_cli.main(["report", str(link), "--no-history", "-q"]) == 2
    assert "a symlink owned by uid 4321" in _one_error_line(capsys.readouterr().err)
