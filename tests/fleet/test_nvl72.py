"""NVL72 domains in the fleet report: trays of one NVLink domain must agree on cluster UUID,
clique ID and IMEX node list. Reports are real `python -m checks --simulate` runs of the shipped
GB200 tray scenarios, one per host."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from checks.devtools.synthetic import base_report
from checks.fleet import fleet_cli
from checks.report import aggregate, nvl72


@pytest.fixture(scope="module")
def tray() -> dict[str, Any]:
    return base_report("blackwell-gb200-tray-healthy")


@pytest.fixture(scope="module")
def other_domain_tray() -> dict[str, Any]:
    return base_report("blackwell-gb200-tray-other-domain")


def named(report: dict[str, Any], host: str) -> dict[str, Any]:
    out = copy.deepcopy(report)
    out["host"] = host
    return out


def set_imex(report: dict[str, Any], nodes: list[str]) -> dict[str, Any]:
    for chk in report["checks"]:
        if chk["id"] == "imex-service":
            chk["results"][0]["details"]["nodes"] = sorted(nodes)
    return report


def test_healthy_domain_passes(tray, fleet_schema) -> None:
    fleet = aggregate.from_reports([named(tray, f"tray{i:02d}") for i in range(4)])
    assert fleet.verdict == "PASS"
    assert nvl72.CHECK_ID not in {c.check for c in fleet.by_check}
    assert nvl72.domains((h.host, h.report) for h in fleet.hosts) == {
        ("9c6f5af3-53bf-49b5-a436-b66766c413c3", 4026): ["tray00", "tray01", "tray02", "tray03"]}
    jsonschema.validate(fleet.to_dict(), fleet_schema)


def test_tray_reporting_another_cluster_uuid_is_named(tray, other_domain_tray,
                                                      fleet_schema) -> None:
    reports = [named(tray, f"tray{i:02d}") for i in range(3)]
    reports.append(named(other_domain_tray, "tray03"))
    # Alone, the odd tray's own report passes: only the fleet can see it.
    assert other_domain_tray["verdict"] == "PASS"
    fleet = aggregate.from_reports(reports)
    assert fleet.verdict == "FAIL" and fleet.exit_code == 1
    status = {h.host: h.status for h in fleet.hosts}
    assert status == {"tray00": "PASS", "tray01": "PASS", "tray02": "PASS", "tray03": "FAIL"}
    (spread,) = [c for c in fleet.by_check if c.check == nvl72.CHECK_ID]
    assert spread.code == "FLT030" and [o.host for o in spread.occurrences] == ["tray03"]
    message = spread.occurrences[0].message
    assert "3f1d2c8e-7a41-4b6e-9d52-0e8b7c6a1f90" in message
    assert "the other 3 tray(s) of its IMEX node list report " \
           "9c6f5af3-53bf-49b5-a436-b66766c413c3 / clique 4026" in message
    assert nvl72.CHECK_ID in next(h for h in fleet.hosts if h.host == "tray03").problems
    jsonschema.validate(fleet.to_dict(), fleet_schema)


def test_tray_with_another_imex_node_list_is_named(tray) -> None:
    nodes = tray["checks"]
    reports = [named(tray, f"tray{i:02d}") for i in range(3)]
    listed = next(c for c in nodes if c["id"] == "imex-service")["results"][0]["details"]["nodes"]
    odd = set_imex(named(tray, "tray03"), [*listed[:-1], "10.40.9.99"])
    findings = nvl72.find((r["host"], r) for r in [*reports, odd])
    assert [f.host for f in findings] == ["tray03"]
    assert "missing 10.40.1.9" in findings[0].message  # sorted as text: .9 is last
    assert "extra 10.40.9.99" in findings[0].message


def test_even_split_names_every_tray(tray, other_domain_tray) -> None:
    reports = [named(tray, "tray00"), named(other_domain_tray, "tray01")]
    findings = nvl72.find((r["host"], r) for r in reports)
    assert [f.host for f in findings] == ["tray00", "tray01"]
    assert all("split evenly" in f.message for f in findings)


def test_non_nvl72_fleet_is_untouched() -> None:
    h100 = base_report("h100-sxm-8x-healthy")
    reports = [named(h100, f"node{i}") for i in range(3)]
    assert nvl72.trays((r["host"], r) for r in reports) == []
    assert aggregate.from_reports(reports).verdict == "PASS"


def test_failed_tray_gives_no_identity(tray) -> None:
    failed = base_report("blackwell-gb200-fabric-registration-failed")
    assert nvl72.trays([("t", failed)]) == []
    assert nvl72.trays([("t", tray)])[0].clique_id == 4026


def test_fleet_cli_reports_the_odd_tray(tmp_path: Path, tray, other_domain_tray,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run-nvl72"
    run.mkdir()
    for i in range(3):
        (run / f"tray{i:02d}.json").write_text(json.dumps(named(tray, f"tray{i:02d}")))
    (run / "tray03.json").write_text(json.dumps(named(other_domain_tray, "tray03")))
    out = tmp_path / "fleet.json"
    code = fleet_cli.main(["report", str(run), "-q", "--no-history", "--json", str(out)])
    assert code == 1
    fleet = json.loads(out.read_text())
    (spread,) = [c for c in fleet["by_check"] if c["check"] == "nvl72-domain"]
    assert [h["host"] for h in spread["hosts"]] == ["tray03"]
