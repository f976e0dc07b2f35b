"""The shipped alert rules and Grafana dashboard (checks/monitoring/): promtool's own checks and
unit tests, every metric they use is one we export, and, end to end, a real Prometheus scraping
the real node_exporter serving our output fires the alerts and answers every dashboard query."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from checks.fleet import remediate_evidence, remediate_state, slurm_gate
from checks.render import prometheus

sys.path.insert(0, str(Path(__file__).resolve().parent))
import drift_fleet
from promtools import (
    APT_HINT,
    FLEET_GONE,
    FLEET_ODD,
    FLEET_QUIET,
    NodeExporter,
    PrometheusServer,
    two_fleet_runs,
)

MONITORING = Path(prometheus.__file__).resolve().parents[1] / "monitoring"
RULES = MONITORING / "alerts.yml"
RULE_TESTS = MONITORING / "alerts_test.yml"
DASHBOARD = MONITORING / "grafana-dashboard.json"
# node_exporter's own metric that the textfile alert watches
NODE_EXPORTER_METRICS = {"node_textfile_scrape_error"}
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
                "unless", "offset", "inf", "nan"}


def _promtool(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    if shutil.which("promtool") is None:
        pytest.fail(f"no promtool: {APT_HINT}")
    return subprocess.run(["promtool", *map(str, args)], capture_output=True, text=True, timeout=120,
                          cwd=cwd, check=False)


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (not functions, keywords, labels, strings)."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)
    names = re.findall(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)\b(?!\s*\()", expr)
    return {n for n in names if n.lower() not in PROMQL_WORDS}


def _rules() -> list[dict[str, Any]]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def _dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def _panel_exprs() -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in _dashboard()["panels"] for t in p["targets"]]


@pytest.fixture(scope="module")
def exported(tmp_path_factory, h100_report) -> set[str]:
    """Every metric name our output has for a fleet with failures, stragglers, lemons, a digest
    mismatch and missing hosts: the nodes' own files and the fleet file together."""
    work = tmp_path_factory.mktemp("exported")
    two_fleet_runs(work, h100_report, work / "textfiles", work / "nodes")
    # and a fleet with a drifting GPU (six runs of history)
    prometheus.write_fleet(drift_fleet.build(h100_report, work / "drift.sqlite"), work / "drift")
    # and what the Slurm wrapper publishes itself: a run's report with the interval, a hung run
    slurm_gate.publish(work / "gate", "node0000", "quick", h100_report, 600)
    slurm_gate.publish(work / "hung", "node0001", "quick", None, 600)
    # and the remediation loop's file (nodecert-remediate on a node)
    state = work / "remediation-state"
    run = remediate_state.Run("node0002", state / remediate_state.DIR, state, "NODECERT", True,
                              remediate_state.Policy(), [], work / "remediation")
    run.log("reboot", "ok", "detected", "rebooting", remediate_state.Record(stage="rebooting"))
    remediate_evidence.publish(run)
    return {line.split()[2] for d in ("textfiles", "nodes", "drift", "gate", "hung", "remediation")
            for f in (work / d).glob("*.prom")
            for line in f.read_text().splitlines() if line.startswith("# TYPE ")}


def test_metric_names_parser() -> None:
    assert metric_names('count(nodecert_check_status{status="FAIL",host=~"$host"} == 1) or vector(0)') \
        == {"nodecert_check_status"}
    assert metric_names("sum by (status) (nodecert_checks{host=~\"a\"}) / on(host) x_total[5m]") \
        == {"nodecert_checks", "x_total"}
    assert metric_names("time() - nodecert_last_run_timestamp_seconds > 26 * 3600") \
        == {"nodecert_last_run_timestamp_seconds"}


def test_promtool_check_rules() -> None:
    proc = _promtool("check", "rules", RULES)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(_rules())} rules found" in proc.stdout


def test_promtool_unit_tests_pass() -> None:
    proc = _promtool("test", "rules", RULE_TESTS.name, cwd=MONITORING)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_promtool_unit_tests_catch_a_broken_rule(tmp_path) -> None:
    """The control: the same unit tests against rules with a lemon threshold of 5 failed runs."""
    shutil.copy(RULE_TESTS, tmp_path / RULE_TESTS.name)
    broken = RULES.read_text().replace("nodecert_lemon_failed_runs > 0", "nodecert_lemon_failed_runs > 5")
    assert broken != RULES.read_text()
    (tmp_path / RULES.name).write_text(broken)
    proc = _promtool("test", "rules", RULE_TESTS.name, cwd=tmp_path)
    assert proc.returncode != 0
    assert "alertname: NodecertLemonGPU" in proc.stdout + proc.stderr


