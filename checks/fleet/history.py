"""Run history in SQLite (reports/history.sqlite by default; no server) and the lemon query.

Each fleet run appends: one row per GPU seen (host, UUID, index, worst status); one row per
(host, check, GPU) that did not pass (WARN, FAIL, ERROR; GPU uuid NULL for host-level results),
straggler verdicts included as check `straggler:<check>/<figure>`, and a host without a readable
report as check `report`; and every figure value. Passing results are not stored one by one: the
reports themselves stay in reports/<run-id>/, and 1 000 hosts would add ~20 MB per run.
Recording a run id again replaces that run. Drift verdicts (drift.py) are stored like straggler
ones, as check `drift:<check>/<figure>`, and digest mismatches (digest.py) as check `digest`, so a
GPU that keeps drifting or computing other bits becomes a lemon too.

Several verify runs may record at once, and a run may be killed mid-write: the database runs in
WAL mode with a busy timeout, and each run is written in one `BEGIN IMMEDIATE` transaction (the
write lock is taken up front, so two writers never deadlock upgrading a read lock). A writer
killed with SIGKILL leaves its transaction uncommitted in the WAL, which the next connection
rolls back: the run is either wholly there or absent.

A lemon is a GPU, followed by UUID wherever it moved, that had a FAIL or ERROR result (a
straggler FAIL included) in at least N of the last M runs recorded (default 2 of 5).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import sqlite3
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from checks.fleet.aggregate import Fleet
from checks.fleet.findings import Lemon
from checks.model import Status

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
CREATE INDEX IF NOT EXISTS gpus_by_uuid ON gpus(gpu_uuid);
CREATE INDEX IF NOT EXISTS gpus_by_run ON gpus(run_id);
CREATE INDEX IF NOT EXISTS results_by_gpu ON results(gpu_uuid, status);
CREATE INDEX IF NOT EXISTS results_by_run ON results(run_id);
CREATE INDEX IF NOT EXISTS figures_by_run ON figures(run_id);
CREATE INDEX IF NOT EXISTS figures_by_check ON figures(check_id, name);
"""

LEMONS = """
WITH recent AS (SELECT run_id, seq FROM runs ORDER BY seq DESC LIMIT :runs),
bad AS (
    SELECT r.gpu_uuid, r.run_id, r.host, r.check_id, recent.seq
    FROM results r JOIN recent USING (run_id)
    WHERE r.gpu_uuid IS NOT NULL AND r.status IN ('FAIL', 'ERROR')
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


def _worst(a: str, b: str) -> str:
    return a if Status(a).severity >= Status(b).severity else b


def _rows(fleet: Fleet, run_id: str) -> Iterator[tuple[str, tuple[Any, ...]]]:
    for entry in fleet.hosts:
        worst: dict[tuple[str, str | None], tuple[int | None, str, str]] = {}
        gpus: dict[str, tuple[int | None, str]] = {}
        for chk in (entry.report or {}).get("checks", []):
            for r in chk["results"]:
                dev = r.get("device") or {}
                uuid, status = dev.get("uuid"), r["status"]
                if uuid:
                    index, seen = gpus.get(uuid, (dev.get("index"), "SKIP"))
                    gpus[uuid] = (index, _worst(seen, status))
                key = (chk["id"], uuid)
                if status in PROBLEMS and (key not in worst
                                           or _worst(worst[key][1], status) != worst[key][1]):
                    worst[key] = (dev.get("index"), status, r["message"])
                for name, value in ((r.get("details") or {}).get("figures") or {}).items():
                    if isinstance(value, int | float) and not isinstance(value, bool):
                        yield "figures", (run_id, entry.host, chk["id"], uuid, name, value)
        for uuid, (index, status) in gpus.items():
            yield "gpus", (run_id, entry.host, uuid, index, status)
        for (check_id, uuid), (index, status, message) in worst.items():
            yield "results", (run_id, entry.host, check_id, uuid, index, status, message)
        if entry.report is None:
            yield "results", (run_id, entry.host, "report", None, None, "ERROR", entry.reason)
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


class History:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
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

    def record(self, fleet: Fleet, run_id: str | None = None) -> str:
        """Append this run (replacing an earlier recording of the same run id)."""
        run_id = run_id or fleet.run_id or fleet.generated_at
        rows: dict[str, list[tuple[Any, ...]]] = {"gpus": [], "results": [], "figures": []}
        for table, row in _rows(fleet, run_id):
            rows[table].append(row)
        with self._write():
            for table in rows:
                self.db.execute(f"DELETE FROM {table} WHERE run_id = ?", (run_id,))
            self.db.execute("INSERT INTO runs (run_id, recorded_at) VALUES (?, ?) "
                            "ON CONFLICT(run_id) DO UPDATE SET recorded_at = excluded.recorded_at",
                            (run_id, dt.datetime.now(dt.UTC).isoformat()))
            self.db.executemany("INSERT INTO gpus VALUES (?, ?, ?, ?, ?)", rows["gpus"])
            self.db.executemany("INSERT INTO results VALUES (?, ?, ?, ?, ?, ?, ?)", rows["results"])
            self.db.executemany("INSERT INTO figures VALUES (?, ?, ?, ?, ?, ?)", rows["figures"])
        return run_id

    def runs(self) -> list[str]:
        return [r[0] for r in self.db.execute("SELECT run_id FROM runs ORDER BY seq")]

    def lemons(self, failures: int = DEFAULT_FAILURES, runs: int = DEFAULT_RUNS) -> list[Lemon]:
        """GPUs that failed in at least `failures` of the last `runs` runs."""
        out = []
        for uuid, failed, seen, hosts, checks, last in self.db.execute(
                LEMONS, {"runs": runs, "failures": failures}):
            out.append(Lemon(uuid, failed, seen, runs, tuple(sorted(hosts.split(","))),
                             tuple(sorted(checks.split(","))), last))
        return out

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
                 f"WHERE f.check_id IN ({marks}) ORDER BY recent.seq")
        params = [*([before] if before is not None else []), window, *checks]
        out: dict[SeriesKey, list[tuple[str, float]]] = {}
        for key, check_id, name, run_id, value in self.db.execute(query, params):
            out.setdefault((key, check_id, name), []).append((run_id, float(value)))
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
                 f"WHERE f.check_id IN ({marks}) {cutoff} ORDER BY r.seq DESC")
        params = [*checks, *([before] if before is not None else [])]
        out: dict[SeriesKey, tuple[str, float]] = {}
        for key, check_id, name, run_id, value in self.db.execute(query, params):
            out[(key, check_id, name)] = (run_id, float(value))  # the oldest one is written last
        return out
