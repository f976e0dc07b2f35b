"""One report never takes the fleet down, and nothing it says is trusted: the property, tested.

A valid host report is mutated (a value replaced by another type, size or number, nesting hidden
behind strings, another encoding, another file name, the fleet summary's schema) and read among
healthy ones by the real fleet CLI, its forked readers included (--jobs), into every output
(fleet.json, JUnit, HTML, Prometheus with the per-host files, the run history). Whatever the
mutation:

- the fleet report is written: exit 0 or 1, no traceback, every output file there and parsable;
- every healthy host keeps its verdict (PASS);
- the poisoned host is an ERROR, or its report was read and its verdict recomputed from its
  results (a mutation the schema allows: a message, a figure);
- no raw control or bidirectional character reaches an output, and no file is written outside
  the output paths.

Examples are bounded and derandomized (profile `hostile-ci`, the default: reproducible in CI,
about 20 s); NODECERT_HYPOTHESIS_PROFILE=hostile-long runs many more, randomized.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import sys
import xml.etree.ElementTree as ET
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from checks.devtools import synthetic
from checks.fleet.fleet_cli import main

# --import-mode=importlib puts no test directory on sys.path (as in tests/e2e/conftest.py): the
# report walk and patch of the older fuzz test serve this one too.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_hostile_fuzz import _paths, _set

settings.register_profile(
    "hostile-ci", max_examples=30, derandomize=True, database=None,
    # the deadline only catches a hang: the shared test machine can be 50x slower than idle
    deadline=timedelta(seconds=60),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("hostile-long", settings.get_profile("hostile-ci"), max_examples=1000,
                          derandomize=False)
PROFILE = settings.get_profile(os.environ.get("NODECERT_HYPOTHESIS_PROFILE", "hostile-ci"))
pytestmark = pytest.mark.timeout(600)

HEALTHY = ("node0000", "node0001", "node0003")
VICTIM = "node0002"
# what no output may hold raw: ESC, BEL, NUL, U+009B (CSI), U+202E (right-to-left override),
# U+2028 (line separator), and a lone surrogate's bytes
RAW_UNSAFE = [b"\x1b", b"\x07", b"\x00", "\x9b".encode(), "\u202e".encode(), "\u2028".encode(), b"\xed\xa0"]

_BASE: list[dict[str, Any]] = []


def _reports() -> list[dict[str, Any]]:
    if not _BASE:
        _BASE.extend(synthetic.build(4, base=synthetic.base_report("h100-sxm-8x-healthy"), run_id="prop"))
    return copy.deepcopy(_BASE)


HOSTILE_TEXT = ["\x1b]0;pwned\x07", "\u202eevil", "\x9b31m", "\u2028", "\x00", "\\", '\\"', "a\\",
                "[{", "}]", "\ud800", "ALL", "node[0-9]", "nodecert-fleet", "e+", "\u003a"]
text = st.one_of(st.sampled_from(HOSTILE_TEXT), st.text(max_size=20),
                 st.lists(st.sampled_from(HOSTILE_TEXT), max_size=4).map("".join))
numbers = st.one_of(
    st.sampled_from([2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64 - 1, 2**64, 2**53 + 1, 10**19,
                     -1, 0, 1e300, -1e300, 5e-324, float("nan"), float("inf"), float("-inf")]),
    st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True))
scalars = st.one_of(st.none(), st.booleans(), numbers, text)
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(text, inner, max_size=4)), max_leaves=10)


def _nest(depth: int, decoy: str) -> Any:
    """Lists `depth` deep, each level beside strings that once fooled the bracket scan."""
    child: Any = []
    for _ in range(depth):
        child = [decoy, child, '\\"', "]\\", "[]"]
    return child


nested = st.builds(_nest, st.integers(20, 700), st.sampled_from(["\\\\", "a\\", "[", "x"]))
ENCODINGS = ["utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-8-sig", "latin-1"]
NAMES = [b"node\xff\xfe", b"node\x1b[31m", b"node\x07", "node\u202e".encode(), b"fleet", b"ALL",
         b"x" * 250, b"node 2", b"-drain", b"n\\x", "n\u00e9".encode(), b"gpu[1-2]"]


class Mutation:
    """The poisoned report: its file name (without .json) and bytes; shown short when it fails
    (hypothesis prints a dataclass field by field: the whole report)."""

    def __init__(self, what: str, name: bytes, body: bytes) -> None:
        self.what, self.name, self.body = what, name, body

    def __repr__(self) -> str:
        return f"Mutation({self.what!r:.300}, name={self.name!r}, {len(self.body)} bytes)"


@st.composite
def mutations(draw: st.DrawFn) -> Mutation:
    doc = _reports()[2]
    paths = _paths(doc)
    kind = draw(st.sampled_from(["value", "nest", "number", "schema", "name", "encoding", "bytes"]))
    name, what = VICTIM.encode(), kind
    if kind in ("value", "nest", "number"):
        where = paths if kind != "number" else [
            p for p in paths if p and isinstance(_get(doc, p), int | float)]
        path = where[draw(st.integers(0, len(where) - 1))]
        value = draw({"value": values, "nest": nested, "number": numbers}[kind])
        doc = _set(doc, path, value)
        what = f"{kind} at {'/'.join(map(str, path))}: {value!r:.200}"
    elif kind == "schema":
        doc["schema"] = "nodecert-fleet"
    elif kind == "name":
        name = draw(st.sampled_from(NAMES))
    elif kind == "bytes":
        return Mutation(kind, name, draw(st.binary(max_size=64)))
    try:
        body = json.dumps(doc, allow_nan=True, ensure_ascii=draw(st.booleans()))
    except (TypeError, ValueError, RecursionError):
        body = "{}"
    if kind == "encoding":
        encoding = draw(st.sampled_from(ENCODINGS))
        return Mutation(f"encoding {encoding}", name, body.encode(encoding, "replace"))
    return Mutation(what, name, body.encode("utf-8", "surrogatepass"))


def _get(doc: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        doc = doc[part]
    return doc


def _files(root: Path) -> set[str]:
    return {os.path.relpath(os.path.join(d, f), root) for d, _, names in os.walk(root) for f in names}


@PROFILE
@given(mutation=mutations(), jobs=st.sampled_from(["1", "2"]))
# two findings of the third hostile-input review, always tried: a duration keeping the report
# fresh for ever, a file name that is not UTF-8 (the history and Prometheus could not write it)
@example(mutation=Mutation("duration_s 1e300", VICTIM.encode(), json.dumps(
    {**_reports()[2], "duration_s": 1e300}).encode()), jobs="2")
@example(mutation=Mutation("name", b"node\xff\xfe", json.dumps(_reports()[2]).encode()), jobs="1")
def test_one_poisoned_report_never_takes_the_fleet_down(mutation: Mutation, jobs: str,
                                                        tmp_path_factory) -> None:
    name, body = mutation.name, mutation.body
    tmp = tmp_path_factory.mktemp("prop")
    run = tmp / "reports" / "run"
    run.mkdir(parents=True)
    for doc in _reports():
        if doc["host"] != VICTIM:
            (run / f"{doc['host']}.json").write_text(json.dumps(doc))
    with open(os.path.join(os.fsencode(run), name + b".json"), "wb") as f:
        f.write(body)
    before = _files(tmp)
    out = tmp / "out"
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["report", str(run), "--jobs", jobs, "--json", str(out / "fleet.json"),
                     "--junit", str(out / "fleet.xml"), "--html", str(out / "fleet.html"),
                     "--prometheus-dir", str(out / "prom"), "--prometheus-host-files"])
    assert "Traceback" not in err.getvalue(), err.getvalue()
    assert code in (0, 1), err.getvalue()

    # no file outside the output paths (the history beside the reports directory is one)
    written = _files(tmp) - before
    assert all(p.startswith(f"out{os.sep}") or p.startswith(f"reports{os.sep}history.sqlite")
               for p in written), written

    fleet = json.loads((out / "fleet.json").read_text(),
                       parse_constant=lambda c: pytest.fail(f"{c} in fleet.json"))
    hosts = {h["host"]: h for h in fleet["hosts"]}
    for host in HEALTHY:
        assert hosts[host]["status"] == "PASS", hosts[host]
    poisoned = {h: e for h, e in hosts.items() if h not in HEALTHY}
    if not poisoned:  # only the fleet's own summary is skipped
        assert name == b"fleet" and b"nodecert-fleet" in body
    else:
        [(host, entry)] = poisoned.items()
        assert entry["status"] == "ERROR" or entry["summary"] is not None, entry
        # named after its file (the report's own `host` is only its hostname), or escaped
        assert host == os.fsdecode(name) or entry["status"] == "ERROR", entry

    ET.parse(out / "fleet.xml")
    outputs = [out / "fleet.json", out / "fleet.xml", out / "fleet.html", *sorted((out / "prom").iterdir())]
    for path in outputs:
        data = path.read_bytes()
        data.decode("utf-8")
        for raw in RAW_UNSAFE:
            assert raw not in data, (path.name, raw)
