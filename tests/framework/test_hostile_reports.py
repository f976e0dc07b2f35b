"""The fleet trusts nothing a report says: a forged verdict, a host that is not one node name, a
report no renderer can write, a FIFO, duplicates. Each bad report makes its host ERROR with the
reason; every other host is still reported, in every output format."""

from __future__ import annotations

import copy
import datetime as dt
import json
import os
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from checks.devtools import synthetic
from checks.devtools.synthetic import Broken
from checks.fleet.fleet_cli import main


@pytest.fixture(scope="module")
def reports() -> list[dict[str, Any]]:
    """node0000 PASS, node0001 FAIL (uncorrectable ECC), node0002 PASS."""
    base = synthetic.base_report("h100-sxm-8x-healthy")
    ecc = Broken("node0001", "ecc-errors", gpu=5, message="GPU5: uncorrectable ECC")
    return synthetic.build(3, base=base, run_id="r1", broken=[ecc])


def _write(directory: Path, docs: list[dict[str, Any]]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for doc in docs:
        (directory / f"{doc['host']}.json").write_text(json.dumps(doc))
    return directory


def _fleet(directory: Path, tmp: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    out = tmp / "fleet.json"
    code = main(["report", str(directory), "--no-history", "--json", str(out), "-q", *extra])
    return code, json.loads(out.read_text())


def _hosts(fleet: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {h["host"]: h for h in fleet["hosts"]}


def test_a_forged_pass_verdict_is_an_error_naming_the_file(tmp_path, reports) -> None:
    forged = copy.deepcopy(reports)
    failing = forged[1]
    assert failing["verdict"] == "FAIL"
    failing.update(verdict="PASS", exit_code=0)
    code, fleet = _fleet(_write(tmp_path / "run", forged), tmp_path)
    assert code == 1
    hosts = _hosts(fleet)
    assert hosts["node0001"]["status"] == "ERROR"
    assert "node0001.json" in hosts["node0001"]["reason"]
    assert "verdict PASS does not follow from its checks (FAIL)" in hosts["node0001"]["reason"]
    assert hosts["node0000"]["status"] == hosts["node0002"]["status"] == "PASS"


@pytest.mark.parametrize("forge", [
    pytest.param(lambda r: r["checks"][0].update(status="PASS"), id="check-status-over-results"),
    pytest.param(lambda r: r["summary"].update(FAIL=0), id="summary"),
    pytest.param(lambda r: r.update(exit_code=0), id="exit-code"),
])
def test_any_field_that_does_not_follow_from_the_results_is_an_error(tmp_path, reports, forge) -> None:
    forged = copy.deepcopy(reports)
    failing = forged[1]
    failing["checks"].sort(key=lambda c: c["status"] != "FAIL")  # the failing check first
    forge(failing)
    _, fleet = _fleet(_write(tmp_path / "run", forged), tmp_path)
    assert _hosts(fleet)["node0001"]["status"] == "ERROR"


@pytest.mark.parametrize("host", [
    "gpu[001-512]", "ALL", "all", "node1,node2", "node 1", "../etc/passwd", "a/b", "..", "a..b",
    "-drain", "node\x1b[2J", "node\n1", "", "x" * 300,
])
def test_a_host_that_is_not_one_node_name_is_an_error(tmp_path, reports, host) -> None:
    docs = copy.deepcopy(reports)
    docs[2]["host"] = host
    run = tmp_path / "run"
    _write(run, docs[:2])
    (run / "node0002.json").write_text(json.dumps(docs[2]))
    code, fleet = _fleet(run, tmp_path)
    assert code == 1
    entry = _hosts(fleet)["node0002"]
    assert entry["status"] == "ERROR" and "host" in entry["reason"], entry
    assert _hosts(fleet)["node0000"]["status"] == "PASS"


def test_two_reports_claiming_one_host_are_both_flagged(tmp_path, reports) -> None:
    docs = copy.deepcopy(reports)
    run = _write(tmp_path / "run", docs)
    (run / "impostor.json").write_text(json.dumps(docs[0]))  # claims node0000 too
    code, fleet = _fleet(run, tmp_path)
    hosts = _hosts(fleet)
    assert code == 1
    for name in ("node0000", "impostor"):
        assert hosts[name]["status"] == "ERROR"
        assert "2 reports claim host node0000 (impostor.json, node0000.json)" in hosts[name]["reason"]
    assert hosts["node0002"]["status"] == "PASS"


def _hostile_dir(run: Path, reports: list[dict[str, Any]]) -> dict[str, str]:
    """Plant one bad report of each kind beside the good ones; host -> expected reason."""
    _write(run, reports)
    (run / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    nested = copy.deepcopy(reports[0])
    nested.update(host="nested")
    node: dict[str, Any] = nested["checks"][0]["results"][0]["details"]
    for _ in range(60):
        node["x"] = {}
        node = node["x"]
    (run / "nested.json").write_text(json.dumps(nested))
    surrogate = copy.deepcopy(reports[0])
    surrogate.update(host="surrogate")
    surrogate["checks"][0]["results"][0]["message"] = "bad \ud800 text"
    (run / "surrogate.json").write_text(json.dumps(surrogate))  # ensure_ascii: "\\ud800"
    os.mkfifo(run / "fifo.json")
    (run / "binary.json").write_bytes(b"\xff\xfe\x00garbage")
    return {"deep": "nested too deep", "nested": "nested more than", "surrogate": "lone surrogate",
            "fifo": "not a regular file", "binary": "unreadable"}


def test_the_fleet_survives_every_bad_report_in_every_output(tmp_path, reports, capsys) -> None:
    docs = copy.deepcopy(reports)
    # Readable, but hostile to renderers: rich markup, terminal escapes, XML-invalid characters.
    docs[0]["checks"][0]["results"][0].update(
        status="WARN", fault_code="TEST001",
        message="[/dev/nvidia4] missing [bold]x\x1b]0;pwned\x07 \x00\x0b")
    synthetic.refresh(docs[0])
    docs[2]["environment"]["NCCL_DEBUG"] = "INFO\x01\x1b[31m"
    expect = _hostile_dir(tmp_path / "run", docs)
    out = tmp_path / "out"
    code = main(["report", str(tmp_path / "run"), "--no-history", "--json", str(out / "f.json"),
                 "--html", str(out / "f.html"), "--junit", str(out / "f.xml"),
                 "--prometheus-dir", str(out / "prom"), "--prometheus-host-files", "-v"])
    printed = capsys.readouterr()
    assert code == 1, printed.err
    fleet = _hosts(json.loads((out / "f.json").read_text()))
    for host, reason in expect.items():
        assert fleet[host]["status"] == "ERROR" and reason in fleet[host]["reason"], fleet[host]
    assert fleet["node0000"]["status"] == "WARN"
    assert fleet["node0001"]["status"] == "FAIL"
    assert fleet["node0002"]["status"] == "PASS"
    # The terminal shows the markup as text and no raw escape sequence.
    assert "[/dev/nvidia4]" in printed.out and "\x1b]0;pwned" not in printed.out
    assert "\\x1b]0;pwned\\x07" in printed.out
    # JUnit parses (no character XML forbids) and names every host, the unreadable ones included.
    suites = {s.get("name") for s in ET.parse(out / "f.xml").getroot().iter("testsuite")}
    assert suites >= {"node0000", "node0001", "node0002", *expect}
    assert "[/dev/nvidia4]" in (out / "f.html").read_text()
    assert sorted(p.name for p in (out / "prom").iterdir()) == [
        "nodecert-fleet.prom", "nodecert-node0000.prom", "nodecert-node0001.prom", "nodecert-node0002.prom"]


def _inventory(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "inventory.ini"
    path.write_text(text)
    return path


needs_ansible = pytest.mark.skipif(not Path(sys.executable).with_name("ansible-inventory").exists(),
                                   reason="needs ansible-core in this venv")


@needs_ansible
@pytest.mark.parametrize(("text", "message"), [
    ("[gpu_nodes\nnode1 ansible_host=\n=[[\n", "does not parse: Failed to parse inventory"),
    ("", "lists no hosts"),
    ("[gpu_nodes]\nnode0000\n../../../etc/cron.d/x\n", "is not a node name"),
])
def test_fleet_report_refuses_a_bad_inventory(tmp_path, reports, capsys, text, message) -> None:
    run = _write(tmp_path / "run", copy.deepcopy(reports))
    code = main(["report", str(run), "--no-history", "--inventory", str(_inventory(tmp_path, text))])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1, err


@pytest.mark.parametrize("argv", [
    ["--expect-hosts", "node[0-9]"], ["--expect-hosts", "../x"], ["--expect-hosts", "ALL"],
])
def test_fleet_report_refuses_expected_hosts_that_are_not_node_names(tmp_path, reports, capsys, argv) -> None:
    run = _write(tmp_path / "run", copy.deepcopy(reports))
    assert main(["report", str(run), "--no-history", *argv]) == 2
    err = capsys.readouterr().err
    assert "is not a node name" in err or "reserved" in err


def test_host_errors_from_a_fifo_do_not_hang(tmp_path, reports, capsys) -> None:
    run = _write(tmp_path / "run", copy.deepcopy(reports))
    os.mkfifo(tmp_path / "errors.json")
    assert main(["report", str(run), "--no-history", "--host-errors", str(tmp_path / "errors.json")]) == 2
    assert "not a regular file" in capsys.readouterr().err


def _first_int_path(node: Any, path: tuple[Any, ...] = ()) -> tuple[Any, ...] | None:
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in items:
        if isinstance(value, int) and not isinstance(value, bool):
            return (*path, key)
        found = _first_int_path(value, (*path, key))
        if found:
            return found
    return None


def test_a_4000_digit_integer_is_that_hosts_error_not_a_crash(tmp_path, reports) -> None:
    docs = copy.deepcopy(reports)
    where = _first_int_path(docs[2]["checks"])
    assert where is not None
    target: Any = docs[2]["checks"]
    for key in where[:-1]:
        target = target[key]
    target[where[-1]] = 987654321987
    run = _write(tmp_path / "run", docs)
    text = (run / "node0002.json").read_text()
    (run / "node0002.json").write_text(text.replace("987654321987", "9" * 4000, 1))
    code, fleet = _fleet(run, tmp_path)
    hosts = _hosts(fleet)
    assert code == 1 and hosts["node0002"]["status"] == "ERROR", hosts["node0002"]
    assert "4000 digits" in json.dumps(hosts["node0002"]) and hosts["node0000"]["status"] == "PASS"


_PLAN = {"mode": "all", "rounds": [[{"id": "g0", "hosts": ["node0000", "node0001"]}]]}
HOSTILE_CROSSHOST = {
    "plan not JSON": {"plan.json": "{"},
    "plan a list": {"plan.json": "[]"},
    "rounds a number": {"plan.json": json.dumps({"rounds": 5})},
    "group without id": {"plan.json": json.dumps({"rounds": [[{"hosts": ["node0000"]}]]})},
    "group a string": {"plan.json": json.dumps({"rounds": [["g0"]]})},
    "hosts a number": {"plan.json": json.dumps({"rounds": [[{"id": "g0", "hosts": 3}]]})},
    "busbw rule a string": {"plan.json": json.dumps({**_PLAN, "busbw_rule": "x"})},
    "huge integer": {"plan.json": json.dumps(_PLAN).replace('"all"', "9" * 4000)},
    "deep plan": {"plan.json": "[" * 100_000 + "]" * 100_000},
    "node report checks a dict": {"plan.json": json.dumps(_PLAN), "g0/node0000.json": '{"checks": {}}'},
    "node report results strings": {"plan.json": json.dumps(_PLAN),
                                    "g0/node0000.json": json.dumps({"checks": [{"id": "xhost-collective",
                                                                                "results": ["x"]}]})},
    "plan a FIFO": {"plan.json": None},
    "node report a FIFO": {"plan.json": json.dumps(_PLAN), "g0/node0000.json": None},
}


@pytest.mark.parametrize("files", HOSTILE_CROSSHOST.values(), ids=HOSTILE_CROSSHOST.keys())
def test_malformed_crosshost_files_never_stop_the_fleet_report(tmp_path, reports, capsys, files) -> None:
    run = _write(tmp_path / "run", copy.deepcopy(reports))
    for name, text in files.items():
        path = run / "crosshost" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if text is None:
            os.mkfifo(path)
        else:
            path.write_text(text)
    code, fleet = _fleet(run, tmp_path)
    assert code == 1 and set(_hosts(fleet)) == {"node0000", "node0001", "node0002"}
    assert _hosts(fleet)["node0002"]["status"] == "PASS"


def test_a_start_time_in_the_future_is_that_hosts_error_not_a_fresh_report(tmp_path, reports) -> None:
    """A report started in 2999 would look fresh for ever (the staleness alert reads when it
    finished): the host is an ERROR naming the clock; a few hours ahead (drift) is still read."""
    docs = copy.deepcopy(reports)
    docs[0]["started_at"] = "2999-01-01T00:00:00+00:00"
    hours_ahead = dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=3)
    docs[2]["started_at"] = hours_ahead.isoformat()
    code, fleet = _fleet(_write(tmp_path / "run", docs), tmp_path)
    assert code == 1
    hosts = _hosts(fleet)
    assert hosts["node0000"]["status"] == "ERROR", hosts["node0000"]
    assert "started_at 2999-01-01T00:00:00+00:00 is" in hosts["node0000"]["reason"]
    assert "a wrong clock on the node or an edited report" in hosts["node0000"]["reason"]
    assert hosts["node0002"]["status"] == "PASS"
