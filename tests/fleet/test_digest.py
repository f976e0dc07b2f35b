"""Same bits everywhere: the node's reference-digest check (scenario and real CPU computation)
and the fleet's digest groups by (GPU model, driver, CUDA, torch)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from checks.devtools import synthetic
from checks.fleet import fleet_cli as cli
from checks.hw.measure import reference
from checks.node import node_cli
from checks.report import aggregate
from checks.report import digest_groups as digest

ROOT = Path(__file__).resolve().parents[2]
GOOD = "9" * 64
BAD = "b" * 64


def _run_node(tmp_path: Path, measurements: dict[str, Any] | None) -> dict[str, Any]:
    scenario = {"description": "test fixture: h100-sxm-8x-healthy with reference digests",
                "extends": "h100-sxm-8x-healthy"}
    if measurements is not None:
        scenario["measurements"] = {"digest": measurements}
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(scenario))
    out = tmp_path / "report.json"
    code = node_cli.main(["--simulate", str(path), "--only", "reference-digest", "--json", str(out), "-q"])
    report = json.loads(out.read_text())
    assert code == report["exit_code"]
    [chk] = report["checks"]
    assert chk["id"] == "reference-digest" and chk["code"] == "SDC001"
    return chk


def test_every_gpu_with_the_same_repeatable_digest_passes(tmp_path) -> None:
    chk = _run_node(tmp_path, {"default": {"digest": GOOD}})
    assert [r["status"] for r in chk["results"]] == ["PASS"] * 8
    details = chk["results"][0]["details"]
    assert details["digest"] == GOOD and details["model"] == "NVIDIA H100 80GB HBM3"
    assert details["reference"] == reference.reference_id()


def test_a_gpu_computing_other_bits_than_the_node_majority_fails(tmp_path) -> None:
    chk = _run_node(tmp_path, {"default": {"digest": GOOD}, 3: {"digest": BAD}})
    statuses = {r["device"]["index"]: r["status"] for r in chk["results"]}
    assert statuses == {i: "FAIL" if i == 3 else "PASS" for i in range(8)}
    bad = next(r for r in chk["results"] if r["status"] == "FAIL")
    assert bad["fault_code"] == "SDC001" and "differs from" in bad["message"]


def test_a_gpu_that_cannot_repeat_its_own_result_fails(tmp_path) -> None:
    chk = _run_node(tmp_path, {"default": {"digest": GOOD}, 5: {"digests": [GOOD, BAD]}})
    bad = [r for r in chk["results"] if r["status"] == "FAIL"]
    assert [r["device"]["index"] for r in bad] == [5]
    assert "different digests" in bad[0]["message"]


def test_non_finite_results_fail(tmp_path) -> None:
    chk = _run_node(tmp_path, {"default": {"digest": GOOD}, 0: {"digest": "non-finite"}})
    assert [r["status"] for r in chk["results"]].count("FAIL") == 1
    assert "non-finite" in chk["results"][0]["message"]


def test_a_split_with_no_majority_warns(tmp_path) -> None:
    chk = _run_node(tmp_path, {"default": {"digest": GOOD}, **{i: {"digest": BAD} for i in range(4)}})
    assert {r["status"] for r in chk["results"]} == {"WARN"}


def test_a_scenario_without_digests_skips_rather_than_passes(tmp_path) -> None:
    chk = _run_node(tmp_path, None)
    assert chk["status"] == "SKIP" and "measurements.digest" in chk["results"][0]["message"]


# --- the real computation, on the CPU ---------------------------------------------------------

SMALL = {**reference.REFERENCE, "n": 64, "steps": 4}


def test_the_reference_is_deterministic_and_depends_on_its_definition() -> None:
    torch = pytest.importorskip("torch")
    cpu = torch.device("cpu")
    first = reference.compute(cpu, SMALL)
    assert len(first) == 64 and first == reference.compute(cpu, SMALL)
    assert reference.compute(cpu, {**SMALL, "seed": SMALL["seed"] + 1}) != first
    assert reference.compute(cpu, {**SMALL, "steps": 5}) != first
    # Deterministic mode is switched on for the computation only (the CPU path runs in-process).
    assert not torch.are_deterministic_algorithms_enabled()


def test_deterministic_mode_is_on_during_the_computation_without_loading_inductor() -> None:
    """ATen's switch, not torch.use_deterministic_algorithms, which imports all of inductor
    (seconds of CPU); in a fresh process so that nothing else loaded inductor first."""
    code = ("import sys, torch\n"
            "from checks.hw.measure import reference\n"
            "with reference._deterministic(torch):\n"
            "    inside = torch.are_deterministic_algorithms_enabled()\n"
            "reference.compute(torch.device('cpu'), {**reference.REFERENCE, 'n': 64, 'steps': 4})\n"
            "print(inside, torch.are_deterministic_algorithms_enabled(),\n"
            "      'torch._inductor' in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "False", "False"]


def test_another_process_computes_the_same_bits() -> None:
    """The full reference, in this process and in a measurement child (isolate.py)."""
    torch = pytest.importorskip("torch")
    here = reference.compute(torch.device("cpu"), reference.REFERENCE_CPU)
    child = subprocess.run([sys.executable, "-m", "checks.hw.measure.isolate_child", "digest", "-"],
                           input='{"device": "cpu"}', capture_output=True, text=True, timeout=300,
                           cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert child.returncode == 0, child.stdout + child.stderr
    [row] = json.loads(child.stdout)["result"]
    assert row["digests"] == [here, here]
    assert row["reference"] == reference.reference_id(reference.REFERENCE_CPU) != reference.reference_id()


# --- across the fleet -------------------------------------------------------------------------

def _with_digests(report: dict[str, Any], digests: dict[int, str], *, default: str = GOOD,
                  driver: str | None = None) -> dict[str, Any]:
    synthetic.add_digests(report, digests, default=default)
    if driver:
        report["system"] = {**report["system"], "driver": driver}
    return report


def _fleet(h100_report: dict[str, Any], n: int = 6) -> list[dict[str, Any]]:
    return [_with_digests(r, {}) for r in synthetic.build(n, base=h100_report, run_id="d1")]


def test_a_node_whose_digest_differs_from_its_groups_majority_is_named(h100_report) -> None:
    reports = _fleet(h100_report)
    _with_digests(reports[4], {2: BAD})  # node0004's GPU2: a second, differing entry
    reports[4]["checks"].pop(-2)
    fleet = aggregate.from_reports(reports)
    [group] = fleet.digests.groups
    assert group.key.model == "NVIDIA H100 80GB HBM3" and group.key.driver == "550.90.07"
    assert group.key.cuda == "12.4" and group.key.torch == "2.5.1+cu124"
    assert group.majority == GOOD and dict(group.counts) == {GOOD: 47, BAD: 1}
    [odd] = fleet.digests.odd
    assert (odd.host, odd.gpu.index, odd.status) == ("node0004", 2, "FAIL")
    assert {h.host: h.status for h in fleet.hosts}["node0004"] == "FAIL"
    assert fleet.verdict == "FAIL"


def test_another_driver_is_another_group_not_a_mismatch(h100_report) -> None:
    reports = _fleet(h100_report)
    reports[1] = _with_digests(synthetic.build(2, base=h100_report, run_id="d1")[1], {}, default=BAD,
                               driver="570.86.15")
    fleet = aggregate.from_reports(reports)
    assert [(g.key.driver, len(g.hosts), g.majority) for g in fleet.digests.groups] == [
        ("550.90.07", 5, GOOD), ("570.86.15", 1, BAD)]
    assert fleet.digests.odd == () and fleet.verdict == "PASS"


def test_two_nodes_that_disagree_have_no_majority_and_both_warn(h100_report) -> None:
    reports = _fleet(h100_report, n=2)
    reports[1]["checks"][-1]["results"] = [
        {**r, "details": {**r["details"], "digest": BAD}} for r in reports[1]["checks"][-1]["results"]]
    fleet = aggregate.from_reports(reports)
    assert {o.status for o in fleet.digests.odd} == {"WARN"}
    assert {h.status for h in fleet.hosts} == {"WARN"}


def test_the_fleet_cli_records_digest_groups(tmp_path, h100_report, fleet_schema) -> None:
    reports = _fleet(h100_report)
    reports[0]["checks"][-1]["results"][7]["details"]["digest"] = BAD
    directory = synthetic.write(reports, tmp_path / "reports" / "d1")
    out = tmp_path / "fleet.json"
    code = cli.main(["report", str(directory), "--json", str(out), "-q"])
    assert code == 1
    doc = json.loads(out.read_text())
    jsonschema.validate(doc, fleet_schema)
    assert [(o["host"], o["gpu"]["index"], o["status"]) for o in doc["digests"]["odd"]] == [
        ("node0000", 7, "FAIL")]
    import sqlite3

    db = sqlite3.connect(tmp_path / "reports" / "history.sqlite")
    assert db.execute("SELECT host, check_id, gpu_index, status FROM results "
                      "WHERE check_id = 'digest'").fetchall() == [("node0000", "digest", 7, "FAIL")]


def test_cpu_results_are_not_compared(cpu_report) -> None:
    report = json.loads(json.dumps(cpu_report))
    report["checks"].append({"id": "reference-digest", "code": "SDC001", "title": "t", "level": "standard",
                             "tags": [], "status": "SKIP", "duration_s": 0.1, "results": [{
                                 "status": "SKIP", "message": "cpu", "device": None,
                                 "details": {"digest": BAD, "reference": "v1"}}]})
    assert list(digest.entries_of("h", report)) == []


def test_the_html_report_groups_digests_and_names_the_odd_node(h100_report) -> None:
    from checks.render import html

    reports = _fleet(h100_report)
    reports[3]["checks"][-1]["results"][6]["details"]["digest"] = BAD
    page = html.render(aggregate.from_reports(reports))
    section = page.split("Same bits everywhere")[1].split("</section>")[0]
    assert "NVIDIA H100 80GB HBM3" in section and "550.90.07" in section and "2.5.1+cu124" in section
    odd_table = section.split("differs from their group")[1]
    assert "node0003" in odd_table and "GPU6" in odd_table and BAD[:16] in odd_table
    assert "node0001" not in odd_table
