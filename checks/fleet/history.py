"""Run history in SQLite (reports/history.sqlite by default; no server) and the lemon query.

Each fleet run appends: one row per GPU seen (host, UUID, index, worst status); one row per
(host, check, GPU) that did not pass (WARN, FAIL, ERROR; GPU uuid NULL for host-level results),
straggler verdicts included as check `straggler:<check>/<figure>`, and a host without a readable
report as check `report`; and every figure value. Passing results are not stored one by one: the
reports themselves stay in reports/<run-id>/, and 1 000 hosts would add ~20 MB per run.
One row per host with a readable report keeps which report it was (its own run id and start
time) and when it finished: the hosts of the last runs, and when each last reported, for the
hosts whose report stopped coming (fleet_cli), and the identity of each report.

A run is keyed by what it holds, not by the directory it was read from: its key is the run id,
and a fingerprint of its reports (host, report run id, start time) tells a run recorded again
(same reports: it replaces the earlier recording) from a new run that reuses the run id or the
directory (other reports: recorded beside it as `<run id>@<newest report's start>`; run_key). A
report already counted in an earlier run (a host that stopped reporting into a reused directory
leaves its old file behind) is not counted again: stale_reports names those hosts.

Drift verdicts (drift.py) are stored like straggler ones, as check `drift:<check>/<figure>`, and
digest mismatches (digest.py) as check `digest`, so a GPU that keeps drifting or computing other
bits becomes a lemon too.

Several verify runs may record at once, and a run may be killed mid-write: the database runs in
WAL mode with a busy timeout, and each run is written in one `BEGIN IMMEDIATE` transaction (the
write lock is taken up front, so two writers never deadlock upgrading a read lock). A writer
killed with SIGKILL leaves its transaction uncommitted in the WAL, which the next connection
rolls back: the run is either wholly there or absent.

A lemon is a GPU, followed by UUID wherever it moved, that had a FAIL or ERROR result (a
straggler FAIL included) in at least N of the last M runs recorded (default 2 of 5). Left out:
the failures of a configuration event (one check failing on at least half of a run's GPUs:
CONFIG_EVENT_FRACTION) and whatever an operator quarantined (checks.fleet.history_repair, which
also forgets runs).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import math
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from checks import safeio
from checks.model import Status
from checks.report.aggregate import Fleet
from checks.report.findings import Lemon

BUSY_TIMEOUT_S = 60.0  # how long a writer waits for another run's transaction to finish
DEFAULT_FAILURES = 2
DEFAULT_RUNS = 5
BAD = ("FAIL", "ERROR")
PROBLEMS = ("WARN", *BAD)
SeriesKey = tuple[str, str, str]  # (GPU UUID or "host:<name>", check id, figure name)

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id      TEXT NOT NULL UNIQUE,
    recorded_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS gpus (
    run_id    TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
    host      TEXT NOT NULL,
    gpu_uuid  TEXT NOT NULL,
    gpu_index INTEGER,
    status    TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS results (
    run_id    TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
    host      TEXT NOT NULL,
    check_id  TEXT NOT NULL,
    gpu_uuid  TEXT,
    gpu_index INTEGER,
    status    TEXT NOT NULL,
    message   TEXT
);
CREATE TABLE IF NOT EXISTS figures (
    run_id   TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
    host     TEXT NOT NULL,
    check_id TEXT NOT NULL,
    gpu_uuid TEXT,
    name     TEXT NOT NULL,
    value    REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS hosts (
    run_id        TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
    host          TEXT NOT NULL,
    report_run_id TEXT NOT NULL,  -- the run id inside the report ("" when it has none)
    started_at    TEXT NOT NULL,
    finished_at   REAL            -- Unix time, NULL without a readable start time
);
CREATE TABLE IF NOT EXISTS quarantine (
    run_id   TEXT NOT NULL,
    host     TEXT,            -- NULL: every host of the run
    gpu_uuid TEXT,            -- NULL: every GPU (of that host)
    reason   TEXT NOT NULL,
    at       TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS hosts_by_run ON hosts(run_id);
CREATE INDEX IF NOT EXISTS hosts_by_report ON hosts(host, report_run_id, started_at);
CREATE INDEX IF NOT EXISTS gpus_by_uuid ON gpus(gpu_uuid);
CREATE INDEX IF NOT EXISTS gpus_by_run ON gpus(run_id);
CREATE INDEX IF NOT EXISTS results_by_gpu ON results(gpu_uuid, status);
CREATE INDEX IF NOT EXISTS results_by_run ON results(run_id);
CREATE INDEX IF NOT EXISTS figures_by_run ON figures(run_id);
CREATE INDEX IF NOT EXISTS figures_by_check ON figures(check_id, name);
"""

