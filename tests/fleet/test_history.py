"""Run history in SQLite: lemons are GPUs (by UUID, wherever they moved) failing N of the last M
runs; runs keyed by the reports they hold, so that a reused directory keeps every run."""

from __future__ import annotations

import datetime as dt
import json
import sqlite3
from typing import Any

import pytest

from checks.devtools import synthetic
from checks.devtools.synthetic import Broken, Slow
from checks.fleet import fleet_cli, history
from checks.report import aggregate

LEMON_UUID = "GPU-1e301e30-0000-4000-8000-000000000001"


def _run(
    base: dict[str, Any], run_id: str, *, broken=(), slow=(), moved_to: str | None = None
) -> aggregate.Fleet:
    """4 hosts; the lemon GPU sits in node0001 (index 1), or in `moved_to` (index 2)."""
    reports = synthetic.build(4, base=base, run_id=run_id, broken=broken, slow=slow)
    by_host = {r["host"]: r for r in reports}
    if moved_to:
        synthetic.set_uuid(by_host[moved_to], 2, LEMON_UUID)
    else:
        synthetic.set_uuid(by_host["node0001"], 1, LEMON_UUID)
    return aggregate.from_reports(reports, run_id=run_id)


@pytest.fixture()
def store(tmp_path) -> history.History:
    with history.History(tmp_path / "reports" / "history.sqlite") as db:
        yield db


def test_a_gpu_failing_twice_is_a_lemon_even_after_it_moved(store, h100_report) -> None:
    store.record(_run(h100_report, "r1", broken=[Broken("node0001", "ecc-errors", gpu=1)]))
    store.record(_run(h100_report, "r2"))
    store.record(
        _run(
            h100_report,
            "r3",
            broken=[Broken("node0003", "ecc-errors", gpu=2), Broken("node0000", "row-remap", gpu=4)],
            moved_to="node0003",
        )
    )
    [lemon] = store.lemons()
    assert lemon.uuid == LEMON_UUID
    assert (lemon.failed_runs, lemon.seen_runs, lemon.window) == (2, 3, 5)
    assert lemon.hosts == ("node0001", "node0003")
    assert lemon.checks == ("ecc-errors",)
    assert lemon.last_failed_run == "r3"


def test_only_the_last_m_runs_count(store, h100_report) -> None:
    store.record(_run(h100_report, "r1", broken=[Broken("node0001", "ecc-errors", gpu=1)]))
    store.record(_run(h100_report, "r2", broken=[Broken("node0001", "ecc-errors", gpu=1)]))
    for i in range(3, 7):
        store.record(_run(h100_report, f"r{i}"))
    assert store.lemons(failures=2, runs=5) == []
    assert [lemon.uuid for lemon in store.lemons(failures=2, runs=6)] == [LEMON_UUID]


def test_recording_a_run_again_replaces_it(store, h100_report) -> None:
    run = _run(h100_report, "r1", broken=[Broken("node0001", "ecc-errors", gpu=1)])
    store.record(run)
    store.record(run)
    assert store.runs() == ["r1"]
    assert store.lemons(failures=2) == []


def test_a_straggler_fail_counts_as_a_failure(store, h100_report) -> None:
    for run_id in ("r1", "r2"):
        store.record(_run(h100_report, run_id, slow=[Slow("node0001", "matmul_bf16_tflops", 0.5, gpu=1)]))
    [lemon] = store.lemons()
    assert lemon.uuid == LEMON_UUID and lemon.checks == ("straggler:gpu-matmul/matmul_bf16_tflops",)


def test_figures_and_gpus_are_stored(store, h100_report) -> None:
    store.record(_run(h100_report, "r1"))
    db = sqlite3.connect(store.path)
    assert db.execute("SELECT COUNT(*) FROM gpus WHERE run_id = 'r1'").fetchone() == (32,)
    names = {n for (n,) in db.execute("SELECT DISTINCT name FROM figures")}
    assert names == {
        "matmul_bf16_tflops",
        "membw_copy_gbs",
        "allreduce_busbw_gbs",
        "dataloader_max_samples_per_s",
    }
    value = db.execute(
        "SELECT value FROM figures WHERE gpu_uuid = ? AND name = 'membw_copy_gbs'", (LEMON_UUID,)
    ).fetchone()[0]
    assert value == pytest.approx(synthetic.MEM_BW_GBS, rel=0.03)


# --- runs keyed by what they hold, not by the directory they were read from -------------------

def _daily(base: dict[str, Any], day: int, *, broken=(), hosts=4) -> list[dict[str, Any]]:
    """What cron leaves in one reused directory: reports without a run id, one run a day."""
    reports = synthetic.build(hosts, base=base, broken=broken)
    started = dt.datetime(2026, 11, 1, 3, 0, tzinfo=dt.UTC) + dt.timedelta(days=day)
    for r in reports:
        r.update(run_id=None, started_at=started.isoformat())
    return reports


def _report(directory, db, *extra: str) -> dict[str, Any]:
    out = directory.parent / "fleet.json"
    code = fleet_cli.main(["report", str(directory), "--history", str(db), "-q", "--json", str(out), *extra])
    assert code in (0, 1)
    return json.loads(out.read_text())


