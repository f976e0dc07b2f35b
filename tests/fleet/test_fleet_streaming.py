"""The controller streams a run's reports: each one is read, checked, its figures taken and then
reduced to its summary (checks.report.summary), so the fleet never holds the whole reports; what
the renderers and the history read of a host is the same from the summary as from the report.
And the loader's orjson fast path reads every text into what json reads, or leaves it to json."""

from __future__ import annotations

import gc
import json
import math
import weakref
from collections.abc import Collection
from pathlib import Path
from typing import Any

import pytest

from checks.devtools import synthetic
from checks.devtools.synthetic import Broken, Slow
from checks.fleet import fleet_junit, fleet_terminal, history
from checks.render import html, prometheus
from checks.report import aggregate, fabric_summary, load, summary
from checks.report.findings import Lemon


class _Tracked(dict):  # a dict that a weak reference can follow
    pass


def test_the_fleet_keeps_none_of_the_reports_it_read(tmp_path: Path, h100_report: dict[str, Any],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Every whole report the loader returns is gone once the fleet is built, and while reading
    at most the one in hand is alive: memory does not grow with whole reports."""
    reports = synthetic.build(40, base=h100_report, broken=[Broken("node0003", "gpu-count")])
    directory = synthetic.write(reports, tmp_path / "run")
    del reports
    real_read, alive, most = load.read, [], [0]

    def tracked_read(path: Path, host: str | None = None, validate: load.Validator | None = None,
                     keep_text: bool = False, summary_names: Collection[str] | None = None
                     ) -> load.HostReport | None:
        item = real_read(path, host, validate, keep_text, summary_names)
        if item is not None and item.report is not None:
            item.report = _Tracked(item.report)
            alive.append(weakref.ref(item.report))
            most[0] = max(most[0], sum(ref() is not None for ref in alive))
        return item

    monkeypatch.setattr(load, "read", tracked_read)
    fleet = aggregate.load(directory)
    gc.collect()
    assert len(alive) == 40 and len(fleet.hosts) == 40
    assert [ref for ref in alive if ref() is not None] == []
    assert most[0] <= 2  # the report in hand (and the one before it, until its name is rebound)
    assert fleet.summary["FAIL"] == 1 and fleet.by_check[0].check == "gpu-count"


def _whole(directory: Path) -> aggregate.Fleet:
    """The fleet as it was built before streaming: every whole report kept."""
    fleet = aggregate.aggregate(load.read_dir(directory), source=str(directory))
    fleet.run_id = fleet.run_id or directory.name
    return fleet


def test_renderers_and_history_see_the_same_fleet_from_summaries(tmp_path: Path,
                                                                 h100_report: dict[str, Any]) -> None:
    base = synthetic.base_report("fault-xid-79")
    reports = synthetic.build(6, base=h100_report, slow=[Slow("node0002", "matmul_bf16_tflops", 0.8, gpu=1)],
                              broken=[Broken("node0004", "gpu-count"),
                                      Broken("node0005", "ecc-errors", gpu=2)])
    reports += synthetic.build(1, base=base)
    reports[-1]["host"] = "node0009"
    reports += synthetic.build(1, base=synthetic.base_report("node-gpu-lost"))
    reports[-1]["host"] = "node0010"  # a lost GPU: a failed check with SKIPped results beside
    directory = synthetic.write(reports, tmp_path / "run")
    streamed, whole = aggregate.load(directory), _whole(directory)
    streamed.generated_at = whole.generated_at
    kept = [r for h in streamed.hosts for c in h.report["checks"] for r in c["results"]]
    assert {r["status"] for r in kept} >= {"PASS", "SKIP", "FAIL"}
    # held as compressed JSON text (a fraction of the file), read back as the report's checks
    assert all(isinstance(h.report, summary.Packed) and h.report._text
               and len(h.report._blob) * 4 < (directory / f"{h.host}.json").stat().st_size
               for h in streamed.hosts)
    assert [h.report["checks"] for h in streamed.hosts] == [h.report["checks"] for h in whole.hosts]
    assert all("environment" not in h.report for h in streamed.hosts)
    assert streamed.to_dict() == whole.to_dict()
    assert _xml(fleet_junit.to_xml(streamed)) == _xml(fleet_junit.to_xml(whole))
    assert html.render(streamed) == html.render(whole)
    assert fleet_terminal.compact_lines(streamed) == fleet_terminal.compact_lines(whole)
    assert sorted(history._rows(streamed, "r")) == sorted(history._rows(whole, "r"))
    written = [prometheus.write_fleet(f, tmp_path / name, host_files=True)
               for f, name in ((streamed, "prom-streamed"), (whole, "prom-whole"))]
    assert len(written[0]) == 9  # the fleet file and one per host
    assert [p.read_bytes() for p in written[0]] == [p.read_bytes() for p in written[1]]


def _xml(root: Any) -> bytes:
    import xml.etree.ElementTree as ET

    return ET.tostring(root)


def _reference(raw: bytes) -> tuple[str, Any]:
    """What json (with the loader's hooks) makes of `raw`: ("ok", value) or ("error", message)."""
    try:
        return "ok", json.loads(raw, parse_int=load._bounded_int, object_pairs_hook=load._unique_keys)
    except RecursionError:
        return "error", "nested too deep"
    except ValueError as exc:
        return "error", str(exc)


TEXTS = [
    b'{"a": 1, "b": [1.5, -0, 1e5, "x:y"], "c": {"d": null, "e": true}}',
    b'{"a": 1, "a": 2}',  # a key twice
    b'{"a": {"k": "v", "k": "w"}}',  # nested
    b'{"a": "x", "b": {"c": 1, "c": 1}}',  # the same value twice
    b'{"k": 1, "k": 2, "s": "\\u003a"}',  # an escaped colon may not stand in for the dropped key's
    b'{"k": 1, "k": 2, "s": "\\u003A"}',
    b'{"k" : 1, "k": 2, "s": "a:b"}',  # whitespace before a colon, a colon in a string
    b'{"k": "a:b:c", "k": "", "s": "::"}',
    b'{"n": 123456789012345678}',  # 18 digits: orjson reads it
    b'{"n": 1234567890123456789}',  # 19 digits: json's path
    b'{"n": 18446744073709551616}',  # 2**64: 20 digits, past 64 bits
    b'{"n": 18446744073709551615}',  # 2**64 - 1: orjson reads it as json does
    b'{"n": [-9223372036854775808, -9223372036854775809]}',  # the least 64-bit integer, and past it
    b'{"n": 1.5e17, "s": "e+"}',  # a float and a string orjson writes with an exponent's `e+`
    b'{"f": 0.1000000000000000055511151231257827021181583404541015625}',  # a long float
    b'{"n": ' + b"9" * 25 + b"}",  # refused by the digit bound
    b'{"f": NaN, "g": -Infinity}',
    b'["\\ud800"]',  # lone surrogate
    b'["\xed\xa0\x80"]',
    b"[" * 300 + b"]" * 300,  # deeper than orjson writes (254)
    b"[" * 1100 + b"]" * 1100,  # deeper than orjson reads (1024)
    b"\xef\xbb\xbf{}",  # a byte-order mark
    b"null",
    b'{"a": 1,}',
    b"",
]


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-32-be"])
def test_parse_json_refuses_what_json_would_decode_from_another_encoding_than_utf8(encoding) -> None:
    """RFC 8259: JSON between systems is UTF-8; json.loads would decode UTF-16 and UTF-32, whose
    text the loader's byte scans (controls, surrogates, nesting) cannot see into."""
    with pytest.raises(ValueError, match="a report is UTF-8"):
        load.parse_json('{"x": "\u00e9"}'.encode(encoding))


@pytest.mark.parametrize("raw", TEXTS, ids=range(len(TEXTS)))
def test_parse_json_reads_what_json_reads(raw: bytes) -> None:
    want = _reference(raw)
    try:
        got: tuple[str, Any] = "ok", load.parse_json(raw)
    except ValueError as exc:
        got = "error", str(exc)
    if want[0] == "ok" and isinstance(want[1], float | dict | list):
        assert got[0] == "ok" and json.dumps(got[1]) == json.dumps(want[1])  # NaN != NaN
    else:
        assert got == want


def test_orjson_reads_long_decimals_into_json_s_floats() -> None:
    """The fast path no longer sends a long run of digits to json: orjson's floats must be the
    correctly rounded doubles json's float() gives."""
    if load._orjson is None:
        pytest.skip("orjson is not installed: json reads every report")
    import random

    rng = random.Random(5)
    for _ in range(20_000):
        whole = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 40))).lstrip("0") or "0"
        frac = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 40)))
        text = f"[{rng.choice(['', '-'])}{whole}.{frac}e{rng.randint(-320, 300)}]".encode()
        want = _reference(text)
        got = load.parse_json(text) if want[0] == "ok" and abs(want[1][0]) != math.inf else None
        assert got is None or got == want[1], text


