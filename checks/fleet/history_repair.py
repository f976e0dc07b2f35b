"""Repair the run history: `python -m checks.fleet history COMMAND`.

    python -m checks.fleet history list                          # runs, quarantines, config events
    python -m checks.fleet history forget RUN                     # remove a run (backed up first)
    python -m checks.fleet history quarantine RUN [--host H] [--gpu UUID] --reason TEXT
    python -m checks.fleet history release RUN [--host H] [--gpu UUID]
    python -m checks.fleet history restore BACKUP.json            # put a forgotten run back

A run recorded by mistake (a wrong expectation pushed everywhere, a test run into the production
history) makes healthy GPUs lemons and moves drift baselines. `forget` removes the run and every
row of it; before anything is removed, those rows are written to
`<history>.removed/<run>-<time>.json`, which `restore` puts back. `quarantine` keeps the rows but
takes them out of the lemon count and the drift baselines: the whole run, one host of it, or one
GPU (by UUID) of it; `release` undoes it. Each command changes the history in one transaction.

A configuration event needs no repair: one check failing on at least half of a run's GPUs
(history.CONFIG_EVENT_FRACTION) is left out of the lemon count by itself, and `list` and the
fleet report say so.

Exit status: 0 done, 2 bad usage (no such history, run, host or GPU; an unreadable backup).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import sqlite3
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from checks import cliutil, safeio
from checks.fleet import history

TABLES = ("runs", "gpus", "results", "figures", "hosts", "quarantine")
BACKUP_SCHEMA = "nodecert-history-removed/1"
DEFAULT_DB = "reports/history.sqlite"


class RepairError(Exception):
    """One line for the operator (exit 2)."""


def _columns(store: history.History, table: str) -> list[str]:
    return [row[1] for row in store.db.execute(f"PRAGMA table_info({table})")]


def _rows(store: history.History, table: str, run_id: str) -> list[dict[str, Any]]:
    names = _columns(store, table)
    return [dict(zip(names, row, strict=True))
            for row in store.db.execute(f"SELECT * FROM {table} WHERE run_id = ?", (run_id,))]


def _known_run(store: history.History, run_id: str) -> None:
    if not store.db.execute("SELECT 1 FROM runs WHERE run_id = ?", (run_id,)).fetchone():
        runs = store.runs()
        raise RepairError(f"no run {run_id!r} in {store.path} (last: {', '.join(runs[-5:]) or 'none'})")


def backup_path(db: Path, run_id: str) -> Path:
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
    safe = re.sub(r"[^A-Za-z0-9._@-]", "_", run_id)[:80]
    return db.with_name(f"{db.name}.removed") / f"{safe}-{stamp}.json"


def forget(store: history.History, run_id: str) -> tuple[Path, dict[str, int]]:
    """Remove run `run_id` and every row of it; the rows are written to a backup file first
    (a backup that cannot be written removes nothing). Returns the backup and rows per table."""
    with store._write():
        _known_run(store, run_id)
        removed = {table: _rows(store, table, run_id) for table in TABLES}
        path = backup_path(store.path, run_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        safeio.write_text(path, json.dumps({"schema": BACKUP_SCHEMA, "run_id": run_id,
                                            "history": str(store.path), "tables": removed}) + "\n")
        for table in reversed(TABLES):  # the runs row last: the others reference it
            store.db.execute(f"DELETE FROM {table} WHERE run_id = ?", (run_id,))
    return path, {table: len(rows) for table, rows in removed.items()}


def restore(store: history.History, backup: Path) -> str:
    """Put a forgotten run back from its backup file; refused while a run of that id exists."""
    try:
        doc = json.loads(backup.read_text())
        if doc.get("schema") != BACKUP_SCHEMA:
            raise ValueError(f"not a history backup (schema {doc.get('schema')!r})")
        run_id, tables = str(doc["run_id"]), doc["tables"]
        if not isinstance(tables, dict) or set(tables) - set(TABLES) or not tables.get("runs"):
            raise ValueError("its tables are not the history's")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise RepairError(f"{backup}: {' '.join(str(exc).split())}") from None
    with store._write():
        if store.db.execute("SELECT 1 FROM runs WHERE run_id = ?", (run_id,)).fetchone():
            raise RepairError(f"run {run_id!r} is in {store.path} already: forget it first")
        for table in TABLES:  # the runs row first
            known = set(_columns(store, table))
            for row in tables.get(table) or []:
                if not isinstance(row, dict) or set(row) - known or row.get("run_id") != run_id:
                    raise RepairError(f"{backup}: a {table} row that is not run {run_id!r}'s")
                names = list(row)
                store.db.execute(f"INSERT INTO {table} ({', '.join(names)}) VALUES "
                                 f"({', '.join('?' * len(names))})", [row[n] for n in names])
    return run_id


def _scope(store: history.History, run_id: str, host: str | None, gpu: str | None) -> str:
    """What a quarantine covers, in words; RepairError when the run has no such host or GPU."""
    _known_run(store, run_id)
    where, params = ["run_id = ?"], [run_id]
    if host is not None:
        where.append("host = ?")
        params.append(host)
    if gpu is not None:
        where.append("gpu_uuid = ?")
        params.append(gpu)
    if (host or gpu) and not store.db.execute(
            f"SELECT 1 FROM gpus WHERE {' AND '.join(where)} UNION ALL "
            f"SELECT 1 FROM results WHERE {' AND '.join(where)} LIMIT 1", params * 2).fetchone():
        what = " ".join(x for x in (f"host {host!r}" if host else "", f"GPU {gpu!r}" if gpu else "") if x)
        raise RepairError(f"run {run_id!r} has no {what}")
    return " ".join(x for x in (f"run {run_id}", f"host {host}" if host else "",
                                f"GPU {gpu}" if gpu else "") if x)


def quarantine(store: history.History, run_id: str, host: str | None, gpu: str | None,
               reason: str) -> str:
    with store._write():
        scope = _scope(store, run_id, host, gpu)
        store.db.execute("INSERT INTO quarantine VALUES (?, ?, ?, ?, ?)",
                         (run_id, host, gpu, reason, dt.datetime.now(dt.timezone.utc).isoformat()))
    return scope


def release(store: history.History, run_id: str, host: str | None, gpu: str | None) -> int:
    with store._write():
        _known_run(store, run_id)
        cur = store.db.execute("DELETE FROM quarantine WHERE run_id = ? AND host IS ? AND gpu_uuid IS ?",
                               (run_id, host, gpu))
        return int(cur.rowcount)


def listing(store: history.History, runs: int) -> list[str]:
    lines = []
    marks: dict[str, list[str]] = {}
    for run_id, host, gpu, reason in store.db.execute(
            "SELECT run_id, host, gpu_uuid, reason FROM quarantine ORDER BY at"):
        scope = " ".join(x for x in (f"host {host}" if host else "", f"GPU {gpu}" if gpu else "") if x)
        marks.setdefault(run_id, []).append(f"quarantined{' ' + scope if scope else ''}: {reason}")
    events: dict[str, list[str]] = {}
    for run_id, check, failed, gpus in store.config_events(runs):
        events.setdefault(run_id, []).append(
            f"configuration event: {check} failed on {failed} of {gpus} GPUs (not counted as lemons)")
    for run_id, recorded, hosts in store.db.execute(
            "SELECT r.run_id, r.recorded_at, (SELECT COUNT(*) FROM hosts h WHERE h.run_id = r.run_id) "
            "FROM runs r ORDER BY r.seq"):
        lines.append(f"{run_id}  recorded {recorded}  {hosts} host report(s)")
        lines.extend(f"  {note}" for note in [*marks.get(run_id, []), *events.get(run_id, [])])
    return lines


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m checks.fleet history",
                                description="Repair the fleet's run history (lemons, drift).",
                                epilog="Exit status: 0 done, 2 bad usage. Docs: docs/fleet.md.")
    p.add_argument("--history", metavar="DB", default=DEFAULT_DB,
                   help=f"the history database (default {DEFAULT_DB}); never created here")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    ls = sub.add_parser("list", help="runs, what is quarantined, configuration events")
    ls.add_argument("--runs", type=cliutil.number(int, minimum=1), default=history.DEFAULT_RUNS,
                    metavar="M", help="runs looked back over for configuration events (default "
                                      f"{history.DEFAULT_RUNS}, as for lemons)")
    fo = sub.add_parser("forget", help="remove a run (its rows backed up to <DB>.removed/ first)")
    fo.add_argument("run", metavar="RUN")
    for name, what in (("quarantine", "leave a run, or a host or GPU of it, out of lemons and "
                                      "baselines"), ("release", "undo a quarantine")):
        q = sub.add_parser(name, help=what)
        q.add_argument("run", metavar="RUN")
        q.add_argument("--host", help="only this host of the run")
        q.add_argument("--gpu", metavar="UUID", help="only this GPU of the run")
        if name == "quarantine":
            q.add_argument("--reason", required=True, help="why (kept with the quarantine)")
    rs = sub.add_parser("restore", help="put a forgotten run back from its backup")
    rs.add_argument("backup", metavar="FILE")
    return p


def _run(args: argparse.Namespace, store: history.History) -> None:
    if args.command == "list":
        for line in listing(store, args.runs):
            print(line)
    elif args.command == "forget":
        path, counts = forget(store, args.run)
        rows = ", ".join(f"{n} {table}" for table, n in counts.items() if n)
        print(f"forgot run {args.run} ({rows}); backup: {path} "
              f"(python -m checks.fleet history restore {path})")
    elif args.command == "quarantine":
        reason = " ".join(args.reason.split())
        if not reason:
            raise RepairError("--reason must say why")
        print(f"quarantined {quarantine(store, args.run, args.host, args.gpu, reason)}: left out "
              "of lemons and drift baselines")
    elif args.command == "release":
        n = release(store, args.run, args.host, args.gpu)
        if not n:
            raise RepairError(f"nothing of that scope is quarantined in run {args.run!r}")
        print(f"released {n} quarantine(s) of run {args.run}")
    else:
        print(f"restored run {restore(store, Path(args.backup))}")


def main(argv: Sequence[str] | None = None) -> int:
    args = cliutil.parse(build_parser(), argv)
    if isinstance(args, int):
        return args
    db = Path(args.history)
    try:
        if not db.is_file():  # a typo must not create an empty history and "forget" nothing
            raise RepairError(f"no history database at {db}")
        with history.History(db) as store:
            _run(args, store)
    except (RepairError, safeio.UnsafePath) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except sqlite3.Error as exc:
        print(f"error: history database {db}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": "), file=sys.stderr)
        return 2
    return 0
