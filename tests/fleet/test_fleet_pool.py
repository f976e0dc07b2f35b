"""The controller reads a run's reports in a pool of processes (checks.supervise.pool) and keeps
each host's summary packed (checks.report.summary.Packed): the outputs are the same as when one
process reads them, whatever the number of processes."""

from __future__ import annotations

import contextlib
import functools
import json
import math
import multiprocessing
import os
import re
import signal
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from checks.devtools import synthetic
from checks.devtools.synthetic import Broken, Slow
from checks.fleet.fleet_cli import main
from checks.report import aggregate, load, summary
from checks.supervise import pool


def _pid(_: int) -> int:
    return os.getpid()


def _slow_pid(_: int) -> int:  # long enough that a process forked for the map takes some items
    import time

    time.sleep(0.005)
    return os.getpid()


def test_ordered_map_runs_in_other_processes_and_keeps_the_order() -> None:
    numbers = range(-40, 40)
    assert list(pool.ordered_map(abs, numbers, workers=3, chunksize=4)) == [abs(i) for i in numbers]
    # two processes share the work: one forked for the map and the caller (no pickling of what it runs)
    pids = list(pool.ordered_map(_slow_pid, range(64), workers=2, chunksize=2))
    assert len(set(pids)) == 2 and os.getpid() in pids
    assert all(len(set(pids[i:i + 2])) == 1 for i in range(0, 64, 2))  # a chunk is one process's


def _fails_when_forked(x: int) -> int:
    if os.getpid() != _CALLER[0]:
        raise ValueError(f"item {x} failed in a forked reader")
    return _slow_pid(x) and x


_CALLER = [os.getpid()]


def test_what_a_forked_reader_raises_is_raised_in_the_caller_and_ends_the_others() -> None:
    _CALLER[0] = os.getpid()
    with pytest.raises(ValueError, match="failed in a forked reader"):
        list(pool.ordered_map(_fails_when_forked, range(40), workers=2, chunksize=1))
    assert not multiprocessing.active_children()


def _dies(x: int) -> int:
    if os.getpid() != _CALLER[0]:
        os._exit(9)  # as the kernel's OOM killer would end it
    return _slow_pid(x) and x


def test_a_reader_that_dies_is_one_line_not_a_hang() -> None:
    _CALLER[0] = os.getpid()
    with pytest.raises(pool.WorkerDied, match=r"^a reading process ended before item \d+ of 40"):
        list(pool.ordered_map(_dies, range(40), workers=2, chunksize=1))
    assert not multiprocessing.active_children()