def test_promtool_unit_tests_catch_a_staleness_rule_that_ignores_the_interval(tmp_path) -> None:
    """The control: a host is stale after 30 intervals instead of 3 (as good as the 26 h rule
    for a 600 s health check): the staleness unit test fails on it."""
    shutil.copy(RULE_TESTS, tmp_path / RULE_TESTS.name)
    broken = RULES.read_text().replace("> on(host) 3 * max by (host) (nodecert_run_interval_seconds)",
                                       "> on(host) 30 * max by (host) (nodecert_run_interval_seconds)")
    assert broken != RULES.read_text()
    (tmp_path / RULES.name).write_text(broken)
    proc = _promtool("test", "rules", RULE_TESTS.name, cwd=tmp_path)
    assert proc.returncode != 0
    assert "alertname: NodecertHostMetricsGone" in proc.stdout + proc.stderr
    assert "node0103" in proc.stdout + proc.stderr


def test_every_alert_is_unit_tested_firing() -> None:
    tested = {t["alertname"] for case in yaml.safe_load(RULE_TESTS.read_text())["tests"]
              for t in case["alert_rule_test"] if t.get("exp_alerts")}
    assert {r["alert"] for r in _rules()} == tested
    assert {"NodecertCheckFailed", "NodecertStragglerGPU", "NodecertLemonGPU",
            "NodecertReportsStopped"} <= tested


def test_rules_and_dashboard_use_only_exported_metrics(exported) -> None:
    known = exported | NODE_EXPORTER_METRICS
    for rule in _rules():
        used = metric_names(rule["expr"])
        assert used and used <= known, f"{rule['alert']}: {sorted(used - known)}"
    for title, expr in _panel_exprs():
        used = metric_names(expr)
        assert used and used <= exported, f"panel {title!r}: {sorted(used - exported)}"
    for var in _dashboard()["templating"]["list"]:
        if var["type"] == "query":
            [metric] = re.findall(r"label_values\((\w+),", var["query"]["query"])
            assert metric in exported


def test_dashboard_json_is_a_grafana_dashboard() -> None:
    dash = _dashboard()
    assert dash["uid"] and dash["title"] and dash["schemaVersion"] >= 36
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)) >= 10
    for p in dash["panels"]:
        assert p["targets"] and p["description"], p["title"]
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert {"x", "y", "w", "h"} <= p["gridPos"].keys() and p["gridPos"]["x"] + p["gridPos"]["w"] <= 24
    assert [v["name"] for v in dash["templating"]["list"]] == ["datasource", "host"]


