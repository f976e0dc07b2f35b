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


# A claim's first word: the node wants a place in the budget and has not taken it yet.
CLAIM = "CLAIM"
BUSY_WORDS = (CLAIM, "RESET", "REBOOT", "VERIFY")
# A claim is read back once slurmctld's clock has passed the second it was stamped with (sinfo %H
# has whole seconds) by this margin: every claim stamped in that second or before is then visible
# to every claimant. The nodes' clocks must agree with the controller's within it (NTP, chrony).
SETTLE_S = 1.0


def in_remediation(run: Run) -> list[Seen]:
    """Nodes the loop is working on now (a claim, reset, reboot or verify in their reason, or a
    reboot of ours pending), sorted by name."""
    return sorted((s for s in run.cluster.values()
                   if run.word(s.state.reason) in BUSY_WORDS
                   or (s.state.reboot_pending and run.ours(s.state.reason))),
                  key=lambda s: s.name)


def _places(run: Run) -> tuple[int, list[Seen]]:
    """How many nodes may be in remediation at once in this node's partitions, and those that
    are (this node included when it is)."""
    me = run.cluster[run.node]
    allowed = run.policy.max_remediating
    busy: dict[str, Seen] = {}
    for part in me.partitions or ("",):
        members = [s for s in run.cluster.values() if part in s.partitions or not part]
        allowed = min(allowed, max(1, math.floor(run.policy.max_fraction * len(members))))
        busy |= {s.name: s for s in in_remediation(run) if part in s.partitions or not part}
    return allowed, sorted(busy.values(), key=lambda s: s.name)


def budget(run: Run) -> tuple[int, list[str]]:
    allowed, busy = _places(run)
    return allowed, [s.name for s in busy]


def _ahead(run: Run, stamp: float | None) -> tuple[int, list[str]]:
    """The nodes that hold a place before this one's claim: every node past its claim (reset,
    reboot, verify, a reboot of ours pending), and the claims stamped earlier, or in the same
    second by a node whose name sorts first. A stamp sinfo does not give counts as earliest."""
    allowed, busy = _places(run)
    mine = (math.inf if stamp is None else stamp, run.node)
    ahead = [s.name for s in busy if s.name != run.node and (
        run.word(s.state.reason) != CLAIM
        or (-math.inf if s.reason_at is None else s.reason_at, s.name) < mine)]
    return allowed, ahead


def _settle(stamp: float | None) -> None:
    """Wait until the claim's second has passed on slurmctld's clock (by SETTLE_S on ours); at
    most 1 + 2 * SETTLE_S, whatever the clocks say."""
    now = time.time()
    until = (math.floor(now) if stamp is None else stamp) + 1 + SETTLE_S
    time.sleep(min(max(0.0, until - now), 1 + 2 * SETTLE_S))


def claim(run: Run, rec: Record, reason: str, before: str) -> bool:
    """Take a place in the budget. The reason first says CLAIM; once every claim stamped in the
    same second is visible (the settle), the node takes the stage's reason when fewer than the
    allowed nodes are ahead of it (_ahead), else it sets its reason back and waits. slurmctld
    orders the writes, so of nodes claiming together exactly the allowed number go on, whatever
    the order their reads interleave in."""
    allowed, busy = budget(run)
    others = [n for n in busy if n != run.node]
    if len(others) >= allowed:
        run.log("wait", "budget", before, before, rec,
                f"{len(others)} nodes in remediation ({', '.join(others)}), at most {allowed} at once")
        return False
    if not run.apply:
        run.set_reason(reason)
        return True
    run.set_reason(f"{run.prefix}: {CLAIM} {reason[len(run.prefix) + 1:].strip()}")
    stamp = run.look().reason_at
    _settle(stamp)
    run.look()
    allowed, ahead = _ahead(run, stamp)
    if len(ahead) >= allowed:
        cmd = run.set_reason(rec.reason)
        run.log("wait", "budget", before, before, rec,
                f"claimed together with {', '.join(ahead)}, ahead of this node; at most {allowed} "
                "at once: this node waits", cmd)
        return False
    run.set_reason(reason)
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