def test_the_report_command_says_in_one_line_that_a_reader_died(
        run_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    real, caller = aggregate.read_one, os.getpid()

    def dies_when_forked(path: Path) -> Any:
        if os.getpid() != caller:
            os._exit(9)
        return _slow_pid(0) and real(path)

    monkeypatch.setattr(aggregate, "read_one", dies_when_forked)
    assert main(["report", str(run_dir), "-q", "--jobs", "2", "--no-history"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: a reading process ended before item") and "\n" not in err
    assert not multiprocessing.active_children()


def test_a_caller_that_stops_early_ends_the_forked_readers() -> None:
    results = pool.ordered_map(_slow_pid, range(400), workers=3, chunksize=1)
    assert next(results) and multiprocessing.active_children()
    results.close()
    assert not multiprocessing.active_children()
    assert set(pool.ordered_map(_pid, range(8), workers=1)) == {os.getpid()}  # one: no pool


def test_a_pool_keeps_its_processes_for_later_maps() -> None:
    """The fleet CLI reads and then builds the JUnit suites with the processes forked for the
    reading (while the controller was small), not with copies of the grown controller."""
    with pool.Pool(2) as workers:
        # both forked as the block starts; a map may find one of them faster than the other
        forked = {child.pid for child in multiprocessing.active_children()}
        first = set(workers.map(_slow_pid, range(16), 1))
        big = bytearray(64 << 20)  # the controller grows
        later = set(workers.map(_slow_pid, range(16), 1))
        del big
    assert len(forked) == 2 and os.getpid() not in forked
    assert first and later and first | later <= forked  # no process forked after the block began
    with pool.Pool(1) as inline:
        assert set(inline.map(_pid, range(4))) == {os.getpid()}


def _ignores_sigint(x: int) -> tuple[int, bool]:
    return _slow_pid(x), signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def test_ctrl_c_is_left_to_the_caller() -> None:
    """The pool's processes ignore SIGINT (the terminal sends it to the whole group): the
    controller stops the pool and says "interrupted", no worker prints a traceback."""
    # The parent's own disposition is set here: a shell that starts a job in the background (a CI
    # runner) leaves SIGINT ignored in every process below it, the pool's workers included.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        assert not _ignores_sigint(0)[1]
        seen = dict(pool.ordered_map(_ignores_sigint, range(64), workers=3, chunksize=1))
        forked = {pid: ignores for pid, ignores in seen.items() if pid != os.getpid()}
        assert forked and all(forked.values())  # the caller's own items: its own Ctrl-C
    finally:
        signal.signal(signal.SIGINT, previous)


def test_workers_are_bounded_by_the_cpus_and_the_work() -> None:
    assert pool.workers_for(10) == 1  # not worth a process
    assert pool.workers_for(pool.MIN_PER_WORKER * 2, limit=1) == 1
    many = pool.workers_for(1_000_000)
    assert pool.processes(2, 50) == 2 and pool.processes(10_000, 500) == pool.MAX_ASKED  # --jobs bounded
    assert pool.processes(10_000) == pool.workers_for(10_000) and pool.processes(5, 0) == 1
    assert 1 <= many <= min(pool.usable_cpus(), pool.MAX_WORKERS)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory, h100_report: dict[str, Any]) -> Path:
    """20 hosts: a straggler, two failed checks, a lost GPU, an odd digest, an unreadable file."""
    reports = synthetic.build(18, base=h100_report, slow=[Slow("node0002", "matmul_bf16_tflops", 0.8, gpu=1)],
                              broken=[Broken("node0004", "gpu-count"),
                                      Broken("node0005", "ecc-errors", gpu=2)])
    synthetic.add_digests(reports[7], {3: "f" * 64}, default="0" * 64)
    for r in reports[:7] + reports[8:]:
        synthetic.add_digests(r, {}, default="0" * 64)
    reports += synthetic.build(1, base=synthetic.base_report("node-gpu-lost"))
    reports[-1]["host"] = "node0019"
    directory = synthetic.write(reports, tmp_path_factory.mktemp("pool") / "run-1")
    (directory / "node0020.json").write_text('{"schema": "nodecert-report", truncated')
    return directory


def _outputs(run: Path, out: Path, jobs: str) -> dict[str, Any]:
    out.mkdir()
    rc = main(["report", str(run), "-q", "--history", str(out / "h.sqlite"), "--jobs", jobs,
               "--json", str(out / "fleet.json"),
               "--junit", str(out / "junit.xml"), "--html", str(out / "fleet.html"),
               "--prometheus-dir", str(out / "prom"), "--prometheus-host-files"])
    fleet = json.loads((out / "fleet.json").read_text())
    fleet.pop("generated_at")
    html = re.sub(r"generated [0-9T:-]+Z", "generated (time)", (out / "fleet.html").read_text())
    with contextlib.closing(sqlite3.connect(out / "h.sqlite")) as db:  # its rows built in the pool too
        recorded = {table: db.execute(f"SELECT * FROM {table} ORDER BY rowid").fetchall()
                    for table in ("gpus", "results", "figures", "hosts")}
    return {"rc": rc, "fleet": fleet, "junit": (out / "junit.xml").read_bytes(), "history": recorded,
            "html": html,
            "prom": {p.name: p.read_bytes() for p in sorted((out / "prom").iterdir())
                     if p.name != "nodecert-fleet.prom"}}


def test_pooled_and_single_process_reading_give_the_same_outputs(run_dir: Path, tmp_path: Path) -> None:
    single, pooled = _outputs(run_dir, tmp_path / "one", "1"), _outputs(run_dir, tmp_path / "three", "3")
    assert single["rc"] == pooled["rc"] == 1
    assert single["fleet"] == pooled["fleet"]
    statuses = {h["host"]: h["status"] for h in single["fleet"]["hosts"]}
    assert statuses["node0004"] == statuses["node0005"] == statuses["node0019"] == "FAIL"
    assert statuses["node0020"] == "ERROR" and statuses["node0002"] == "FAIL"  # straggler
    assert [o["host"] for o in single["fleet"]["digests"]["odd"]] == ["node0007"]
    assert single["junit"] == pooled["junit"]
    assert single["prom"] == pooled["prom"] and len(single["prom"]) == 19  # one per readable report
    assert single["html"] == pooled["html"]
    assert single["history"] == pooled["history"] and len(single["history"]["hosts"]) == 19
    assert ("node0004", "gpu-count") in {(r[1], r[2]) for r in single["history"]["results"]}


def test_a_packed_summary_reads_as_the_summary_it_packs(h100_report: dict[str, Any]) -> None:
    whole = json.loads(json.dumps(h100_report))
    top = summary.Compactor().top(whole)
    compact = {**top, "checks": whole["checks"]}
    assert dict(summary.Packed.of(top, compact["checks"])) == compact
    compact["checks"][0]["results"][0]["value"] = math.nan
    packed = summary.Packed.of(top, compact["checks"])
    checks = packed["checks"]
    assert math.isnan(checks[0]["results"][0]["value"])  # kept bit for bit, not as null
    checks[0]["results"][0]["value"] = 1.0
    assert math.isnan(packed["checks"][0]["results"][0]["value"])  # each read is a fresh copy
    assert packed["verdict"] == whole["verdict"] and "checks" in packed and len(packed) == len(compact)
    assert summary.holds_checks(packed) and not summary.holds_checks(summary.Packed.of(top, []))
    renamed = packed.with_host("other")
    assert renamed["host"] == "other" and packed["host"] == whole["host"]


def test_a_summary_keeps_the_report_text_only_as_the_loader_read_it(tmp_path: Path,
                                                                   h100_report: dict[str, Any]) -> None:
    """The checks are held as the file's own JSON text (LZ4) when orjson reads it into the report
    unchanged; a string the loader sanitised, or a text json read instead, holds the checks as
    read (a pickle), so each read gives what the loader gave."""
    whole = json.loads(json.dumps(h100_report))
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps(whole, indent=2))
    assert load.read(plain) is not None and load.read(plain).text is None  # not asked for
    item = load.read(plain, keep_text=True)
    assert item is not None and item.report is not None and item.text == plain.read_bytes()
    packed = summary.Compactor().pack(item.report, item.text)
    assert packed._text and len(packed._blob) * 4 < len(item.text)
    assert packed["checks"] == whole["checks"] and packed["checks"] is not packed["checks"]
    assert summary.side_checks(packed) == [  # the fabric's checks apart, reduced
        {**c, "results": [summary._slim(r, {}.setdefault) for r in c["results"]]}
        for c in whole["checks"] if c["id"] in summary.SIDE_CHECKS]

    whole["checks"][0]["results"][0]["message"] = "bell \x07 here"
    whole["checks"][1]["results"][0]["details"] = {"n": 2**60}  # past 53 bits: json reads it
    for name, changed in (("bell", 0), ("long", 1)):
        edited = json.loads(json.dumps(whole))
        if name == "bell":
            edited["checks"][1]["results"][0]["details"] = {}
        else:
            edited["checks"][0]["results"][0]["message"] = "plain"
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(edited))
        item = load.read(path, keep_text=True)
        assert item is not None and item.report is not None and item.text is None, name
        packed = summary.Compactor().pack(item.report, item.text)
        assert not packed._text and packed["checks"] == item.report["checks"], name
        assert packed["checks"][changed]["results"][0] == item.report["checks"][changed]["results"][0]
    assert item.report["checks"][1]["results"][0]["details"]["n"] == 2**60