def test_dashboard_queries_are_valid_promql(tmp_path) -> None:
    """promtool parses each panel's query (as a recording rule), the way Prometheus would."""
    rules = [{"record": f"nodecert:panel_{i}", "expr": expr} for i, (_, expr) in enumerate(_panel_exprs())]
    path = tmp_path / "panels.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "panels", "rules": rules}]}))
    proc = _promtool("check", "rules", path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _wait(predicate, what: str, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = predicate()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.5)


def test_prometheus_scrapes_node_exporter_fires_alerts_and_answers_the_dashboard(
        tmp_path, h100_report) -> None:
    """End to end on loopback: nodes' own .prom files and the fleet CLI's summary → two
    node_exporters (the controller's, and one standing in for each node's) → Prometheus → rules."""
    textfiles, nodes = tmp_path / "textfiles", tmp_path / "nodes"
    two_fleet_runs(tmp_path, h100_report, textfiles, nodes)
    with NodeExporter(textfiles) as controller, NodeExporter(nodes) as node_side, \
            PrometheusServer(tmp_path, [controller.address, node_side.address], [RULES]) as prom:
        def firing() -> dict[str, list[dict[str, str]]]:
            found: dict[str, list[dict[str, str]]] = {}
            for a in prom.alerts():
                if a["state"] == "firing":
                    found.setdefault(a["labels"]["alertname"], []).append(a["labels"])
            want = {"NodecertCheckFailed", "NodecertStragglerGPU", "NodecertLemonGPU",
                    "NodecertHostReportMissing", "NodecertFleetHostsFailed",
                    "NodecertFleetHostUnhealthy", "NodecertDigestMismatch"}
            return found if want <= found.keys() else {}

        alerts = _wait(firing, "the alerts to fire")
        [failed] = alerts["NodecertCheckFailed"]
        assert (failed["host"], failed["check"], failed["gpu"], failed["fault_code"]) == (
            "node0004", "ecc-errors", "5", "GPU002")
        assert failed["pci"] and failed["uuid"].startswith("GPU-") and failed["UUID"] == failed["uuid"]
        [slow] = alerts["NodecertStragglerGPU"]
        assert (slow["host"], slow["gpu"], slow["figure"]) == ("node0007", "3", "matmul_bf16_tflops")
        assert len(alerts["NodecertLemonGPU"]) == 2
        assert sorted(a["host"] for a in alerts["NodecertHostReportMissing"]) == [FLEET_QUIET, FLEET_GONE]
        # node0002's own report passes; the fleet's digest finding FAILs it, and says so
        [odd] = alerts["NodecertDigestMismatch"]
        assert (odd["host"], odd["gpu"]) == tuple(map(str, FLEET_ODD))
        assert sorted(a["host"] for a in alerts["NodecertFleetHostUnhealthy"]) == [
            FLEET_ODD[0], "node0004", "node0007"]
        [count] = alerts["NodecertFleetHostsFailed"]
        assert count["status"] == "FAIL"
        own = prom.query(f'nodecert_host_healthy{{host="{FLEET_ODD[0]}"}}')
        assert [s["value"][1] for s in own] == ["1"]
        # node0009's own file is two days old: the node-side rule names it alone; node0010's file
        # is gone, so only the controller's series can still name it (both rules' `for: 10m`
        # keep the alerts pending for the length of this test)
        [expr] = [r["expr"] for r in _rules() if r["alert"] == "NodecertReportsStopped"]
        stale = prom.query(expr)
        assert [s["metric"]["host"] for s in stale] == [FLEET_QUIET]
        assert float(stale[0]["value"][1]) == pytest.approx(2 * 86400, abs=600)
        [expr] = [r["expr"] for r in _rules() if r["alert"] == "NodecertHostReportStale"]
        assert sorted(s["metric"]["host"] for s in prom.query(expr)) == [FLEET_QUIET, FLEET_GONE]

        def pending() -> list[tuple[str, str, str]]:
            got = sorted((a["labels"]["alertname"], a["labels"]["host"], a["state"]) for a in prom.alerts()
                         if a["labels"]["alertname"] in ("NodecertReportsStopped", "NodecertHostReportStale"))
            return got if len(got) == 3 else []

        assert _wait(pending, "the staleness alerts") == [
            ("NodecertHostReportStale", FLEET_QUIET, "pending"),
            ("NodecertHostReportStale", FLEET_GONE, "pending"),
            ("NodecertReportsStopped", FLEET_QUIET, "pending")]
        assert "NodecertTextfileUnreadable" not in alerts and "NodecertFleetSummaryGone" not in alerts

        for title, expr in _panel_exprs():
            result = prom.query(expr.replace('"$host"', '".*"'))
            assert result, f"panel {title!r}: no data for {expr}"


def _doc_queries() -> list[str]:
    text = (Path(__file__).resolve().parents[2] / "docs" / "prometheus.md").read_text()
    return [line for line in text.splitlines() if "DCGM_FI_DEV_GPU_TEMP" in line
            and not line.startswith(("`", "|")) and "nodecert_check_status" in line]


DCGM_SERIES = [  # one GPU failing two checks, one passing GPU; DCGM's series for both
    ('nodecert_check_status{host="n1",check="ecc-errors",status="FAIL",UUID="GPU-a"}', "1x5"),
    ('nodecert_check_status{host="n1",check="row-remap",status="FAIL",UUID="GPU-a"}', "1x5"),
    ('nodecert_check_status{host="n1",check="ecc-errors",status="PASS",UUID="GPU-b"}', "1x5"),
    ('DCGM_FI_DEV_GPU_TEMP{Hostname="n1",modelName="H100",UUID="GPU-a",gpu="0"}', "71x5"),
    ('DCGM_FI_DEV_GPU_TEMP{Hostname="n1",modelName="H100",UUID="GPU-b",gpu="1"}', "40x5"),
]


def _promql_test(tmp_path: Path, expr: str, samples: list[dict[str, Any]]
                 ) -> subprocess.CompletedProcess[str]:
    doc = {"rule_files": [], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [{"series": s, "values": v} for s, v in DCGM_SERIES],
        "promql_expr_test": [{"expr": expr, "eval_time": "2m", "exp_samples": samples}]}]}
    (tmp_path / "t.yml").write_text(yaml.safe_dump(doc))
    return _promtool("test", "rules", "t.yml", cwd=tmp_path)


def test_the_dcgm_joins_in_the_docs_work_when_a_gpu_fails_two_checks(tmp_path) -> None:
    temp, checks = _doc_queries()
    proc = _promql_test(tmp_path, temp, [
        {"labels": 'DCGM_FI_DEV_GPU_TEMP{Hostname="n1",modelName="H100",UUID="GPU-a",gpu="0"}',
         "value": 71}])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = _promql_test(tmp_path, checks, [
        {"labels": f'{{host="n1",check="{check}",status="FAIL",UUID="GPU-a",Hostname="n1",'
                   'modelName="H100"}', "value": 71} for check in ("ecc-errors", "row-remap")])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # the control: the join the docs gave before fails on these series
    old = ('DCGM_FI_DEV_GPU_TEMP * on(UUID) group_left(check, fault_code) '
           '(nodecert_check_status{status="FAIL"} == 1)')
    proc = _promql_test(tmp_path, old, [])
    assert proc.returncode != 0 and "many" in proc.stdout + proc.stderr