# A row quarantined (checks.fleet.history_repair) counts for neither lemons nor baselines.
NOT_QUARANTINED = """NOT EXISTS (SELECT 1 FROM quarantine q WHERE q.run_id = {t}.run_id
    AND (q.host IS NULL OR q.host = {t}.host)
    AND (q.gpu_uuid IS NULL OR q.gpu_uuid = {t}.gpu_uuid))"""
# A configuration event: in one run, one check failed (FAIL or ERROR) on at least
# CONFIG_EVENT_FRACTION of the GPUs that run saw, and on at least CONFIG_EVENT_MIN_GPUS of them.
# GPUs do not break together: a wrong expectation pushed everywhere, a driver or firmware
# rollout, a broken shared filesystem do. Its failures count toward no GPU's lemon.
CONFIG_EVENT_FRACTION = 0.5
CONFIG_EVENT_MIN_GPUS = 2
CONFIG_EVENTS = """
run_gpus AS (SELECT g.run_id, COUNT(DISTINCT g.gpu_uuid) AS gpus
             FROM gpus g JOIN recent USING (run_id) GROUP BY g.run_id),
mass AS (
    SELECT r.run_id, r.check_id, COUNT(DISTINCT r.gpu_uuid) AS failed, run_gpus.gpus
    FROM results r JOIN run_gpus USING (run_id)
    WHERE r.gpu_uuid IS NOT NULL AND r.status IN ('FAIL', 'ERROR') AND """ + \
    NOT_QUARANTINED.format(t="r") + """
    GROUP BY r.run_id, r.check_id
    HAVING failed >= :min_gpus AND failed >= :fraction * run_gpus.gpus
)"""

LEMONS = """
WITH recent AS (SELECT run_id, seq FROM runs ORDER BY seq DESC LIMIT :runs),""" + CONFIG_EVENTS + """,
bad AS (
    SELECT r.gpu_uuid, r.run_id, r.host, r.check_id, recent.seq
    FROM results r JOIN recent USING (run_id)
    WHERE r.gpu_uuid IS NOT NULL AND r.status IN ('FAIL', 'ERROR') AND """ + \
    NOT_QUARANTINED.format(t="r") + """
      AND NOT EXISTS (SELECT 1 FROM mass m WHERE m.run_id = r.run_id AND m.check_id = r.check_id)
),
lemon AS (
    SELECT gpu_uuid, COUNT(DISTINCT run_id) AS failed_runs, group_concat(DISTINCT host) AS hosts,
           group_concat(DISTINCT check_id) AS checks, MAX(seq) AS last_seq
    FROM bad GROUP BY gpu_uuid HAVING failed_runs >= :failures
)
SELECT lemon.gpu_uuid, failed_runs,
       (SELECT COUNT(DISTINCT g.run_id) FROM gpus g JOIN recent USING (run_id)
         WHERE g.gpu_uuid = lemon.gpu_uuid) AS seen_runs,
       hosts, checks, runs.run_id
FROM lemon JOIN runs ON runs.seq = lemon.last_seq
ORDER BY failed_runs DESC, lemon.gpu_uuid
"""


def _series_key(key: Any, check_id: Any, name: Any) -> SeriesKey:
    return (_text(key, "figures.gpu_uuid"), _text(check_id, "figures.check_id"),
            _text(name, "figures.name"))


ReportId = tuple[str, str, str]  # (host, the report's own run id or "", its start time)


