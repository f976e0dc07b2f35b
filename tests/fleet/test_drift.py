"""Memory of every GPU: drift below a GPU's own baseline (by UUID), and a history that survives
concurrent writers and a writer killed mid-transaction."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from checks import profiles
from checks.devtools import synthetic
from checks.devtools.synthetic import Slow
from checks.fleet import drift, history
from checks.fleet import fleet_cli as cli
from checks.report import aggregate
from checks.report.figures import Figure, GpuRef

ROOT = Path(__file__).resolve().parents[2]
RULE = drift.rule_for("generic")
GPU = GpuRef(1, "0000:1b:00.0", "GPU-aaaa")


def _fig(value: float, name: str = "matmul_bf16_tflops", check: str = "gpu-matmul") -> Figure:
    return Figure("node0001", check, name, value, GPU)


# --- the rule, on its own ---------------------------------------------------------------------

@pytest.mark.parametrize(("earlier", "value", "status"), [
    ([800.0, 800.0, 800.0], 790.0, None),      # 1.25 % below: noise
    ([800.0, 800.0, 800.0], 752.0, "WARN"),    # 6 % below: past warn_pct 5
    ([800.0, 800.0, 800.0], 712.0, "FAIL"),    # 11 % below: past fail_pct 10
    ([800.0, 400.0, 800.0], 790.0, None),      # one bad earlier run does not move the median
    ([800.0, 800.0, 800.0], 900.0, None),      # faster than before is not drift
])
def test_a_rate_is_judged_against_the_median_of_its_own_earlier_runs(earlier, value, status) -> None:
    verdict = drift.judge(_fig(value), RULE, earlier, None)
    assert verdict is not None
    assert verdict.status == status
    assert verdict.baseline == pytest.approx(800.0)
    assert verdict.baseline_kind == "median" and verdict.runs == 3
    assert verdict.series == (*earlier, value)


def test_a_time_drifts_upwards() -> None:
    verdict = drift.judge(_fig(11.5, name="step_time_ms"), RULE, [10.0, 10.0, 10.0], None)
    assert verdict is not None and verdict.status == "FAIL"
    assert verdict.deficit_pct == pytest.approx(15.0)


def test_no_baseline_before_min_runs_earlier_runs() -> None:
    assert RULE.min_runs == 3
    assert drift.judge(_fig(100.0), RULE, [800.0, 800.0], None) is None


def test_burn_in_is_judged_against_the_first_burn_in() -> None:
    assert RULE.baseline_of("burn-in") == "first"
    fig = _fig(700.0, name="burnin_tflops", check="burn-in")
    # Median of the recent runs is 700 (no drift from them), but the first burn-in was 800.
    verdict = drift.judge(fig, RULE, [700.0, 700.0, 700.0], first=800.0)
    assert verdict is not None
    assert (verdict.status, verdict.baseline, verdict.baseline_kind) == ("FAIL", 800.0, "first")
    assert drift.judge(fig, RULE, [700.0], first=None) is None


def test_thresholds_come_from_the_profile() -> None:
    generic = profiles.load("generic")
    assert (RULE.warn_pct, RULE.fail_pct) == (generic.get("drift.warn_pct"), generic.get("drift.fail_pct"))
    assert set(RULE.checks) == {"gpu-matmul", "gpu-membw", "p2p-bandwidth", "burn-in"}
    generic.data["drift"] = {**generic.data["drift"], "warn_pct": 20, "fail_pct": 10}
    with pytest.raises(drift.DriftConfigError, match="warn_pct"):
        drift.rule_from(generic)
    generic.data["drift"] = {**generic.data["drift"], "warn_pct": 5, "baseline": "mean"}
    with pytest.raises(drift.DriftConfigError, match="baseline"):
        drift.rule_from(generic)


# --- through the history ----------------------------------------------------------------------

FAST_GPU = ("node0001", 1)  # the GPU that was fast at acceptance


def _fleet(base: dict[str, Any], run_id: str, factor: float, *, host: str = "node0001",
           gpu: int = 1) -> aggregate.Fleet:
    """4 hosts; one GPU's matmul scaled by `factor`. The same seed every run: identical jitter,
    so only the planted change moves."""
    reports = synthetic.build(4, base=base, run_id=run_id, seed=3,
                              slow=[Slow(host, "matmul_bf16_tflops", factor, gpu=gpu)])
    return aggregate.from_reports(reports, run_id=run_id)


def _record_runs(store: history.History, base: dict[str, Any], factors: list[float]) -> None:
    for i, factor in enumerate(factors):
        fleet = _fleet(base, f"r{i}", factor)
        fleet.set_drift(drift.find(fleet, store))
        store.record(fleet)


@pytest.fixture()
def store(tmp_path: Path):
    with history.History(tmp_path / "history.sqlite") as db:
        yield db


def test_a_gpu_slower_than_itself_fails_though_it_passes_the_fleet_median(store, h100_report) -> None:
    _record_runs(store, h100_report, [1.08, 1.08, 1.08])
    fleet = _fleet(h100_report, "r3", 0.97)  # 3 % under the fleet: no straggler; 10.2 % under itself
    assert not [s for s in fleet.stragglers if s.host == "node0001"]
    fleet.set_drift(drift.find(fleet, store))
    [bad] = fleet.drifts
    assert (bad.host, bad.gpu.index, bad.check, bad.name) == ("node0001", 1, "gpu-matmul",
                                                              "matmul_bf16_tflops")
    assert bad.status == "FAIL" and bad.deficit_pct == pytest.approx(100 * (1 - 0.97 / 1.08), abs=0.05)
    assert len(bad.series) == 4
    assert {h.host: h.status for h in fleet.hosts}["node0001"] == "FAIL"
    assert fleet.verdict == "FAIL"
    store.record(fleet)
    rows = sqlite3.connect(store.path).execute(
        "SELECT check_id, status FROM results WHERE run_id = 'r3'").fetchall()
    assert rows == [("drift:gpu-matmul/matmul_bf16_tflops", "FAIL")]


def test_a_smaller_drop_warns(store, h100_report) -> None:
    _record_runs(store, h100_report, [1.04, 1.04, 1.04])
    fleet = _fleet(h100_report, "r3", 0.97)  # 6.7 % under itself
    fleet.set_drift(drift.find(fleet, store))
    assert [(d.host, d.status) for d in fleet.drifts] == [("node0001", "WARN")]
    assert {h.host: h.status for h in fleet.hosts}["node0001"] == "WARN"


def test_too_little_history_judges_nothing(store, h100_report) -> None:
    _record_runs(store, h100_report, [1.08, 1.08])
    fleet = _fleet(h100_report, "r2", 0.5)
    fleet.set_drift(drift.find(fleet, store))
    assert fleet.drift == []


def test_drift_follows_the_gpu_by_uuid_when_it_moves(store, h100_report) -> None:
    uuid = "GPU-0dd0dd00-0000-4000-8000-000000000001"
    for i in range(3):
        reports = synthetic.build(4, base=h100_report, run_id=f"r{i}", seed=3,
                                  slow=[Slow("node0001", "matmul_bf16_tflops", 1.08, gpu=1)])
        synthetic.set_uuid(next(r for r in reports if r["host"] == "node0001"), 1, uuid)
        store.record(aggregate.from_reports(reports, run_id=f"r{i}"))
    reports = synthetic.build(4, base=h100_report, run_id="r3", seed=3,
                              slow=[Slow("node0003", "matmul_bf16_tflops", 0.93, gpu=2)])
    synthetic.set_uuid(next(r for r in reports if r["host"] == "node0003"), 2, uuid)
    fleet = aggregate.from_reports(reports, run_id="r3")
    fleet.set_drift(drift.find(fleet, store))
    [bad] = fleet.drifts
    assert (bad.host, bad.gpu.uuid, bad.status) == ("node0003", uuid, "FAIL")


def test_rerecording_a_run_does_not_judge_it_against_itself(store, h100_report) -> None:
    _record_runs(store, h100_report, [1.08, 1.08, 1.08, 0.97])
    fleet = _fleet(h100_report, "r3", 0.97)  # r3 recorded already: its baseline is r0..r2
    fleet.set_drift(drift.find(fleet, store))
    assert [d.status for d in fleet.drifts] == ["FAIL"]


def test_the_fleet_cli_reports_drift_in_json_and_exit_status(tmp_path, h100_report, fleet_schema,
                                                            capsys) -> None:
    db = tmp_path / "history.sqlite"
    for i, factor in enumerate([1.08, 1.08, 1.08, 0.97]):
        reports = synthetic.build(4, base=h100_report, run_id=f"r{i}", seed=3,
                                  slow=[Slow("node0001", "matmul_bf16_tflops", factor, gpu=1)])
        directory = synthetic.write(reports, tmp_path / "reports" / f"r{i}")
        out = tmp_path / f"r{i}.json"
        code = cli.main(["report", str(directory), "--history", str(db), "--json", str(out), "-q"])
    assert code == 1
    doc = json.loads(out.read_text())
    jsonschema.validate(doc, fleet_schema)
    [entry] = doc["drift"]
    assert (entry["host"], entry["gpu"]["index"], entry["status"]) == ("node0001", 1, "FAIL")
    assert entry["baseline_kind"] == "median" and len(entry["series"]) == 4
    assert not any(s["host"] == "node0001" for s in doc["stragglers"])


# --- the history under concurrent writers and a killed one ------------------------------------

WRITER = textwrap.dedent("""
    import json, sys
    from checks.fleet import history
    from checks.report import aggregate
    reports = json.load(open(sys.argv[1]))
    name, runs = sys.argv[3], int(sys.argv[4])
    for i in range(runs):
        with history.History(sys.argv[2]) as store:
            store.record(aggregate.from_reports(reports, run_id=f"{name}-{i}"))
    print("done", name)
