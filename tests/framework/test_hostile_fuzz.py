"""Fuzzing the three places hostile text enters: a scenario file (`python -m checks --simulate`),
the reports directory (`python -m checks.fleet report`) and the kernel log (the xid/sxid/AER
checks, through the CLI only). Whatever hypothesis generates, the answer is exit 0 or 1 with a
report, or exit 2 with exactly one line: never a traceback, never a hang (each example has a
deadline, the test a pytest timeout). Few examples and a fixed seed: this runs in `make test`."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import math
import tempfile
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from checks.devtools import synthetic
from checks.fleet.fleet_cli import main as fleet_main
from checks.node import node_cli

# The deadline only catches a hang (an example takes well under a second on an idle machine; the
# shared test machine can be 50x slower); pytest-timeout bounds the whole test.
FUZZ = settings(max_examples=12, deadline=timedelta(seconds=120), derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
pytestmark = pytest.mark.timeout(600)

# Text with what broke things before: control characters, lone surrogates, rich markup, brackets,
# commas, path parts, NaN spellings, huge numbers.
HOSTILE_WORDS = ["[/dev/nvidia4]", "[bold]", "\x1b[2J", "\x00", "\ud800", "../", "gpu[001-512]",
                 "ALL", "a,b", "NaN", "-inf", "1e309", "0x", "%s", "{}", "&a", "*a", "\u202e"]
text = st.one_of(st.text(max_size=40), st.sampled_from(HOSTILE_WORDS),
                 st.lists(st.sampled_from(HOSTILE_WORDS), max_size=4).map("".join))
scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                    st.floats(allow_nan=True, allow_infinity=True), text)
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.one_of(text, st.integers(0, 9)), inner, max_size=4)),
    max_leaves=12)


def _quiet(fn: Callable[[], int]) -> tuple[int, str]:
    """Run a main(); an exception escaping it is the failure this file looks for."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = fn()
    return code, err.getvalue()


def _judge(code: int, err: str) -> None:
    assert "Traceback" not in err, err
    assert code in (0, 1, 2), code
    if code == 2:
        assert len(err.strip().splitlines()) == 1 and err.startswith("error: "), err


def _simulate(doc: Any, *extra: str, raw: str | None = None) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fuzz.yaml"
        if raw is None:
            try:
                raw = yaml.safe_dump(doc, allow_unicode=True)
            except yaml.YAMLError:
                return  # not representable as YAML (a lone surrogate): nothing to feed
        path.write_text(raw, errors="surrogateescape")
        out = Path(tmp) / "report.json"
        code, err = _quiet(lambda: node_cli.main(["--simulate", str(path), "--level", "quick",
                                                  "--json", str(out), "-q", *extra]))
        _judge(code, err)
        if code in (0, 1):
            assert json.loads(out.read_text())["exit_code"] == code


SECTIONS = ["host", "driver", "gpu_defaults", "gpus", "nvswitches", "torch", "measurements", "rdma",
            "gpu_overrides", "description", "extends"]


@FUZZ
@given(section=st.sampled_from(SECTIONS), value=values)
def test_fuzz_scenario_sections(section: str, value: Any) -> None:
    _simulate({"description": "fuzz", "extends": "h100-sxm-8x-healthy", section: value})


@FUZZ
@given(key=st.sampled_from(["env", "os_release", "kernel", "memlock", "services", "modules",
                            "numa_nodes", "imex_nodes", "shm_bytes", "cpu_count", "secure_boot"]),
       value=values)
def test_fuzz_scenario_host_facts(key: str, value: Any) -> None:
    _simulate({"description": "fuzz", "extends": "h100-sxm-8x-healthy", "host": {key: value}})


@FUZZ
@given(raw=st.one_of(st.text(max_size=200), st.lists(st.sampled_from(
    ["a: &x [1, 2]", "b: *x", "c: *y", "- [", "{", "extends: h100-sxm-8x-healthy", "\t",
     "  - !!python/object:os.system", "host: {env: {NCCL_DEBUG: INFO}}", "gpus: 8", "description: x"]),
    max_size=8).map("\n".join)))
def test_fuzz_scenario_text(raw: str) -> None:
    _simulate(None, raw=raw)


XID_PARTS = ["NVRM: Xid (PCI:0000:3a:00): ", "NVRM: Xid (PCI:0000:3a:00.0): ",
             "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): ", "pcieport 0000:00:01.0: AER: ",
             "Corrected error received: ", "Uncorrected (Fatal) error received: ",
             "79, pid=1, GPU has fallen off the bus.", "48, ", "13, Graphics Exception", "[   12.5] ",
             "0000:3a:00.0", "severity=Corrected, type=Physical Layer", "12028, Non-fatal",
             "999999999999999999999, ", "-1, ", "ch 0", "\x00", "[/dev/nvidia4]"]


