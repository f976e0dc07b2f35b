"""Repairing the run history (checks/fleet/history_repair.py): forget a run (backed up, and
restorable), quarantine a run, host or GPU (out of lemons and drift baselines), and the
configuration event: a check failing on half the fleet's GPUs in one run is no lemon."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from checks.devtools import synthetic
from checks.devtools.synthetic import Broken
from checks.fleet import history, history_repair
from checks.report import aggregate

LEMON_UUID = "GPU-1e301e30-0000-4000-8000-000000000001"


def _run(base: dict[str, Any], run_id: str, broken=()) -> aggregate.Fleet:
    """4 hosts of 8 GPUs (32); the lemon GPU is node0001's GPU 1."""
    reports = synthetic.build(4, base=base, run_id=run_id, broken=list(broken))
    synthetic.set_uuid({r["host"]: r for r in reports}["node0001"], 1, LEMON_UUID)
    return aggregate.from_reports(reports, run_id=run_id)


def _mass(check: str, gpus: int) -> list[Broken]:
    """`check` failing on the first `gpus` GPUs of the fleet (node0000's 8, then node0001's ...)."""
    return [Broken(f"node{i // 8:04d}", check, gpu=i % 8) for i in range(gpus)]


@pytest.fixture()
def db(tmp_path) -> Path:
    return tmp_path / "reports" / "history.sqlite"


