"""Run history in SQLite (reports/history.sqlite by default; no server) and the lemon query.

Each fleet run appends: one row per GPU seen (host, UUID, index, worst status); one row per
(host, check, GPU) that did not pass (WARN, FAIL, ERROR; GPU uuid NULL for host-level results),
straggler verdicts included as check `straggler:<check>/<figure>`, and a host without a readable
report as check `report`; and every figure value. Passing results are not stored one by one: the
reports themselves stay in reports/<run-id>/, and 1 000 hosts would add ~20 MB per run.
Recording a run id again replaces that run.

A lemon is a GPU, followed by UUID wherever it moved, that had a FAIL or ERROR result (a
straggler FAIL included) in at least N of the last M runs recorded (default 2 of 5).
"""

from __future__ import annotations

import datetime as dt
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..model import Status
from .aggregate import Fleet

DEFAULT_FAILURES = 2
DEFAULT_RUNS = 5
BAD = ("FAIL", "ERROR")
PROBLEMS = ("WARN", *BAD)

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


@dataclass(frozen=True)
class Lemon:
    uuid: str
    failed_runs: int
    seen_runs: int
    window: int  # the M of "N of the last M runs"
    hosts: tuple[str, ...]
    checks: tuple[str, ...]
    last_failed_run: str

    def to_dict(self) -> dict[str, Any]:
        return {"uuid": self.uuid, "failed_runs": self.failed_runs, "seen_runs": self.seen_runs,
                "window": self.window, "hosts": list(self.hosts), "checks": list(self.checks),
                "last_failed_run": self.last_failed_run}


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


class History:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(self.path)
        self.db.execute("PRAGMA foreign_keys = ON")
        self.db.executescript(SCHEMA)

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
        with self.db:
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