def test_the_fast_path_is_taken_for_a_report() -> None:
    raw = json.dumps(synthetic.build(1, base=synthetic.base_report())[0]).encode()
    if load._orjson is None:
        pytest.skip("orjson is not installed: json reads every report")
    assert load._fast(raw) == json.loads(raw)
    assert load._fast(b'{"a": 1, "a": 2}') is None


def _mixed(depth: int, key: str) -> bytes:
    """Objects and arrays alternating, `depth` deep (`key`: each object's key, each array's first
    item)."""
    text, close = "", ""
    for level in range(depth):
        if level % 2:
            text, close = text + f'["{key}", ', "]" + close
        else:
            text, close = text + f'{{"{key}": ', "}" + close
    return (text + "1" + close).encode()


@pytest.mark.parametrize("key", ["k", "k[]{"])  # the plain path, and brackets in strings
@pytest.mark.parametrize("depth", range(load.MAX_DEPTH - 2, load.MAX_DEPTH + 3))
def test_depth_on_the_bytes_agrees_with_the_walk_for_mixed_brackets(depth: int, key: str) -> None:
    raw = _mixed(depth, key)
    doc = json.loads(raw)
    walked = load.text_problem(doc)
    assert (walked is None) == (depth <= load.MAX_DEPTH)
    assert load.text_problem(doc, raw) == walked
    assert load.plainly_fine(raw) == (walked is None)


