"""`python -m checks.fleet report` through main(argv): outputs, exit codes, history, inventory."""

from __future__ import annotations

import json
import shutil
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from checks.devtools import synthetic
from checks.devtools.synthetic import Broken, Slow
from checks.fleet.fleet_cli import main


def _run_dir(root: Path, run_id: str, base: dict[str, Any], n: int = 4, **plant: Any) -> Path:
    return synthetic.write(synthetic.build(n, base=base, run_id=run_id, **plant), root / run_id)


def test_healthy_fleet_exits_0(tmp_path, h100_report, capsys) -> None:
    run = _run_dir(tmp_path / "reports", "r1", h100_report)
    argv = ["report", str(run), "--expect-hosts", "node0000,node0001", "--expect-hosts", "node0002"]
    assert main(argv) == 0
    assert "PASS  run r1: 4 hosts  PASS 4" in capsys.readouterr().out
    assert (tmp_path / "reports" / "history.sqlite").exists()  # default: beside the run directories


def test_every_output(tmp_path, h100_report, fleet_schema, capsys) -> None:
    run = _run_dir(
        tmp_path / "reports",
        "r1",
        h100_report,
        slow=[Slow("node0002", "membw_copy_gbs", 0.5, gpu=1)],
        broken=[Broken("node0001", "ecc-errors", gpu=5, message="GPU5: uncorrectable ECC")],
    )
    errors = tmp_path / "host-errors.json"
    errors.write_text(json.dumps({"node0009": "unreachable"}))
    out = tmp_path / "out"
    code = main(
        [
            "report",
            str(run),
            "--host-errors",
            str(errors),
            "--json",
            str(out / "fleet.json"),
            "--html",
            str(out / "fleet.html"),
            "--junit",
            str(out / "fleet.xml"),
            "--prometheus-dir",
            str(out / "prom"),
            "--prometheus-host-files",
            "--history",
            str(out / "h.sqlite"),
        ]
    )
    assert code == 1
    printed = capsys.readouterr().out
    assert "node0009" in printed and "unreachable" in printed and "ecc-errors" in printed

    doc = json.loads((out / "fleet.json").read_text())
    jsonschema.Draft202012Validator(fleet_schema).validate(doc)
    assert {h["host"]: h["status"] for h in doc["hosts"]} == {
        "node0000": "PASS",
        "node0001": "FAIL",
        "node0002": "FAIL",
        "node0003": "PASS",
        "node0009": "MISSING",
    }
    assert (out / "fleet.html").read_text().startswith("<!DOCTYPE html>")
    assert sorted(p.name for p in (out / "prom").iterdir()) == [
        "nodecert-fleet.prom",
        *(f"nodecert-node000{i}.prom" for i in range(4)),
    ]

    suites = {s.get("name"): s for s in ET.parse(out / "fleet.xml").getroot()}
    assert suites["node0009"].find("testcase/error").get("message") == "unreachable"
    straggler = [c for c in suites["node0002"] if c.get("name", "").startswith("straggler")]
    assert straggler[0].find("failure") is not None and suites["node0002"].get("failures") == "1"
    assert suites["node0001"].get("failures") == "1"


def test_lemons_across_runs(tmp_path, h100_report) -> None:
    reports = tmp_path / "reports"
    for i, broken in enumerate(
        [[Broken("node0001", "ecc-errors", gpu=5)], [], [Broken("node0001", "row-remap", gpu=5)]]
    ):
        run = _run_dir(reports, f"r{i}", h100_report, broken=broken)
        main(["report", str(run), "-q", "--json", str(run / "fleet.json")])
    doc = json.loads((reports / "r2" / "fleet.json").read_text())
    [lemon] = doc["lemons"]
    assert lemon["hosts"] == ["node0001"] and lemon["checks"] == ["ecc-errors", "row-remap"]
    assert (lemon["failed_runs"], lemon["seen_runs"]) == (2, 3)
    again = main(
        ["report", str(reports / "r2"), "-q", "--lemon-failures", "3", "--json", str(tmp_path / "f.json")]
    )
    assert again == 1 and json.loads((tmp_path / "f.json").read_text())["lemons"] == []


@pytest.mark.skipif(
    not (Path(sys.executable).with_name("ansible-inventory").exists() or shutil.which("ansible-inventory")),
    reason="needs ansible-core",
)
def test_hosts_from_an_ansible_inventory(tmp_path, h100_report, capsys) -> None:
    run = _run_dir(tmp_path / "reports", "r1", h100_report, n=2)
    inventory = tmp_path / "inventory"
    inventory.write_text("[gpu]\nnode0000\nnode0001 ansible_host=10.0.0.2\n\n[spare]\nnode0002\n")
    assert main(["report", str(run), "--inventory", str(inventory), "--no-history"]) == 1
    assert "node0002 │ MISSING" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["report", "/nonexistent/run"], "is not a directory"),
        (["report", "{empty}"], "no host reports"),
        (["report", "{empty}", "--host-errors", "/nonexistent.json"], "--host-errors"),
        (["report", "{empty}", "--inventory", "/nonexistent-inventory"], "does not exist"),
        (["report", "{empty}", "--lemon-failures", "3", "--lemon-runs", "2"], "--lemon-failures"),
    ],
)
def test_usage_errors_exit_2_with_one_line(tmp_path, capsys, argv, message) -> None:
    (tmp_path / "empty").mkdir()
    argv = [a.replace("{empty}", str(tmp_path / "empty")) for a in argv]
    assert main([*argv, "--no-history"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1


def test_argparse_errors_exit_2(tmp_path) -> None:
    assert main([]) == 2
    assert main(["report", str(tmp_path), "--expect-hosts", "a", "--inventory", "inv"]) == 2
