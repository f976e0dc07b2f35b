"""The fleet's terminal and JUnit output in the order an operator acts: the hosts to act on first,
a lost GPU one row (its root cause gpu-count, fault code, remedy, confirm commands), the checks it
left unmeasured folded under it."""

from __future__ import annotations

import io
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from checks.devtools import synthetic
from checks.devtools.synthetic import Slow
from checks.fleet import fleet_junit, fleet_terminal
from checks.report import act_on, aggregate

sys.path.insert(0, str(Path(__file__).resolve().parent))
import lost_gpu

# torch-arch, gpu-firmware, persistence-mode, ... gpu-occupied: from the checks' declarations
DEPENDENTS = lost_gpu.dependents("standard")


@pytest.fixture(scope="module")
def lost_gpu(h100_report: dict[str, Any]) -> dict[str, Any]:
    lost = synthetic.build(1, base=synthetic.base_report("node-gpu-lost", level="standard"), run_id="r1")[0]
    lost["host"] = "node0009"
    return lost


@pytest.fixture
def fleet(h100_report: dict[str, Any], lost_gpu: dict[str, Any]) -> aggregate.Fleet:
    """node0001 has a slow GPU (a straggler WARN), node0009 lost its GPU3, node0005 is unreachable."""
    healthy = synthetic.build(4, base=h100_report, run_id="r1",
                              slow=[Slow("node0001", "matmul_bf16_tflops", 0.93, gpu=2)])
    return aggregate.from_reports(
        [*healthy, lost_gpu], expected_hosts=["node0000", "node0001", "node0002", "node0003", "node0009",
                                              "node0005"],
        host_errors={"node0005": "unreachable: ssh: connect to host 10.0.0.5 port 22: No route to host"})


def test_rows_lead_with_the_missing_host_then_the_cause(fleet: aggregate.Fleet) -> None:
    rows = act_on.rows(fleet.hosts)
    assert [(r.host, r.status, r.check) for r in rows] == [
        ("node0005", "MISSING", "no report"), ("node0009", "FAIL", "gpu-count"),
        ("node0001", "WARN", "gpu-matmul")]
    lost = rows[1]
    assert lost.gpu is not None and (lost.gpu.index, lost.gpu.pci) == (3, "0000:5d:00.0")
    assert lost.fault_code == "INV004" and lost.also == ["xid-events"]
    assert lost.dependents == DEPENDENTS
    assert "drain and reboot the node" in (lost.remedy or "")
    assert "nvidia-smi -L" in lost.confirm  # from the troubleshooting catalogue
    assert rows[2].kind == "straggler" and rows[2].serial  # the healthy GPU's serial is known
    assert "node0005" in rows[0].confirm[0]
    assert act_on.folded_checks(rows) == {("node0009", d): "gpu-count" for d in DEPENDENTS}


def test_a_dependent_with_its_own_fault_elsewhere_keeps_its_row(lost_gpu: dict[str, Any]) -> None:
    """ecc-errors not measured on the lost GPU3 but failing on GPU5 by itself: GPU5 is a row."""
    report = synthetic.build(1, base=lost_gpu, run_id="r1")[0]
    ecc = next(c for c in report["checks"] if c["id"] == "ecc-errors")
    gpu5 = next(r for r in ecc["results"] if (r.get("device") or {}).get("index") == 5)
    gpu5.update(status="FAIL", message="GPU5: 2 volatile uncorrectable ECC errors", fault_code="GPU002")
    ecc["status"] = "FAIL"
    rows = act_on.rows(aggregate.from_reports([report]).hosts)
    assert [(r.check, r.gpu.index if r.gpu else None) for r in rows] == [("gpu-count", 3), ("ecc-errors", 5)]
    assert "ecc-errors" in rows[0].dependents
    assert ("node0009", "ecc-errors") not in act_on.folded_checks(rows)


def test_terminal_table_leads_with_hosts_to_act_on(fleet: aggregate.Fleet) -> None:
    out = io.StringIO()
    fleet_terminal.render(fleet, Console(file=out, width=200, color_system=None))
    text = out.getvalue()
    sections: dict[str, list[str]] = {}
    title = ""
    for line in text.splitlines():
        if line.strip() and line.strip()[0] not in "┏┃┡│└":
            title = line.strip()
        sections.setdefault(title, []).append(line)
    assert list(sections)[:4] == ["hosts to act on", "hosts not passing", "checks not passed",
                                  "stragglers (below the median of their peers)"]
    act = "\n".join(sections["hosts to act on"])
    assert act.index("node0005") < act.index("node0009") < act.index("node0001")
    assert "INV004" in act and "nvidia-smi -L" in act
    assert f"+{len(DEPENDENTS)} not measured because of it" in act
    checks = "\n".join(sections["checks not passed"])
    assert checks.index("gpu-count") < checks.index(f"{len(DEPENDENTS)} checks") \
        < checks.index("not measured because of")
    assert "│ torch-arch " not in checks  # no row of its own: folded under gpu-count