""")


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def test_several_writers_at_once_all_land(tmp_path, h100_report) -> None:
    reports = tmp_path / "fleet.json"
    reports.write_text(json.dumps(synthetic.build(40, base=h100_report, run_id="x")))
    db = tmp_path / "history.sqlite"
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(reports), str(db), f"w{k}", "3"],
                                env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for k in range(4)]
    for w in writers:
        out, err = w.communicate(timeout=300)
        assert w.returncode == 0, err
        assert out.startswith("done")
    con = sqlite3.connect(db)
    assert con.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    assert con.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    runs = [r for (r,) in con.execute("SELECT run_id FROM runs")]
    assert sorted(runs) == sorted(f"w{k}-{i}" for k in range(4) for i in range(3))
    per_run = con.execute("SELECT COUNT(DISTINCT gpu_uuid) FROM gpus GROUP BY run_id").fetchall()
    assert per_run == [(320,)] * 12  # every run complete: 40 hosts x 8 GPUs


KILLED = textwrap.dedent("""
    import json, sys, time
    from checks.fleet import history
    from checks.report import aggregate

    class Stall:
        '''The connection, stalling right after the figures are inserted: mid-transaction.'''
        def __init__(self, db):
            self.db = db
        def execute(self, *a):
            return self.db.execute(*a)
        def executemany(self, sql, rows):
            cur = self.db.executemany(sql, rows)
            if "INTO figures" in sql:
                print("mid-transaction", flush=True)
                time.sleep(600)
            return cur
        def close(self):
            self.db.close()

    reports = json.load(open(sys.argv[1]))
    store = history.History(sys.argv[2])
    store.db = Stall(store.db)
    store.record(aggregate.from_reports(reports, run_id="killed"))
