"""Names the run directory reserves for its own files (fleet, meta, crosshost, history, none) are
refused as report file names, but a node may call itself that: the Slurm wrapper reads its own
node's report (as report.json, slurm_gate), and a node named `fleet` was drained by its own health
check for its name. ALL, which scontrol expands into every node, stays refused everywhere."""

from __future__ import annotations

import json
from typing import Any

import pytest

from checks.devtools import synthetic
from checks.fleet.fleet_cli import main
from checks.report import load


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    [doc] = synthetic.build(1, base=synthetic.base_report("h100-sxm-8x-healthy"), run_id="r1")
    return doc


@pytest.mark.parametrize("name", ["fleet", "meta", "crosshost", "history", "none", "Fleet"])
def test_a_node_named_like_a_run_directory_entry_reads_its_own_report(tmp_path, report, name) -> None:
    doc = {**report, "host": name}
    path = tmp_path / "report.json"  # where the Slurm wrapper has python -m checks write it
    path.write_text(json.dumps(doc))
    item = load.read(path)
    assert item is not None and item.error is None, item and item.error
    assert item.report is not None and item.report["host"] == name and item.report["verdict"] == "PASS"


@pytest.mark.parametrize("name", ["ALL", "all", "gpu[1-2]", "a/b", "a,b"])
def test_names_scontrol_would_expand_stay_refused(tmp_path, report, name) -> None:
    path = tmp_path / "report.json"
    path.write_text(json.dumps({**report, "host": name}))
    item = load.read(path)
    assert item is not None and item.report is None and "host" in (item.error or "")


def test_in_a_run_directory_the_file_name_is_the_host(tmp_path, report) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "node0000.json").write_text(json.dumps({**report, "host": "fleet"}))
    (run / "none.json").write_text(json.dumps({**report, "host": "node0001"}))
    out = tmp_path / "fleet.json"
    assert main(["report", str(run), "--no-history", "-q", "--json", str(out)]) == 1
    hosts = {h["host"]: h for h in json.loads(out.read_text())["hosts"]}
    assert hosts["node0000"]["status"] == "PASS" and hosts["node0000"]["hostname"] == "fleet"
    assert hosts["none"]["status"] == "ERROR" and "reserved" in hosts["none"]["reason"]
