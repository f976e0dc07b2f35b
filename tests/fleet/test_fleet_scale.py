"""The loader's fast path at fleet scale: a report's text is judged on its bytes (nesting depth,
anything that decodes to a surrogate) and the parsed tree is walked only when the bytes cannot rule
a problem out, with the same verdict as the walk."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from checks.report import load

sys.path.insert(0, str(Path(__file__).resolve().parent))
import lost_gpu


def _nested(n: int, inner: str) -> bytes:
    return ("[" * n + inner + "]" * n).encode()


CASES = [
    *(_nested(n, inner) for n in range(load.MAX_DEPTH - 2, load.MAX_DEPTH + 4) for inner in ("", "1", '"x"')),
    *(('{"a":' * n + "{}" + "}" * n).encode() for n in range(load.MAX_DEPTH - 2, load.MAX_DEPTH + 3)),
    b'["\\ud800"]',  # lone surrogate by escape
    b'["\\uDFFF", 1]',
    b'["\xed\xa0\x80"]',  # lone surrogate by raw bytes (json.loads decodes with surrogatepass)
    b'["\\uD83D\\uDE00"]',  # a pair: fine, but only the walk can tell
    b'["' + b"[" * 100 + b'"]',  # brackets in a string are not nesting
    b'{"a\\"[[": [1, {"b": "\\\\ud800"}]}',  # an escaped quote and an escaped backslash
    b'["\\"[\\"", ' + b"[" * 31 + b"]" * 31 + b"]",  # a bracket between escaped quotes is text
    b'["][", "[", {"]": ["}"]}]',  # brackets in strings and keys
    '["x"]'.encode("utf-16"),
    b'{"ok": ["\\u00e9 \xc3\xa9", {"n": null}]}',
]


@pytest.mark.parametrize("raw", CASES, ids=range(len(CASES)))
def test_fast_path_gives_the_walks_verdict(raw: bytes) -> None:
    doc = json.loads(raw)
    walked = load.text_problem(doc)
    assert load.text_problem(doc, raw) == walked
    if load.plainly_fine(raw):
        assert walked is None


def test_fast_path_taken_for_plain_reports_and_refused_for_hostile_ones() -> None:
    assert load.plainly_fine(_nested(load.MAX_DEPTH, "1"))
    assert not load.plainly_fine(_nested(load.MAX_DEPTH + 1, "1"))
    deep = _nested(load.MAX_DEPTH + 1, "1")
    assert "nested more than" in (load.text_problem(json.loads(deep), deep) or "")
    assert not load.plainly_fine(b'["\\ud800"]')
    assert load.text_problem(json.loads(b'["\\ud800"]'), b'["\\ud800"]') is not None
    assert load.plainly_fine(b'{"host": "node0001", "checks": [{"id": "gpu-count", "results": []}]}')


def test_compact_form_for_logs(tmp_path, h100_report, capsys) -> None:
    """--format compact, for logs: one line per host and check not passed; a lost GPU is a
    handful of lines (its dependent checks folded under the cause), not a table of dozens."""
    from checks.devtools import synthetic
    from checks.fleet.fleet_cli import main

    lost = synthetic.build(1, base=synthetic.base_report("node-gpu-lost", level="standard"), run_id="r1")[0]
    lost["host"] = "node0009"
    run = synthetic.write([*synthetic.build(3, base=h100_report, run_id="r1"), lost], tmp_path / "r1")
    argv = ["report", str(run), "--no-history", "--expect-hosts", "node0000,node0005"]
    assert main([*argv, "--format", "compact"]) == 1
    compact = capsys.readouterr().out.splitlines()
    assert main([*argv, "--format", "table"]) == 1
    table = capsys.readouterr().out.splitlines()
    assert compact[-1].startswith("FAIL  run r1: 5 hosts")
    assert "MISSING node0005: no report" in compact
    faults = [line for line in compact[:-1] if line.startswith(("FAIL", "ERROR", "WARN"))]
    assert faults and all(" node0009 " in line for line in faults)
    assert len(compact) <= 6 < 25 < len(table)
    cause = next(line for line in faults if " gpu-count GPU3 " in line)  # the lost GPU's own check
    dependents = lost_gpu.dependents("standard")
    assert cause.startswith("FAIL")
    assert f"+{len(dependents)} checks not measured because of it: {dependents[0]}," in cause
    assert not [line for line in faults if "(see gpu-count)" in line]  # folded, not listed


def test_every_host_unreachable_still_gives_a_fleet_report(tmp_path, capsys) -> None:
    """No report at all (Ansible reached no host): the controller still writes every output, each
    host MISSING with the SSH error the playbook passes in --host-errors, and exits 1, not 2."""
    import xml.etree.ElementTree as ET

    from checks.fleet.fleet_cli import main

    run = tmp_path / "r1"
    (run / "meta").mkdir(parents=True)
    errors = {"node0001": "unreachable: ssh: connect to host 10.0.0.1 port 22: No route to host",
              "node0002": "unreachable: Permission denied (publickey)"}
    (run / "meta" / "host-errors.json").write_text(json.dumps(errors))
    out = run / "meta"
    argv = ["report", str(run), "--expect-hosts", "node0001,node0002", "--host-errors",
            str(out / "host-errors.json"), "--no-history", "--json", str(out / "fleet.json"),
            "--html", str(out / "fleet.html"), "--junit", str(out / "fleet.xml"), "--format", "compact"]
    assert main(argv) == 1
    printed = capsys.readouterr().out.splitlines()
    assert printed == [*(f"MISSING {host}: {why}" for host, why in errors.items()),
                       "FAIL  run r1: 2 hosts  MISSING 2"]
    doc = json.loads((out / "fleet.json").read_text())
    assert {h["host"]: (h["status"], h["reason"]) for h in doc["hosts"]} == {
        host: ("MISSING", why) for host, why in errors.items()}
    suites = {s.get("name"): s for s in ET.parse(out / "fleet.xml").getroot()}
    assert {host: suites[host].find("testcase/error").get("message") for host in errors} == errors
    page = (out / "fleet.html").read_text()
    assert page.count("No route to host") >= 1 and page.count("Permission denied (publickey)") >= 1
