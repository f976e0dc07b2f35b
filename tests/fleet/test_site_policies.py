"""Which site policy each host ran under (checks/site.py, the report's options.site): the fleet
report names it per host and counts the hosts per policy, and says so in the terminal when the
fleet is split, so nodes judged with other thresholds than their peers stand out."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema

from checks.devtools import synthetic
from checks.fleet.fleet_cli import main

DIGEST = "0123456789abcdef" * 4


def _with_site(report: dict[str, Any], digest: Any) -> dict[str, Any]:
    report = copy.deepcopy(report)
    report.setdefault("options", {})["site"] = {"file": "/etc/nodecert/site.yaml", "sha256": digest,
                                               "changed": ["ecc.dram_corrected_warn"], "skip": []}
    return report


def test_the_fleet_names_each_hosts_policy_and_counts_them(tmp_path, h100_report, fleet_schema, capsys):
    reports = synthetic.build(4, base=h100_report, run_id="r1")
    reports[1] = _with_site(reports[1], DIGEST)
    reports[2] = _with_site(reports[2], DIGEST)
    # a report's word is not trusted: a site that is no digest breaks the report's schema
    reports[3] = _with_site(reports[3], "not a digest\u001b[31m")
    run = synthetic.write(reports, tmp_path / "reports" / "r1")
    out = tmp_path / "fleet.json"
    assert main(["report", str(run), "--json", str(out), "--no-history"]) == 1
    fleet = json.loads(out.read_text())
    jsonschema.validate(fleet, fleet_schema)
    assert fleet["schema_version"] == "1.2"
    by_host = {h["host"]: h["site"] for h in fleet["hosts"]}
    assert by_host == {"node0000": None, "node0001": DIGEST[:12], "node0002": DIGEST[:12], "node0003": None}
    assert next(h for h in fleet["hosts"] if h["host"] == "node0003")["status"] == "ERROR"
    assert fleet["site_policies"] == {DIGEST[:12]: 2, "package": 1}
    shown = capsys.readouterr().out
    assert f"site policies: {DIGEST[:12]} on 2 hosts, package on 1 host " in shown
    assert "\u001b" not in shown


def test_one_policy_is_not_called_out(tmp_path: Path, h100_report, capsys):
    run = synthetic.write([_with_site(r, DIGEST) for r in synthetic.build(2, base=h100_report, run_id="r2")],
                          tmp_path / "reports" / "r2")
    out = tmp_path / "fleet.json"
    assert main(["report", str(run), "--json", str(out), "--no-history"]) == 0
    assert json.loads(out.read_text())["site_policies"] == {DIGEST[:12]: 2}
    assert "site policies" not in capsys.readouterr().out