def test_the_fleet_holds_packed_summaries(run_dir: Path) -> None:
    fleet = aggregate.load(run_dir)
    kept = [h.report for h in fleet.hosts if h.report is not None]
    assert len(kept) == 19 and all(isinstance(r, summary.Packed) for r in kept)
    assert all(r["host"] == h.host for h in fleet.hosts if (r := h.report) is not None)


def test_jobs_below_one_is_a_usage_error(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(run_dir), "--no-history", "--jobs", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --jobs 0") and err.count("\n") == 1


def test_junit_and_fleet_json_are_written_host_by_host_as_whole_trees_were(run_dir: Path,
                                                                          tmp_path: Path) -> None:
    from checks.fleet import fleet_junit
    from checks.render import junit

    fleet = aggregate.load(run_dir, expected_hosts=["node0021"], host_errors={"node0022": "unreachable"})
    pieces = list(fleet_junit.chunks(fleet))
    assert len(pieces) == len(fleet.hosts) + 2  # the declaration, one piece per host, the end
    whole = junit.write_tree(fleet_junit.to_xml(fleet), tmp_path / "whole.xml").read_bytes()
    assert b"".join(pieces) == whole
    assert fleet_junit.write(fleet, tmp_path / "streamed.xml").read_bytes() == whole
    in_pool = functools.partial(pool.ordered_map, workers=3, chunksize=2)  # suites built in 3 processes
    assert fleet_junit.write(fleet, tmp_path / "pooled.xml", in_pool).read_bytes() == whole
    for extra in ({}, {"outside_inventory": ["intruder7"]}):
        assert "".join(fleet.json_chunks(extra)) == json.dumps({**fleet.to_dict(), **extra}, indent=2) + "\n"
    fleet.hosts = []
    assert "".join(fleet.json_chunks()) == json.dumps(fleet.to_dict(), indent=2) + "\n"
    assert b"".join(fleet_junit.chunks(fleet)) == junit.write_tree(fleet_junit.to_xml(fleet),
                                                                    tmp_path / "empty.xml").read_bytes()


def test_a_report_is_read_whole_whatever_its_size(tmp_path: Path) -> None:
    from checks.report import load

    for size in (0, 1, (1 << 16) - 1, 1 << 16, 200_001):
        path = tmp_path / f"r{size}.json"
        path.write_bytes(bytes(range(256)) * (size // 256) + b"x" * (size % 256))
        assert load.read_regular(path) == path.read_bytes()


def _sleep_then_echo(x: int) -> int:
    import time

    time.sleep(60)
    return x


def test_workers_end_with_a_killed_caller(tmp_path) -> None:
    """A caller killed outright (cron's timeout, slurmd: no shutdown runs) leaves no worker behind
    waiting on the pool's queue: the kernel ends them with it."""
    import subprocess
    import sys
    import time

    script = tmp_path / "caller.py"
    script.write_text(
        "import os, sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from checks.supervise import pool\n"
        "import test_fleet_pool as t\n"
        "for _ in pool.ordered_map(t._sleep_then_echo, range(6), workers=3, chunksize=1):\n"
        "    pass\n"
    )
    caller = subprocess.Popen([sys.executable, str(script)])
    try:
        deadline = time.monotonic() + 30
        children: list[int] = []
        while time.monotonic() < deadline and len(children) < 2:
            time.sleep(0.2)
            listed = subprocess.run(["pgrep", "-P", str(caller.pid)], capture_output=True, text=True)
            children = [int(p) for p in listed.stdout.split()]
        assert len(children) >= 2, children
        caller.kill()
        caller.wait(10)
        deadline = time.monotonic() + 10
        alive = children
        while time.monotonic() < deadline and alive:
            time.sleep(0.2)
            alive = [p for p in alive if os.path.exists(f"/proc/{p}") and
                     not Path(f"/proc/{p}/stat").read_text().split(") ")[1].startswith("Z")]
        assert alive == [], f"workers left behind: {alive}"
    finally:
        caller.kill()
