"""The remediation loop's guards across the cluster, from one sinfo: the budget (at most
--max-remediating nodes, and --max-remediating-fraction of a partition, in remediation at once)
and the breaker (open when --breaker-drains nodes were drained by nodecert within
--breaker-window; closed again only by remediate --reset-breaker). Each node keeps its own
breaker file: the loop runs on every node, so a reset is run on every node (docs/operations.md)."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from checks import safeio
from checks.fleet.remediate_state import BREAKER, PARKED_WORDS, Record, Run, Seen


def load_breaker(directory: Path) -> dict[str, Any]:
    try:
        doc = json.loads((directory / BREAKER).read_text())
    except (OSError, ValueError):
        return {"open": False, "reset_at": 0.0}
    return doc if isinstance(doc, dict) else {"open": False, "reset_at": 0.0}


def recent_drains(run: Run, since: float) -> list[str]:
    """Nodes drained (or down) by nodecert whose reason was set after `since`, parked ones
    (RMA, HOLD) left out."""
    return sorted(s.name for s in run.cluster.values()
                  if run.ours(s.state.reason) and run.word(s.state.reason) not in PARKED_WORDS
                  and (s.state.drained or s.state.state in ("down", "reboot") or s.state.reboot_pending)
                  and s.reason_at is not None and s.reason_at >= since)


def breaker_open(run: Run) -> bool:
    """True while the breaker is open: it opens (and stays open until --reset-breaker) when
    --breaker-drains nodes were drained by nodecert within --breaker-window."""
    doc = load_breaker(run.directory)
    if doc.get("open"):
        return True
    since = max(time.time() - run.policy.breaker_window_s, float(doc.get("reset_at") or 0.0))
    drained = recent_drains(run, since)
    if len(drained) < run.policy.breaker_drains:
        return False
    opened = {"open": True, "opened_at": time.time(), "drains": drained,
              "reset_at": doc.get("reset_at", 0.0), "window_s": run.policy.breaker_window_s}
    if run.apply:
        run.directory.mkdir(parents=True, exist_ok=True)
        safeio.write_text(run.directory / BREAKER, json.dumps(opened))
    run.log("breaker-open", "ok", "-", "-", None,
            f"{len(drained)} nodes drained by nodecert within {run.policy.breaker_window_s:g} s "
            f"({', '.join(drained[:8])}{' ...' if len(drained) > 8 else ''}), at most "
            f"{run.policy.breaker_drains - 1}: no new remedies until an operator runs "
            "remediate --reset-breaker")
    return True


def in_remediation(run: Run) -> list[Seen]:
    """Nodes the loop is working on now (reset, reboot, verify in their reason, or a reboot of
    ours pending), sorted by name."""
    return sorted((s for s in run.cluster.values()
                   if run.word(s.state.reason) in ("RESET", "REBOOT", "VERIFY")
                   or (s.state.reboot_pending and run.ours(s.state.reason))),
                  key=lambda s: s.name)


def budget(run: Run) -> tuple[int, list[str]]:
    """How many nodes may be in remediation at once in this node's partitions, and those that
    are (this node included when it is)."""
    me = run.cluster[run.node]
    allowed = run.policy.max_remediating
    busy: set[str] = set()
    for part in me.partitions or ("",):
        members = [s for s in run.cluster.values() if part in s.partitions or not part]
        allowed = min(allowed, max(1, math.floor(run.policy.max_fraction * len(members))))
        busy |= {s.name for s in in_remediation(run) if part in s.partitions or not part}
    return allowed, sorted(busy)


def claim(run: Run, rec: Record, reason: str, before: str) -> bool:
    """Take a place in the budget: set the stage's reason, read the cluster again, and give the
    place back (restore the reason) when more nodes than allowed claimed at the same time and
    this one is not among the first `allowed` names (every node reads the same set)."""
    allowed, busy = budget(run)
    others = [n for n in busy if n != run.node]
    if len(others) >= allowed:
        run.log("wait", "budget", before, before, rec,
                f"{len(others)} nodes in remediation ({', '.join(others)}), at most {allowed} at once")
        return False
    cmd = run.set_reason(reason)
    if not run.apply:
        return True
    run.look()
    allowed, busy = budget(run)
    if len(busy) > allowed and run.node not in busy[:allowed]:
        run.set_reason(rec.reason)
        run.log("wait", "budget", before, before, rec,
                f"claimed together with {', '.join(n for n in busy if n != run.node)}; "
                f"at most {allowed} at once: this node waits", cmd)
        return False
    return True


def reset_breaker(run: Run) -> int:
    doc = load_breaker(run.directory)
    was = "open" if doc.get("open") else "closed"
    if run.apply:
        run.directory.mkdir(parents=True, exist_ok=True)
        safeio.write_text(run.directory / BREAKER, json.dumps({"open": False, "reset_at": time.time()}))
    else:
        print("dry run (--apply to reset it)")
    run.log("breaker-reset", "ok", was, "closed", None,
            "drains before now no longer count towards the breaker")
    return 0