def report_ids(fleet: Fleet) -> dict[str, ReportId]:
    """Host → the identity of its readable report in this fleet run."""
    return {h.host: (h.host, str(h.report.get("run_id") or ""), str(h.report.get("started_at") or ""))
            for h in fleet.hosts if h.report is not None}


def fingerprint(fleet: Fleet, run_id: str) -> str:
    """What a run holds: its run id and the identity of every readable report."""
    text = json.dumps([run_id, sorted(report_ids(fleet).values())])
    return hashlib.sha256(text.encode()).hexdigest()


def _compact(stamp: str) -> str:
    """2026-12-01T16:30:05.123+00:00 → 20261201T163005Z (a run key suffix)."""
    try:
        when = dt.datetime.fromisoformat(stamp)
    except (TypeError, ValueError):
        return "".join(c for c in str(stamp) if c.isalnum())[:20] or "run"
    if when.tzinfo is not None:
        when = when.astimezone(dt.timezone.utc)
    return when.strftime("%Y%m%dT%H%M%SZ")


_SEVERITY = {str(s): s.severity for s in Status}  # a dict lookup, not two enum calls per result


def _worst(a: str, b: str) -> str:
    return a if _SEVERITY[a] >= _SEVERITY[b] else b


# one host's share of a recording: run id, host, its report (a summary), the reason it has none,
# when it finished
HostJob = tuple[str, str, Mapping[str, Any] | None, str | None, float | None]
Rows = list[tuple[str, tuple[Any, ...]]]
Mapper = Callable[[Callable[[HostJob], Rows], Iterable[HostJob]], Iterable[Rows]]


def _index(value: Any) -> int | None:
    """A GPU index as SQLite can store it: an integer of 64 bits (the loader refuses a report with
    a larger one), else none."""
    return value if type(value) is int and -(2**63) <= value < 2**63 else None


def host_rows(job: HostJob) -> Rows:
    """One host's rows, (table, row) in the order _rows gives them. Module-level, so that a
    process pool can build them (record's `map_`): a walk of every result of the host's checks,
    the controller's largest serial part of a recording."""
    run_id, host, report, reason, finished_at = job
    out: Rows = []
    worst: dict[tuple[str, str | None], tuple[int | None, str, str]] = {}
    gpus: dict[str, tuple[int | None, str]] = {}
    for chk in (report or {}).get("checks", []):
        for r in chk["results"]:
            dev = r.get("device") or {}
            uuid, status, index = dev.get("uuid"), r["status"], _index(dev.get("index"))
            if uuid:
                index, seen = gpus.get(uuid, (index, "SKIP"))
                gpus[uuid] = (index, _worst(seen, status))
            key = (chk["id"], uuid)
            if status in PROBLEMS and (key not in worst
                                       or _worst(worst[key][1], status) != worst[key][1]):
                worst[key] = (_index(dev.get("index")), status, r["message"])
            figures = (r.get("details") or {}).get("figures")
            for name, value in figures.items() if isinstance(figures, dict) else ():
                # NaN and infinities measured nothing: no figure (SQLite stores NaN as NULL);
                # stored as a float: REAL, and an integer past 64 bits would not bind
                if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
                    out.append(("figures", (run_id, host, chk["id"], uuid, name, float(value))))
    out.extend(("gpus", (run_id, host, uuid, index, status)) for uuid, (index, status) in gpus.items())
    out.extend(("results", (run_id, host, check_id, uuid, index, status, message))
               for (check_id, uuid), (index, status, message) in worst.items())
    if report is None:
        out.append(("results", (run_id, host, "report", None, None, "ERROR", reason)))
    else:
        out.append(("hosts", (run_id, host, str(report.get("run_id") or ""),
                              str(report.get("started_at") or ""), finished_at)))
    return out


