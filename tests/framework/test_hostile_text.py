"""What a report's bytes may not do to the fleet: name a key twice (json keeps the last value, so
a second `"message"` or `"status"` hides the first), put raw control or bidirectional characters
into a terminal, HTML page or JUnit file, or count as a fleet member when the inventory does not
list its host. Each case fails on the loader and fleet CLI before they were hardened."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from checks.devtools import synthetic
from checks.devtools.synthetic import Broken
from checks.fleet import crosshost_plan
from checks.fleet.fleet_cli import main
from checks.report import load

ECC = "GPU5: uncorrectable ECC"
# U+202E (right-to-left override), ESC (a terminal colour/clear sequence), BEL, NUL, U+2066
# (left-to-right isolate), U+009B (the one-byte CSI)
HOSTILE = "evil\u202eTXT \x1b[2J\x1b]0;title\x07 bell\x00nul \u2066iso \x9b31m"
RAW = {"U+202E": "\u202e".encode(), "ESC": b"\x1b", "BEL": b"\x07", "NUL": b"\x00",
       "U+2066": "\u2066".encode(), "U+009B": "\x9b".encode()}


@pytest.fixture(scope="module")
def reports() -> list[dict[str, Any]]:
    """node0000 PASS, node0001 FAIL (uncorrectable ECC), node0002 PASS."""
    base = synthetic.base_report("h100-sxm-8x-healthy")
    return synthetic.build(3, base=base, run_id="r1",
                           broken=[Broken("node0001", "ecc-errors", gpu=5, message=ECC)])


def _write(directory: Path, docs: list[dict[str, Any]]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for doc in docs:
        (directory / f"{doc['host']}.json").write_text(json.dumps(doc))
    return directory


def _hosts(path: Path) -> dict[str, dict[str, Any]]:
    return {h["host"]: h for h in json.loads(path.read_text())["hosts"]}


# --- duplicate keys ---------------------------------------------------------------------------

def test_a_key_named_twice_makes_the_report_unreadable(tmp_path, reports) -> None:
    run = _write(tmp_path / "run", reports)
    text = (run / "node0001.json").read_text()
    needle = json.dumps({"message": ECC})[1:-1]
    assert needle in text
    # the second "message" would win: the fleet would show the failure as "all fine"
    (run / "node0001.json").write_text(text.replace(needle, f'{needle}, "message": "all fine"', 1))
    out = tmp_path / "fleet.json"
    assert main(["report", str(run), "--no-history", "-q", "--json", str(out)]) == 1
    hosts = _hosts(out)
    assert hosts["node0001"]["status"] == "ERROR"
    assert "duplicate key 'message'" in hosts["node0001"]["reason"]
    assert "node0001.json" in hosts["node0001"]["reason"]
    assert hosts["node0000"]["status"] == hosts["node0002"]["status"] == "PASS"


def test_duplicate_keys_in_the_other_files_the_fleet_reads(tmp_path, reports, capsys) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text('{"rounds": [], "rounds": [[{"id": "g0", "hosts": ["a", "b"]}]]}')
    with pytest.raises(ValueError, match="duplicate key 'rounds'"):
        crosshost_plan._read_json(plan)
    errors = tmp_path / "errors.json"
    errors.write_text('{"node0009": "unreachable", "node0009": "fine"}')
    run = _write(tmp_path / "run", reports)
    assert main(["report", str(run), "--no-history", "-q", "--host-errors", str(errors)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "duplicate key 'node0009'" in lines[0]


def test_parse_json_keeps_what_json_keeps() -> None:
    doc = {"a": [1, {"b": None, "c": "x"}], "d": {"e": {"f": -12345678901234567890}}}
    assert load.parse_json(json.dumps(doc)) == doc
    with pytest.raises(ValueError, match="duplicate key 'x'"):
        load.parse_json('{"a": {"x": 1, "y": 2, "x": 1}}')


# --- control and bidirectional characters ------------------------------------------------------

def _raw_in(data: bytes) -> list[str]:
    return [name for name, raw in RAW.items() if raw in data]


def test_no_renderer_writes_a_raw_control_or_bidi_character(tmp_path, reports, capsys) -> None:
    hostile = json.loads(json.dumps(reports))
    for chk in hostile[1]["checks"]:
        for result in chk["results"]:
            if result["message"] == ECC:
                result["message"] = f"{ECC} {HOSTILE}"
                result.setdefault("details", {})["note"] = HOSTILE
    hostile[0]["environment"] = {**hostile[0].get("environment", {}), "NOTE": HOSTILE}
    run = _write(tmp_path / "run", hostile)
    errors = tmp_path / "errors.json"
    errors.write_text(json.dumps({"node0009": f"unreachable {HOSTILE}"}))
    out = {k: tmp_path / f"fleet.{k}" for k in ("json", "html", "xml")}
    code = main(["report", str(run), "--no-history", "-v", "--host-errors", str(errors),
                 "--json", str(out["json"]), "--html", str(out["html"]), "--junit", str(out["xml"])])
    assert code == 1
    terminal = capsys.readouterr().out.encode()
    assert "evil" in terminal.decode() and "unreachable" in terminal.decode()
    for name, data in [("terminal", terminal), *((k, p.read_bytes()) for k, p in out.items())]:
        assert not _raw_in(data), f"{name} holds raw {_raw_in(data)}"
    ET.parse(out["xml"])  # NUL made the JUnit file invalid XML
    html = out["html"].read_text()
    assert "\\u202e" in html and "\\x1b" in html  # written as escapes: the text says what was there
    hosts = _hosts(out["json"])
    assert hosts["node0001"]["status"] == "FAIL"  # the report itself is still read and judged
    assert "\\x07" in hosts["node0009"]["reason"]


def test_clean_leaves_ordinary_text_and_the_fast_path_agrees() -> None:
    text = "GPU3: 12 uncorrectable ECC errors\tsee dmesg\nµs, 東京, Ωmega, ≤ 5 %"
    assert load.clean(text) == text
    assert load.clean("a\u202eb\x1bc\x00d\x7fe\u2028") == "a\\u202eb\\x1bc\\x00d\\x7fe\\u2028"
    for s in ["plain", "tab\tnew\nline", "µ東京", *map(chr, load._UNSAFE)]:
        raw = json.dumps({"m": s}).encode()
        raw_utf8 = json.dumps({"m": s}, ensure_ascii=False).encode("utf-8", "surrogatepass")
        for data in (raw, raw_utf8):
            doc = json.loads(data)
            assert load.cleaned(doc, data) == load.cleaned(doc), (s, data)


# --- reports from hosts the inventory does not list --------------------------------------------

@pytest.mark.skipif(not Path(sys.executable).with_name("ansible-inventory").exists(),
                    reason="needs ansible-core in this venv")
def test_a_report_from_a_host_outside_the_inventory_is_named_not_counted(tmp_path, reports,
                                                                         capsys) -> None:
    stray = json.loads(json.dumps(reports[1]))  # a FAIL report
    stray["host"] = "intruder7"
    run = _write(tmp_path / "run", [reports[0], reports[2], stray])
    inventory = tmp_path / "inventory.ini"
    inventory.write_text("[gpu_nodes]\nnode0000\nnode0002\n")
    out = tmp_path / "fleet.json"
    code = main(["report", str(run), "--no-history", "-q", "--inventory", str(inventory),
                 "--json", str(out)])
    assert code == 0  # the listed hosts pass; the stray FAIL is no member
    err = capsys.readouterr().err
    assert "1 report(s) from hosts outside the inventory, not counted: intruder7" in err
    doc = json.loads(out.read_text())
    assert doc["outside_inventory"] == ["intruder7"]
    assert sorted(h["host"] for h in doc["hosts"]) == ["node0000", "node0002"]
    assert doc["summary"]["hosts"] == 2
    # --expect-hosts names who must report, not the whole fleet: every report counts, as before
    assert main(["report", str(run), "--no-history", "-q", "--expect-hosts", "node0000",
                 "--json", str(out)]) == 1
    assert "outside_inventory" not in json.loads(out.read_text())


def test_a_cross_host_message_reaches_the_terminal_escaped(tmp_path, reports, capsys) -> None:
    """A node's cross-host result message is printed in the group's line (culprit and reason):
    read through the same sanitising as the host reports."""
    run = _write(tmp_path / "run", reports[:2])
    (run / "crosshost" / "g0").mkdir(parents=True)
    (run / "crosshost" / "plan.json").write_text(json.dumps(
        {"mode": "all", "busbw_rule": {"floor_gbs": 1.0, "pct": 10},
         "rounds": [[{"id": "g0", "hosts": ["node0000", "node0001"], "rail": None}]]}))
    for host, status in (("node0000", "FAIL"), ("node0001", "PASS")):
        result = {"status": status, "message": HOSTILE if status == "FAIL" else "ok",
                  "details": {"group": "g0"}}
        (run / "crosshost" / "g0" / f"{host}.json").write_text(json.dumps(
            {"checks": [{"id": "xhost-collective", "code": "XHOST001", "results": [result]}]}))
    assert main(["report", str(run), "--no-history", "-v"]) == 1
    out = capsys.readouterr().out
    assert "culprit node0000" in out and "evil\\u202e" in out
    assert not _raw_in(out.encode())