@FUZZ
@given(lines=st.lists(st.one_of(
    text, st.lists(st.sampled_from(XID_PARTS), min_size=1, max_size=5).map("".join)), max_size=12))
def test_fuzz_kernel_log(lines: list[str]) -> None:
    _simulate({"description": "fuzz", "extends": "h100-sxm-8x-healthy",
               "host": {"kernel_log": lines}}, "--only", "xid-events,nvswitch-sxid,pcie-aer")


_BASE: list[dict[str, Any]] = []


def _reports() -> list[dict[str, Any]]:
    if not _BASE:
        _BASE.extend(synthetic.build(3, base=synthetic.base_report("h100-sxm-8x-healthy"), run_id="fz"))
    return copy.deepcopy(_BASE)


def _paths(doc: Any, where: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [where]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*where, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc[:3]):
            out += _paths(v, (*where, i))
    return out


def _set(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    node = doc
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return doc


@FUZZ
@given(pick=st.integers(0, 10**6), value=values, raw=st.none() | st.binary(max_size=64))
def test_fuzz_report_loader(pick: int, value: Any, raw: bytes | None) -> None:
    docs = _reports()
    victim = docs[1]
    paths = _paths(victim)
    victim = _set(victim, paths[pick % len(paths)], value)
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        run.mkdir()
        for doc in (docs[0], docs[2]):
            (run / f"{doc['host']}.json").write_text(json.dumps(doc))
        target = run / "node0001.json"
        if raw is not None:
            target.write_bytes(raw)
        else:
            try:
                target.write_text(json.dumps(victim, allow_nan=True), errors="surrogatepass")
            except (TypeError, ValueError):
                target.write_text("{}")
        out = Path(tmp) / "fleet.json"
        code, err = _quiet(lambda: fleet_main(["report", str(run), "--no-history", "--json", str(out),
                                               "--junit", str(Path(tmp) / "f.xml"),
                                               "--html", str(Path(tmp) / "f.html")]))
        _judge(code, err)
        assert code in (0, 1), err  # one bad report never stops the fleet report
        fleet = {h["host"]: h for h in json.loads(out.read_text())["hosts"]}
        assert fleet["node0000"]["status"] == fleet["node0002"]["status"] == "PASS"
        assert "node0001" in fleet
        assert all(not isinstance(v, float) or math.isfinite(v) for v in _leaves(fleet))


def _leaves(doc: Any) -> list[Any]:
    if isinstance(doc, dict):
        return [x for v in doc.values() for x in _leaves(v)]
    if isinstance(doc, list):
        return [x for v in doc for x in _leaves(v)]
    return [doc]


_XPLAN = {"mode": "all", "busbw_rule": {"floor_gbs": 1.0, "pct": 10},
          "rounds": [[{"id": "g0", "hosts": ["node0000", "node0001"], "rail": None}]]}
_XNODE = {"checks": [{"id": "xhost-collective", "code": "XHOST001",
                      "results": [{"status": "PASS", "message": "ok", "details": {"group": "g0"}}]}]}


@FUZZ
@given(which=st.sampled_from(["plan.json", "g0/node0000.json"]), pick=st.integers(0, 10**6), value=values)
def test_fuzz_crosshost_files(which: str, pick: int, value: Any) -> None:
    """The cross-host stage's plan and node reports, one value replaced anywhere: the fleet is
    still reported for every host (the stage at worst not merged, with one warning line)."""
    files = {"plan.json": copy.deepcopy(_XPLAN), "g0/node0000.json": copy.deepcopy(_XNODE),
             "g0/node0001.json": copy.deepcopy(_XNODE)}
    paths = _paths(files[which])
    files[which] = _set(files[which], paths[pick % len(paths)], value)
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        (run / "crosshost" / "g0").mkdir(parents=True)
        for doc in _reports():
            (run / f"{doc['host']}.json").write_text(json.dumps(doc))
        for name, doc in files.items():
            try:
                (run / "crosshost" / name).write_text(json.dumps(doc, allow_nan=True), errors="surrogatepass")
            except (TypeError, ValueError):
                (run / "crosshost" / name).write_text("{}")
        out = Path(tmp) / "fleet.json"
        code, err = _quiet(lambda: fleet_main(["report", str(run), "--no-history", "--json", str(out)]))
        assert "Traceback" not in err and code in (0, 1), err
        hosts = {h["host"] for h in json.loads(out.read_text())["hosts"]}
        assert hosts == {"node0000", "node0001", "node0002"}


HISTORY_CELLS = {  # table: columns a value may be replaced in (every column of the schema)
    "runs": ["run_id", "recorded_at", "fingerprint", "seq"],
    "gpus": ["run_id", "host", "gpu_uuid", "gpu_index", "status"],
    "results": ["run_id", "host", "check_id", "gpu_uuid", "gpu_index", "status", "message"],
    "figures": ["run_id", "host", "check_id", "gpu_uuid", "name", "value"],
    "hosts": ["run_id", "host", "report_run_id", "started_at", "finished_at"],
}
sql_values = st.one_of(st.none(), st.integers(-2**63, 2**63 - 1),
                       st.floats(allow_nan=True, allow_infinity=True), text, st.binary(max_size=16))
_HISTORY: dict[str, bytes] = {}


def _history_bytes() -> bytes:
    """A history of two runs of the synthetic fleet, node0001's GPU 5 failing in the second."""
    if not _HISTORY:
        from checks.devtools.synthetic import Broken
        from checks.fleet import history
        from checks.report import aggregate

        base = synthetic.base_report("h100-sxm-8x-healthy")
        ecc = Broken("node0001", "ecc-errors", gpu=5, message="GPU5: uncorrectable ECC")
        with tempfile.TemporaryDirectory() as tmp:
            db = Path(tmp) / "history.sqlite"
            for run_id, broken in (("h1", []), ("h2", [ecc])):
                docs = synthetic.build(3, base=base, run_id=run_id, broken=broken)
                with history.History(db) as store:
                    store.record(aggregate.from_reports(docs, run_id=run_id), run_id)
            import sqlite3

            con = sqlite3.connect(db)
            con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            con.execute("PRAGMA journal_mode = DELETE")
            con.close()
            _HISTORY["db"] = db.read_bytes()
    return _HISTORY["db"]


@FUZZ
@given(table=st.sampled_from(sorted(HISTORY_CELLS)), pick=st.integers(0, 10**6),
       column_pick=st.integers(0, 10**6), value=sql_values, insert=st.booleans())
# what broke the old reader: a figure that is text, a lemon's host that is no text, a finish time
# that is text, an infinite figure
@example(table="figures", pick=0, column_pick=5, value="abc", insert=False)
@example(table="results", pick=0, column_pick=1, value=None, insert=True)
@example(table="results", pick=0, column_pick=1, value=7, insert=True)
@example(table="hosts", pick=0, column_pick=4, value="yesterday", insert=False)
@example(table="figures", pick=3, column_pick=5, value=float("inf"), insert=False)
def test_fuzz_history(table: str, pick: int, column_pick: int, value: Any, insert: bool) -> None:
    """One value of the run history replaced, or a row added with it (a history written by
    something else, or edited): the fleet is reported (exit 0 or 1) or refused with one line
    (exit 2); never a traceback, and fleet.json stays strict JSON."""
    import sqlite3

    columns = HISTORY_CELLS[table]
    column = columns[column_pick % len(columns)]
    if isinstance(value, str):
        value = value.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    with tempfile.TemporaryDirectory() as tmp:
        reports = Path(tmp) / "reports"
        run = reports / "h3"
        run.mkdir(parents=True)
        for doc in _reports():
            (run / f"{doc['host']}.json").write_text(json.dumps(doc))
        db = reports / "history.sqlite"
        db.write_bytes(_history_bytes())
        con = sqlite3.connect(db)
        rowids = [r[0] for r in con.execute(f"SELECT rowid FROM {table}")]
        if insert or not rowids:
            existing = con.execute(f"SELECT {', '.join(columns)} FROM {table} "
                                   "ORDER BY rowid DESC LIMIT 1").fetchone()
            row = dict(zip(columns, existing or [None] * len(columns), strict=True))
            row[column] = value
            if table == "runs":
                row.pop("seq")
            with contextlib.suppress(sqlite3.Error):
                con.execute(f"INSERT INTO {table} ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})",
                            list(row.values()))
        else:
            with contextlib.suppress(sqlite3.Error):
                con.execute(f"UPDATE {table} SET {column} = ? WHERE rowid = ?",
                            (value, rowids[pick % len(rowids)]))
        con.commit()
        con.close()
        out = Path(tmp) / "fleet.json"
        code, err = _quiet(lambda: fleet_main(["report", str(run), "--history", str(db), "-q",
                                               "--json", str(out)]))
        _judge(code, err)
        if code in (0, 1):
            json.loads(out.read_text(), parse_constant=lambda c: pytest.fail(f"{c} in fleet.json"))