def _rows(fleet: Fleet, run_id: str, map_: Mapper | None = None) -> Iterator[tuple[str, tuple[Any, ...]]]:
    """Every row of a recording; `map_` (the builtin map by default) may build the hosts' rows
    in other processes, in order."""
    jobs = ((run_id, e.host, e.report, e.reason, e.report_finished_at) for e in fleet.hosts)
    for rows in (map_ or map)(host_rows, jobs):
        yield from rows
    for s in fleet.stragglers:
        yield "results", (run_id, s.host, f"straggler:{s.check}/{s.name}", s.gpu.uuid if s.gpu else None,
                          s.gpu.index if s.gpu else None, s.status,
                          f"{s.deficit_pct:.1f} % from the fleet median")
    for d in fleet.drifts:
        yield "results", (run_id, d.host, f"drift:{d.check}/{d.name}", d.gpu.uuid if d.gpu else None,
                          d.gpu.index if d.gpu else None, d.status,
                          f"{d.deficit_pct:.1f} % below its own {d.baseline_kind} baseline")
    for odd in (fleet.digests.odd if fleet.digests else ()):
        yield "results", (run_id, odd.host, "digest", odd.gpu.uuid if odd.gpu else None,
                          odd.gpu.index if odd.gpu else None, odd.status, odd.message)


class HistoryError(sqlite3.DatabaseError):
    """The history holds a value nodecert never writes there (a database written by something
    else, or edited): one line; the fleet CLI prints it as a history database error, exit 2."""


def _bad(value: Any, where: str, kind: str) -> HistoryError:
    return HistoryError(f"{where} holds {value!r:.60}, not {kind}: not a history as nodecert writes it")


def _text(value: Any, where: str) -> str:
    """A TEXT cell read back: SQLite keeps whatever type was stored in any column."""
    if isinstance(value, str):
        return value
    raise _bad(value, where, "text")


def _number(value: Any, where: str) -> float:
    if isinstance(value, int | float) and math.isfinite(value):
        return float(value)
    raise _bad(value, where, "a finite number")


def _count(value: Any, where: str) -> int:
    if isinstance(value, int) and value >= 0:
        return value
    raise _bad(value, where, "a count")