def _repair(db: Path, capsys, *argv: str) -> tuple[int, str, str]:
    code = history_repair.main(["--history", str(db), *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _lemons(db: Path) -> list[str]:
    with history.History(db) as store:
        return [lemon.uuid for lemon in store.lemons()]


def test_a_check_failing_on_half_the_gpus_is_a_configuration_event_not_lemons(db, h100_report) -> None:
    with history.History(db) as store:
        for run in ("r1", "r2"):  # a wrong expectation pushed everywhere, twice: 16 of 32 GPUs
            store.record(_run(h100_report, run, _mass("ecc-errors", 16)))
        assert store.lemons() == []
        assert store.config_events() == [("r1", "ecc-errors", 16, 32), ("r2", "ecc-errors", 16, 32)]


def test_below_half_the_gpus_each_gpu_still_counts(db, h100_report) -> None:
    """The control: 15 of 32 GPUs failing twice are 15 lemons (the threshold is at half)."""
    with history.History(db) as store:
        for run in ("r1", "r2"):
            store.record(_run(h100_report, run, _mass("ecc-errors", 15)))
        assert len(store.lemons()) == 15 and store.config_events() == []


def test_a_real_lemon_beside_a_configuration_event_is_still_found(db, h100_report) -> None:
    with history.History(db) as store:
        for run in ("r1", "r2"):
            store.record(_run(h100_report, run, [*_mass("ecc-errors", 32),
                                                 Broken("node0001", "row-remap", gpu=1)]))
        [lemon] = store.lemons()
        assert lemon.uuid == LEMON_UUID and lemon.checks == ("row-remap",)


def _two_failed_runs(db: Path, base: dict[str, Any]) -> None:
    with history.History(db) as store:
        for run in ("r1", "r2", "r3"):
            broken = [Broken("node0001", "ecc-errors", gpu=1)] if run != "r2" else []
            store.record(_run(base, run, broken))
    assert _lemons(db) == [LEMON_UUID]


def test_forget_removes_a_run_after_backing_it_up_and_restore_puts_it_back(db, h100_report,
                                                                          capsys) -> None:
    _two_failed_runs(db, h100_report)
    code, out, _ = _repair(db, capsys, "forget", "r1")
    assert code == 0 and out.startswith("forgot run r1 (1 runs, 32 gpus, 1 results, ")
    backup = Path(out.split("backup: ")[1].split(" (")[0])
    assert backup.parent == db.with_name("history.sqlite.removed")
    saved = json.loads(backup.read_text())
    assert saved["run_id"] == "r1" and len(saved["tables"]["gpus"]) == 32
    assert saved["tables"]["results"][0]["gpu_uuid"] == LEMON_UUID
    assert _lemons(db) == []  # one failure left of the two
    with history.History(db) as store:
        assert store.runs() == ["r2", "r3"]
        for table in history_repair.TABLES:
            assert store.db.execute(f"SELECT COUNT(*) FROM {table} WHERE run_id = 'r1'").fetchone() == (0,)
    code, out, _ = _repair(db, capsys, "restore", str(backup))
    assert (code, out) == (0, "restored run r1\n")
    assert _lemons(db) == [LEMON_UUID]
    code, _, err = _repair(db, capsys, "restore", str(backup))  # it is there again
    assert code == 2 and err == f"error: run 'r1' is in {db} already: forget it first\n"


@pytest.mark.parametrize("scope", [[], ["--host", "node0001"], ["--gpu", LEMON_UUID]])
def test_quarantine_leaves_a_run_host_or_gpu_out_of_lemons_and_baselines(db, h100_report, capsys,
                                                                         scope) -> None:
    _two_failed_runs(db, h100_report)
    with history.History(db) as store:
        series = store.figure_series(["gpu-matmul"])
    before = {key: [run for run, _ in values] for key, values in series.items()}
    code, out, _ = _repair(db, capsys, "quarantine", "r1", *scope, "--reason", "test run")
    assert code == 0 and out.startswith("quarantined run r1") and "left out of lemons" in out
    assert _lemons(db) == []
    with history.History(db) as store:
        series = store.figure_series(["gpu-matmul"])
        after = {key: [run for run, _ in values] for key, values in series.items()}
        first = store.first_figures(["gpu-matmul"])
    lemon_key = next(k for k in before if k[0] == LEMON_UUID)
    assert "r1" in before[lemon_key] and "r1" not in after[lemon_key]
    assert first[lemon_key][0] == "r2"  # the baseline no longer starts in the quarantined run
    # the whole run: its 32 GPUs lose r1; the host: its 8; the GPU: itself alone
    lost = sum(1 for key in before if key[0].startswith("GPU-") and key[1] == "gpu-matmul"
               and key[2] == lemon_key[2] and "r1" in before[key] and "r1" not in after[key])
    assert lost == {0: 32, 2: 8 if scope[:1] == ["--host"] else 1}[len(scope)]
    code, out, _ = _repair(db, capsys, "list")
    assert "  quarantined" in out and "test run" in out
    code, out, _ = _repair(db, capsys, "release", "r1", *scope)
    assert (code, out) == (0, "released 1 quarantine(s) of run r1\n")
    assert _lemons(db) == [LEMON_UUID]


@pytest.mark.parametrize(("argv", "needle"), [
    (["forget", "r9"], "error: no run 'r9' in "),
    (["quarantine", "r1", "--host", "node9999", "--reason", "x"], "error: run 'r1' has no host 'node9999'"),
    (["quarantine", "r1", "--gpu", "GPU-nope", "--reason", "x"], "error: run 'r1' has no GPU 'GPU-nope'"),
    (["quarantine", "r1", "--reason", "  "], "error: --reason must say why"),
    (["release", "r1"], "error: nothing of that scope is quarantined in run 'r1'"),
])
def test_bad_input_is_one_line_exit_2_and_changes_nothing(db, h100_report, capsys, argv, needle) -> None:
    _two_failed_runs(db, h100_report)
    code, _, err = _repair(db, capsys, *argv)
    assert code == 2 and err.startswith(needle) and err.count("\n") == 1, err
    assert _lemons(db) == [LEMON_UUID]


def test_no_history_or_a_bad_backup_is_one_line_exit_2(tmp_path, db, h100_report, capsys) -> None:
    code, _, err = _repair(tmp_path / "typo.sqlite", capsys, "list")
    assert code == 2 and err == f"error: no history database at {tmp_path / 'typo.sqlite'}\n"
    assert not (tmp_path / "typo.sqlite").exists()
    _two_failed_runs(db, h100_report)
    for text in ("{broken", '{"schema": "other"}', json.dumps({
            "schema": history_repair.BACKUP_SCHEMA, "run_id": "r9",
            "tables": {"runs": [{"run_id": "r1", "seq": 1}]}})):
        (tmp_path / "b.json").write_text(text)
        code, _, err = _repair(db, capsys, "restore", str(tmp_path / "b.json"))
        assert code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    with history.History(db) as store:
        assert store.runs() == ["r1", "r2", "r3"]


def test_the_fleet_command_lists_runs_and_configuration_events(db, h100_report) -> None:
    with history.History(db) as store:
        store.record(_run(h100_report, "r1", _mass("ecc-errors", 32)))
    done = subprocess.run([sys.executable, "-m", "checks.fleet", "history", "--history", str(db),
                           "list"], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("r1  recorded ") and lines[0].endswith("  4 host report(s)")
    assert lines[1] == ("  configuration event: ecc-errors failed on 32 of 32 GPUs (not counted as "
                        "lemons)")


def test_the_fleet_report_says_a_configuration_event_is_not_counted(tmp_path, h100_report,
                                                                    capsys) -> None:
    from checks.fleet import fleet_cli

    db = tmp_path / "history.sqlite"
    for run in ("r1", "r2"):
        reports = synthetic.build(4, base=h100_report, run_id=run, broken=_mass("ecc-errors", 16))
        directory = synthetic.write(reports, tmp_path / "reports" / run)
        summary = tmp_path / f"{run}.json"
        assert fleet_cli.main(["report", str(directory), "--history", str(db), "--json",
                               str(summary)]) == 1
    err = capsys.readouterr().err
    assert ("note: run r2: ecc-errors failed on 16 of 32 GPUs: a configuration event (at least "
            "half the fleet's GPUs), not counted toward lemons") in err
    assert json.loads(summary.read_text())["lemons"] == []