def test_compact_lines_in_the_same_order(fleet: aggregate.Fleet) -> None:
    lines = fleet_terminal.compact_lines(fleet)
    assert [line.split(" ")[:2] for line in lines[:3]] == [["MISSING", "node0005:"], ["FAIL", "node0009"],
                                                           ["WARN", "node0001"]]
    assert lines[1].startswith("FAIL node0009 gpu-count GPU3 [INV004]: GPU 3 at 0000:5d:00.0 is lost")
    assert "-> remedy: the GPU left the PCIe bus" in lines[1]
    assert "see docs/troubleshooting.md#inv004" in lines[1]
    assert lines[2].startswith("WARN node0001 straggler: GPU2 gpu-matmul matmul_bf16_tflops")
    assert lines[-1].startswith("FAIL  run r1: 6 hosts") and len(lines) == 4


def test_junit_root_cause_first_dependents_name_it(fleet: aggregate.Fleet) -> None:
    root = fleet_junit.to_xml(fleet)
    assert [s.get("name") for s in root][:3] == ["node0005", "node0009", "node0001"]
    suite = next(s for s in root if s.get("name") == "node0009")
    names = [c.get("name") for c in suite]
    assert names[:2] == ["gpu-count", "xid-events"]
    assert names[2:2 + len(DEPENDENTS)] == DEPENDENTS
    cause = suite[0]
    props = {p.get("name"): p.get("value") for p in cause.iter("property")}
    assert props["not_measured_because_of_it"] == ",".join(DEPENDENTS)
    assert cause.find("failure") is not None
    for case in suite[2:2 + len(DEPENDENTS)]:
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        assert props["caused_by"] == "gpu-count", case.get("name")
        error = case.find("error")
        assert error is not None and error.get("message", "").startswith(
            "not measured because gpu-count failed: "), case.get("name")
    rest = suite[2 + len(DEPENDENTS):]
    assert [c for c in rest if c.find("error") is not None or c.find("failure") is not None] == []
    slow = next(s for s in root if s.get("name") == "node0001")
    assert slow[0].get("name").startswith("straggler gpu-matmul/matmul_bf16_tflops GPU2")
    ET.tostring(root)  # still serialisable


def test_a_hosts_own_failure_before_the_fleets_findings(small_fleet) -> None:
    """Within one severity, what a host's checks found (uncorrectable ECC) comes before what the
    fleet found (stragglers); warnings last."""
    rows = act_on.rows(aggregate.from_reports(small_fleet).hosts)
    assert [(r.host, r.kind, r.check) for r in rows] == [
        ("node0012", "check", "ecc-errors"), ("node0007", "straggler", "gpu-matmul"),
        ("node0010", "straggler", "nccl-allreduce"), ("node0003", "straggler", "gpu-membw")]
    assert rows[0].fault_code == "GPU002" and rows[0].serial and "nvidia-smi -q -d ECC" in rows[0].confirm


def test_without_the_catalogue_a_row_points_at_the_page(fleet: aggregate.Fleet, monkeypatch,
                                                        tmp_path) -> None:
    """An install without the troubleshooting catalogue (a damaged one): no commands, the row
    still names where the code is explained; a broken catalogue the same."""
    from checks import resources

    catalogue = tmp_path / "faults.yaml"
    monkeypatch.setattr(resources, "data", lambda *parts: catalogue)
    for text in (None, "INV004: [unclosed\n"):
        if text is not None:
            catalogue.write_text(text)
        act_on.catalogue.cache_clear()
        act_on.faults.cache_clear()
        try:
            lost = act_on.rows(fleet.hosts)[1]
        finally:
            act_on.catalogue.cache_clear()
            act_on.faults.cache_clear()
        assert lost.check == "gpu-count" and lost.confirm == ()
        assert lost.see() == "docs/troubleshooting.md#inv004"
    monkeypatch.undo()
    assert "nvidia-smi -L" in act_on.rows(fleet.hosts)[1].confirm