class History:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        # As root, a history another user can write (or plant beside: SQLite's -wal file) is
        # refused: planted failures would make a healthy host's GPUs lemons (safeio.trust_problem).
        safeio.refuse_untrusted(self.path, "the history database")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: transactions are begun explicitly (BEGIN IMMEDIATE) below.
        self.db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        self.db.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        self.db.execute("PRAGMA journal_mode = WAL")
        self.db.execute("PRAGMA synchronous = FULL")
        self.db.execute("PRAGMA foreign_keys = ON")
        with self._write():
            for statement in SCHEMA.split(";"):
                if statement.strip():
                    self.db.execute(statement)
            columns = {row[1] for row in self.db.execute("PRAGMA table_info(runs)")}
            if "fingerprint" not in columns:  # a history written before runs had fingerprints
                self.db.execute("ALTER TABLE runs ADD COLUMN fingerprint TEXT")

    @contextlib.contextmanager
    def _write(self) -> Iterator[None]:
        """One write transaction, holding the write lock from its start."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> History:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run_key(self, fleet: Fleet) -> str:
        """The key this fleet run is recorded under: the key of an earlier recording of the same
        reports (recording again replaces it), else its run id, else, when that run id is taken
        by other reports (a reused directory or run id), `<run id>@<newest report's start>`."""
        base = fleet.run_id or fleet.generated_at
        print_ = fingerprint(fleet, base)
        same = self.db.execute("SELECT run_id FROM runs WHERE fingerprint = ? ORDER BY seq DESC",
                               (print_,)).fetchone()
        if same:
            return _text(same[0], "runs.run_id")
        taken = self.db.execute("SELECT fingerprint FROM runs WHERE run_id = ?", (base,)).fetchone()
        if taken is None or taken[0] is None:  # new, or recorded before fingerprints: replace
            return base
        starts = [h.report.get("started_at") for h in fleet.hosts if h.report is not None]
        stem = f"{base}@{_compact(max((str(s) for s in starts if s), default=fleet.generated_at))}"
        key, n = stem, 1
        while self.db.execute("SELECT 1 FROM runs WHERE run_id = ?", (key,)).fetchone():
            n += 1
            key = f"{stem}.{n}"
        return key

    def stale_reports(self, fleet: Fleet, run_id: str) -> dict[str, str]:
        """Host → the run its report was already counted in, for each host whose report in this
        fleet run was recorded under another run (a file left behind in a reused directory)."""
        out: dict[str, str] = {}
        for host, (_, report_run, started) in report_ids(fleet).items():
            row = self.db.execute(
                "SELECT h.run_id FROM hosts h JOIN runs r USING (run_id) WHERE h.host = ? AND "
                "h.report_run_id = ? AND h.started_at = ? AND h.run_id != ? ORDER BY r.seq LIMIT 1",
                (host, report_run, started, run_id)).fetchone()
            if row:
                out[host] = _text(row[0], "hosts.run_id")
        return out

    def recent_hosts(self, runs: int, before: str | None = None) -> dict[str, str]:
        """Host → the last run (of the last `runs` recorded before run `before`) in which it had
        a report."""
        where = ("WHERE seq < COALESCE((SELECT seq FROM runs WHERE run_id = ?), 1e18)"
                 if before is not None else "")
        query = (f"WITH recent AS (SELECT run_id, seq FROM runs {where} ORDER BY seq DESC LIMIT ?) "
                 "SELECT h.host, h.run_id FROM hosts h JOIN recent USING (run_id) ORDER BY recent.seq")
        params = [*([before] if before is not None else []), runs]
        return {_text(host, "hosts.host"): _text(run, "hosts.run_id")
                for host, run in self.db.execute(query, params)}

    def last_reports(self, hosts: Iterable[str]) -> dict[str, float]:
        """Host → when its newest recorded report finished (Unix time), for hosts with one."""
        out: dict[str, float] = {}
        for host in hosts:
            row = self.db.execute("SELECT MAX(finished_at) FROM hosts WHERE host = ?", (host,)).fetchone()
            if row and row[0] is not None:
                out[host] = _number(row[0], "hosts.finished_at")
        return out

    def record(self, fleet: Fleet, run_id: str | None = None, *, reports_of: Fleet | None = None,
               map_: Mapper | None = None) -> str:
        """Append this run (replacing an earlier recording of the same run id). `reports_of`: the
        fleet as read, before stale reports were set aside, whose reports identify the run.
        `map_`: as for _rows (the fleet CLI's reading pool)."""
        run_id = run_id or fleet.run_id or fleet.generated_at
        rows: dict[str, list[tuple[Any, ...]]] = {"gpus": [], "results": [], "figures": [], "hosts": []}
        for table, row in _rows(fleet, run_id, map_):
            rows[table].append(row)
        with self._write():
            for table in rows:
                self.db.execute(f"DELETE FROM {table} WHERE run_id = ?", (run_id,))
            self.db.execute("INSERT INTO runs (run_id, recorded_at, fingerprint) VALUES (?, ?, ?) "
                            "ON CONFLICT(run_id) DO UPDATE SET recorded_at = excluded.recorded_at, "
                            "fingerprint = excluded.fingerprint",
                            (run_id, dt.datetime.now(dt.timezone.utc).isoformat(),
                             fingerprint(reports_of or fleet, fleet.run_id or fleet.generated_at)))
            self.db.executemany("INSERT INTO gpus VALUES (?, ?, ?, ?, ?)", rows["gpus"])
            self.db.executemany("INSERT INTO results VALUES (?, ?, ?, ?, ?, ?, ?)", rows["results"])
            self.db.executemany("INSERT INTO figures VALUES (?, ?, ?, ?, ?, ?)", rows["figures"])
            self.db.executemany("INSERT INTO hosts VALUES (?, ?, ?, ?, ?)", rows["hosts"])
        return run_id

    def runs(self) -> list[str]:
        return [r[0] for r in self.db.execute("SELECT run_id FROM runs ORDER BY seq")]

    def lemons(self, failures: int = DEFAULT_FAILURES, runs: int = DEFAULT_RUNS,
               config_fraction: float = CONFIG_EVENT_FRACTION) -> list[Lemon]:
        """GPUs that failed in at least `failures` of the last `runs` runs, leaving out
        quarantined rows and the failures of configuration events (config_events)."""
        out = []
        for uuid, failed, seen, hosts, checks, last in self.db.execute(
                LEMONS, {"runs": runs, "failures": failures, "fraction": config_fraction,
                         "min_gpus": CONFIG_EVENT_MIN_GPUS}):
            out.append(Lemon(_text(uuid, "results.gpu_uuid"), _count(failed, "failed runs"),
                             _count(seen, "gpus runs"), runs,
                             tuple(sorted(_text(hosts, "results.host").split(","))),
                             tuple(sorted(_text(checks, "results.check_id").split(","))),
                             _text(last, "runs.run_id")))
        return out

    def config_events(self, runs: int = DEFAULT_RUNS, config_fraction: float = CONFIG_EVENT_FRACTION
                      ) -> list[tuple[str, str, int, int]]:
        """(run id, check, GPUs that failed it, GPUs in that run) for each configuration event of
        the last `runs` runs, oldest first: what lemons() leaves out."""
        query = ("WITH recent AS (SELECT run_id, seq FROM runs ORDER BY seq DESC LIMIT :runs),"
                 + CONFIG_EVENTS + " SELECT m.run_id, m.check_id, m.failed, m.gpus FROM mass m "
                 "JOIN recent USING (run_id) ORDER BY recent.seq, m.check_id")
        params = {"runs": runs, "fraction": config_fraction, "min_gpus": CONFIG_EVENT_MIN_GPUS}
        return [(str(r), str(c), int(f), int(g)) for r, c, f, g in self.db.execute(query, params)]

    def figure_series(self, checks: Iterable[str], *, before: str | None = None,
                      window: int = 20) -> dict[SeriesKey, list[tuple[str, float]]]:
        """Every recorded figure of these checks in the last `window` runs (those recorded before
        run `before`, when given, leaving that run out), oldest first: (run id, value) per
        (GPU UUID or "host:<name>" for a host-level figure, check, figure name)."""
        checks = list(checks)
        if not checks:
            return {}
        marks = ",".join("?" * len(checks))
        where = ("WHERE seq < COALESCE((SELECT seq FROM runs WHERE run_id = ?), 1e18)"
                 if before is not None else "")
        query = (f"WITH recent AS (SELECT run_id, seq FROM runs {where} ORDER BY seq DESC LIMIT ?) "
                 "SELECT COALESCE(f.gpu_uuid, 'host:' || f.host), f.check_id, f.name, f.run_id, "
                 "f.value FROM figures f JOIN recent USING (run_id) "
                 f"WHERE f.check_id IN ({marks}) AND {NOT_QUARANTINED.format(t='f')} "
                 "ORDER BY recent.seq")
        params = [*([before] if before is not None else []), window, *checks]
        out: dict[SeriesKey, list[tuple[str, float]]] = {}
        for key, check_id, name, run_id, value in self.db.execute(query, params):
            out.setdefault(_series_key(key, check_id, name), []).append(
                (_text(run_id, "figures.run_id"), _number(value, "figures.value")))
        return out

    def first_figures(self, checks: Iterable[str], *, before: str | None = None
                      ) -> dict[SeriesKey, tuple[str, float]]:
        """The first value ever recorded per (GPU or host, check, figure): the acceptance baseline
        (a GPU's first burn-in), however many runs ago it was."""
        checks = list(checks)
        if not checks:
            return {}
        marks = ",".join("?" * len(checks))
        cutoff = ("AND r.seq < COALESCE((SELECT seq FROM runs WHERE run_id = ?), 1e18)"
                  if before is not None else "")
        query = ("SELECT COALESCE(f.gpu_uuid, 'host:' || f.host), f.check_id, f.name, f.run_id, "
                 "f.value FROM figures f JOIN runs r USING (run_id) "
                 f"WHERE f.check_id IN ({marks}) {cutoff} AND {NOT_QUARANTINED.format(t='f')} "
                 "ORDER BY r.seq DESC")
        params = [*checks, *([before] if before is not None else [])]
        out: dict[SeriesKey, tuple[str, float]] = {}
        for key, check_id, name, run_id, value in self.db.execute(query, params):
            out[_series_key(key, check_id, name)] = (  # the oldest one is written last
                _text(run_id, "figures.run_id"), _number(value, "figures.value"))
        return out