def _counting_unpacks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The hosts whose packed checks are unpacked, one entry per unpacking."""
    unpacked: list[str] = []
    real = summary.Packed.__getitem__

    def counted(self: summary.Packed, key: str) -> Any:
        if key == "checks":
            unpacked.append(self["host"])
        return real(self, key)

    monkeypatch.setattr(summary.Packed, "__getitem__", counted)
    return unpacked


def test_the_controller_unpacks_a_hosts_checks_once_per_view(tmp_path: Path, h100_report: dict[str, Any],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The fabric summary (drawn in the HTML and the terminal) reads the few checks it needs
    from beside the packed ones, never unpacking them; the lemons need no walk when there are
    none, and stop at the GPUs they name. A GPU named by two hosts (moved between them) is the
    first host's."""
    reports = synthetic.build(5, base=h100_report)
    synthetic.set_uuid(reports[3], 2, "GPU-moved")
    synthetic.set_uuid(reports[1], 5, "GPU-moved")
    for i, report in enumerate(reports):  # what NCCL said it used, as collective.py records it
        chk = next(c for c in report["checks"] if c["id"] == "nccl-allreduce")
        chk["results"][0]["details"]["transports"] = {"P2P/CUMEM": 56 - i, "SHM": i}
    fleet = aggregate.load(synthetic.write(reports, tmp_path / "run"))
    unpacked = _counting_unpacks(monkeypatch)
    assert fabric_summary.READS <= summary.SIDE_CHECKS
    rows = fabric_summary.summarise(fleet.hosts)
    assert unpacked == []
    assert [r.transports for r in rows] == [r.transports for r in fabric_summary.summarise(
        [aggregate.HostEntry(h.host, h.status, report={"checks": h.report["checks"]}) for h in fleet.hosts])]
    assert [r.transports for r in rows][:2] == ["nccl-allreduce: P2P/CUMEM x56, SHM x0",
                                                "nccl-allreduce: P2P/CUMEM x55, SHM x1"]

    unpacked.clear()
    fleet.set_lemons([])
    assert unpacked == [] and fleet.summary["PASS"] == 5

    lemon = Lemon("GPU-moved", 3, 3, 5, ("node0001", "node0003"), ("gpu-matmul",), "r3")
    fleet.set_lemons([lemon])
    assert unpacked == ["node0000", "node0001"]  # found on node0001: the walk ends there
    failed = {h.host: [f.reason for f in h.findings] for h in fleet.hosts if h.status == "FAIL"}
    assert list(failed) == ["node0001"] and failed["node0001"][0].startswith("GPU5 GPU-moved failed")


def test_spread_rows_of_a_consistent_report_skip_nothing_that_failed(h100_report: dict[str, Any]) -> None:
    """Facts of a report the loader checked walk only the checks whose status is not PASS or
    SKIP: the same rows as the full walk."""
    report = synthetic.build(1, base=h100_report, broken=[Broken("node0000", "gpu-count"),
                                                          Broken("node0000", "persistence-mode", gpu=3)])[0]
    chk = next(c for c in report["checks"] if c["id"] == "driver-version")
    chk["results"][0].update(status="WARN", message="planted warn")
    synthetic.refresh(report)
    rows = aggregate.spread_rows(report)
    assert [r[0] for r in rows] == ["gpu-count", "driver-version", "persistence-mode"]
    assert rows[2][5] == ["GPU3"]
    assert aggregate.spread_rows(report, consistent=True) == rows
