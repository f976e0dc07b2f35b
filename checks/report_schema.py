"""The JSON report: one document per host and run, validated against schema/report.schema.json."""

from __future__ import annotations

import datetime as dt
import json
import math
import re
import socket
from collections import Counter
from pathlib import Path
from typing import Any

from checks import __version__, resources, safeio
from checks.environment import MASKED, env_recorded, env_value, recorded_environment  # noqa: F401 (the report's API)
from checks.model import CheckOutcome, Status

SCHEMA_PATH = resources.data("schema", "report.schema.json")
SCHEMA_VERSION = "1.0"
def build(outcomes: list[CheckOutcome], *, meta: dict[str, Any]) -> dict[str, Any]:
    counts = Counter(str(o.status) for o in outcomes)
    failed = any(o.status.is_problem for o in outcomes)
    return {
        "schema": "nodecert-report",
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "nodecert", "version": __version__},
        "host": meta.get("host") or socket.gethostname(),
        "run_id": meta.get("run_id"),
        "started_at": meta.get("started_at") or dt.datetime.now(dt.timezone.utc).isoformat(),
        "duration_s": round(float(meta.get("duration_s", 0.0)), 3),
        "level": meta.get("level"),
        "backend": meta.get("backend"),
        "scenario": meta.get("scenario"),
        "profile": meta.get("profile"),
        "options": meta.get("options", {}),
        "system": meta.get("system", {}),
        "environment": meta.get("environment", {}),
        "summary": {s.value: counts.get(s.value, 0) for s in Status},
        "verdict": "FAIL" if failed else "PASS",
        "exit_code": 1 if failed else 0,
        "checks": [o.to_dict() for o in outcomes],
    }


def write(report: dict[str, Any], path: str | Path) -> Path:
    """Write the report (mode 0600: it names the host, its GPUs and its environment)."""
    return safeio.write_text(path, json.dumps(report, indent=2, default=str) + "\n")


# A host is one node name: what Slurm, Ansible and a file name can all take as exactly one host.
# Letters, digits, '-', '.', '_' (hostname labels; '_' appears in inventories), starting with a
# letter, digit or '_', at most 253 characters. No brackets or commas (a Slurm node *list*), no
# '/' or '..' (a path), no spaces or control characters, not a name the fleet writes itself.
HOST_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,252}")
RESERVED_HOST_NAMES = frozenset({"fleet", "meta", "crosshost", "history", "all", "none"})


def host_problem(name: object) -> str | None:
    """Why `name` is not one valid node name, or None when it is."""
    if not isinstance(name, str):
        return f"host {name!r} is not a string"
    if not HOST_NAME.fullmatch(name) or ".." in name or name.endswith("."):
        return (f"host {name!r} is not a node name (letters, digits, '-', '.', '_'; no "
                "brackets, commas, spaces, '/', '..' or control characters)")
    if name.lower() in RESERVED_HOST_NAMES:
        return f"host {name!r} is a reserved name"
    return None


_RANK = {str(s): s.severity for s in Status}
_STATUS_NAMES = tuple(_RANK)


def consistency_problem(report: dict[str, Any]) -> str | None:
    """A schema-valid report whose check statuses, summary, verdict or exit code do not follow
    from its results: the verdict is recomputed, never taken on the report's word."""
    counts = dict.fromkeys(_STATUS_NAMES, 0)
    rank = _RANK.__getitem__  # the schema has proved every status one of Status (no Status() per result)
    for chk in report["checks"]:
        # the worst of the few distinct statuses (a set first; mostly one, else max over those)
        statuses = {r["status"] for r in chk["results"]}
        worst = statuses.pop() if len(statuses) == 1 else max(statuses, key=rank)
        if chk["status"] != worst:
            return f"check {chk['id']} says {chk['status']} but its results say {worst}"
        counts[worst] += 1
    if {k: report["summary"].get(k) for k in counts} != counts:
        return f"summary {report['summary']} does not match its checks {counts}"
    verdict = "FAIL" if counts["FAIL"] or counts["ERROR"] else "PASS"
    if report["verdict"] != verdict:
        return f"verdict {report['verdict']} does not follow from its checks ({verdict})"
    if report["exit_code"] != (1 if verdict == "FAIL" else 0):
        return f"exit_code {report['exit_code']} does not match its verdict {verdict}"
    return None


# How far ahead of the reader's clock a report's start may be (clocks of a fleet drift; NTP keeps
# them within seconds, a day is generous). Further ahead is a wrong clock or an edited report, and
# would keep the report looking fresh for ever (the staleness alert reads when it finished).
MAX_CLOCK_AHEAD_S = 86400.0


def time_problem(report: dict[str, Any], now: float) -> str | None:
    """A report whose start, or whose end (start + duration_s), is more than a day after `now`
    (Unix time): the end is when the fleet and the history take it to have finished."""
    try:
        started = dt.datetime.fromisoformat(str(report.get("started_at")))
    except ValueError:  # the schema judges the format; only a readable time can be in the future
        return None
    if started.tzinfo is None:
        started = started.replace(tzinfo=dt.timezone.utc)
    ahead = started.timestamp() - now
    if ahead > MAX_CLOCK_AHEAD_S:
        return (f"started_at {started.isoformat()} is {ahead / 86400:.0f} days after this "
                "machine's clock: a wrong clock on the node or an edited report")
    duration = report.get("duration_s")
    if isinstance(duration, int | float) and not isinstance(duration, bool) and (
            not math.isfinite(duration) or ahead + duration > MAX_CLOCK_AHEAD_S):
        return (f"duration_s {duration:g} ends the run after this machine's clock (started "
                f"{started.isoformat()}): an edited report")
    return None


def schema() -> dict[str, Any]:
    return json.loads(SCHEMA_PATH.read_text())