def test_a_reused_directory_keeps_every_run_and_finds_the_lemon(tmp_path, h100_report) -> None:
    directory, db = tmp_path / "reports" / "daily", tmp_path / "history.sqlite"
    ecc = Broken("node0001", "ecc-errors", gpu=1)
    keys = []
    for day in range(3):
        synthetic.write(_daily(h100_report, day, broken=[ecc]), directory)
        doc = _report(directory, db)
        keys.append(doc["history_run"])
    assert keys[0] == "daily" and keys[1:] == ["daily@20261102T030000Z", "daily@20261103T030000Z"]
    with history.History(db) as store:
        assert store.runs() == keys
        [lemon] = store.lemons()
    assert (lemon.failed_runs, lemon.seen_runs) == (3, 3)
    assert [lemon["uuid"] for lemon in doc["lemons"]] == [lemon.uuid]
    node1 = next(h for h in doc["hosts"] if h["host"] == "node0001")
    assert [(f["kind"], f["status"], f["gpu"]["index"]) for f in node1["findings"]] == [("lemon", "FAIL", 1)]

    # reading the same reports again is the same run, not a fourth
    assert _report(directory, db)["history_run"] == keys[-1]
    with history.History(db) as store:
        assert store.runs() == keys


def test_a_report_left_behind_in_a_reused_directory_is_not_counted_again(tmp_path, h100_report) -> None:
    """node0003 stops running its checks; its day-0 report (one failed ECC check) stays in the
    directory. It is not a fresh report: node0003 is MISSING, and its GPU is not made a lemon by
    counting the same failure every day."""
    directory, db = tmp_path / "reports" / "daily", tmp_path / "history.sqlite"
    synthetic.write(_daily(h100_report, 0, broken=[Broken("node0003", "ecc-errors", gpu=2)]), directory)
    first = _report(directory, db)
    for day in (1, 2):
        synthetic.write([r for r in _daily(h100_report, day) if r["host"] != "node0003"], directory)
        doc = _report(directory, db)
    node3 = next(h for h in doc["hosts"] if h["host"] == "node0003")
    assert node3["status"] == "MISSING"
    assert node3["reason"] == "no fresh report: its report was already counted in run daily"
    assert node3["report_finished_at"] == next(
        h for h in first["hosts"] if h["host"] == "node0003")["report_finished_at"]
    assert doc["lemons"] == [] and doc["summary"]["MISSING"] == 1


def test_a_host_that_vanished_is_missing_without_an_inventory(tmp_path, h100_report) -> None:
    reports, db = tmp_path / "reports", tmp_path / "history.sqlite"
    _report(synthetic.write(synthetic.build(4, base=h100_report, run_id="r1"), reports / "r1"), db)
    two = [r for r in synthetic.build(4, base=h100_report, run_id="r2") if r["host"] != "node0002"]
    doc = _report(synthetic.write(two, reports / "r2"), db)
    assert doc["verdict"] == "FAIL"
    [gone] = [h for h in doc["hosts"] if h["status"] != "PASS"]
    assert (gone["host"], gone["status"], gone["reason"]) == ("node0002", "MISSING", "no report since run r1")
    # an inventory says who is expected: a host left out of it is not asked for
    doc = _report(reports / "r2", db, "--expect-hosts", "node0000,node0001,node0003")
    assert doc["verdict"] == "PASS"


def test_a_lemon_fails_its_host_even_in_a_run_it_passed(store, h100_report) -> None:
    for run_id in ("r1", "r2"):
        store.record(_run(h100_report, run_id, broken=[Broken("node0001", "ecc-errors", gpu=1)]))
    fleet = _run(h100_report, "r3")
    store.record(fleet)
    node1 = next(h for h in fleet.hosts if h.host == "node0001")
    assert node1.status == "PASS"
    fleet.set_lemons(store.lemons())
    assert node1.status == "FAIL" and fleet.verdict == "FAIL"
    [finding] = node1.findings
    assert (finding.kind, finding.gpu.uuid, finding.check) == ("lemon", LEMON_UUID, "ecc-errors")
    assert finding.reason.startswith(f"GPU1 {LEMON_UUID} failed in 2 of the last 5 runs")


def test_an_older_history_gains_the_new_tables(tmp_path, h100_report) -> None:
    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE runs (seq INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL UNIQUE, "
               "recorded_at TEXT NOT NULL)")
    db.execute("INSERT INTO runs (run_id, recorded_at) VALUES ('r0', '2026-01-01T00:00:00+00:00')")
    db.commit()
    db.close()
    with history.History(path) as store:
        fleet = _run(h100_report, "r0")
        assert store.run_key(fleet) == "r0"  # recorded before fingerprints: replaced as before
        store.record(fleet)
        assert store.runs() == ["r0"] and store.run_key(fleet) == "r0"


def test_a_figure_that_is_not_a_number_is_left_out_of_the_history(tmp_path, h100_report) -> None:
    """A report whose figure is NaN or infinite (a measurement that produced no number: json and
    the fleet's reader take both) is recorded without that figure: SQLite would store NaN as NULL,
    which the figures table refuses, and the whole report command ended in a history error."""
    directory, db = tmp_path / "reports" / "run", tmp_path / "history.sqlite"
    reports = synthetic.build(2, base=h100_report, run_id="nan-run")
    planted = []
    for chk in reports[1]["checks"]:
        for result in chk["results"]:
            figures = (result.get("details") or {}).get("figures") or {}
            for name in figures:
                if len(planted) < 2:
                    figures[name] = float("nan") if not planted else float("inf")
                    planted.append((chk["id"], (result.get("device") or {}).get("uuid"), name))
    assert len(planted) == 2
    synthetic.write(reports, directory)
    doc = _report(directory, db)
    assert doc["history_run"] == "nan-run"
    rows = sqlite3.connect(db).execute("SELECT check_id, gpu_uuid, name, value FROM figures "
                                       "WHERE host = ?", (reports[1]["host"],)).fetchall()
    assert rows and all(value == value and abs(value) != float("inf") for *_, value in rows)
    assert not {(c, u, n) for c, u, n, _ in rows} & set(planted)