""")


def test_a_writer_killed_mid_transaction_leaves_the_history_intact(tmp_path, h100_report) -> None:
    reports = tmp_path / "fleet.json"
    reports.write_text(json.dumps(synthetic.build(20, base=h100_report, run_id="x")))
    db = tmp_path / "history.sqlite"
    with history.History(db) as store:
        store.record(aggregate.from_reports(json.loads(reports.read_text()), run_id="before"))
    proc = subprocess.Popen([sys.executable, "-c", KILLED, str(reports), str(db)], env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "mid-transaction", proc.stderr.read()
        # Its transaction holds the write lock and has written the WAL; kill it there.
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    con = sqlite3.connect(db)
    assert con.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    assert [r for (r,) in con.execute("SELECT run_id FROM runs")] == ["before"]
    assert con.execute("SELECT COUNT(*) FROM figures WHERE run_id = 'killed'").fetchone() == (0,)
    assert con.execute("SELECT COUNT(*) FROM gpus WHERE run_id = 'before'").fetchone() == (160,)
    con.close()
    with history.History(db) as store:  # and the next run writes as usual
        store.record(aggregate.from_reports(json.loads(reports.read_text()), run_id="after"))
        assert store.runs() == ["before", "after"]


# --- the fleet report ---------------------------------------------------------------------------

def test_the_html_report_shows_sparklines_and_names_the_drifting_gpus(tmp_path, h100_report) -> None:
    from checks.render import html

    from .drift_fleet import MATMUL, build

    fleet = build(h100_report, tmp_path / "history.sqlite")
    assert [(d.host, d.gpu.index, d.status) for d in fleet.drifts] == [("node0002", 5, "FAIL"),
                                                                       ("node0006", 1, "WARN")]
    page = html.render(fleet)
    section = page.split("Memory of every GPU")[1].split("</section>")[0]
    assert "Drifting: node0002 GPU5, node0006 GPU1." in section
    assert section.count('class="spark"') == html.MAX_SPARKLINES
    first_row = section.split("<tr>")[2]
    assert "node0002" in first_row and "FAIL" in first_row
    assert first_row.count("<path") == 1 and len(MATMUL) - 1 == first_row.split("<path")[1].count(" L")
    assert "… and " in section  # the rest within limits, counted not drawn
