"""`slurm report FLEET.json`: drain the hosts a fleet summary found bad, a share at a time.

    python -m checks.fleet.slurm report reports/<run-id>/meta/fleet.json            # dry run
    python -m checks.fleet.slurm report reports/<run-id>/meta/fleet.json --apply --max-drain-fraction 0.05

The summary (`python -m checks.fleet report --json`) holds, per host, what the fleet found that
no single node can see: stragglers (a GPU or host below its peers' median), digest mismatches
(a GPU computing other bits than its group), drift below its own history, lemons (a GPU failing
in N of the last M runs), and each host's folded status. A FAIL finding drains the host with
`<prefix>: fleet <finding>`; a WARN, an ERROR host (could not measure) and a MISSING host are
reported, never drained, and never resumed. A host drained by an earlier fleet run
(`<prefix>: fleet ...`) and PASS now is resumed, unless a reboot is pending or issued (sinfo's
@ or ^: a RESUME would cancel it).

The guard (like Meta's gcm): in each Slurm partition, at most --max-drain-fraction of its nodes
(at least one) may be drained at once, counting the nodes already drained for any reason. What
does not fit is listed as held back by the guard, not drained. Exit 1 when any host fails
(drained, would be, or held back), else 0.
"""

from __future__ import annotations

import functools
import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from checks.fleet import slurm_control as sl
from checks.report import load

SCHEMA = Path(__file__).resolve().parents[1] / "schema" / "fleet.schema.json"


@dataclass
class HostFindings:
    host: str  # the summary's host name
    node: str  # the Slurm node name (slurm_control.match_node; until matched, the short name)
    status: str
    failing: list[str] = field(default_factory=list)  # findings that drain
    warnings: list[str] = field(default_factory=list)


@functools.cache
def _validator() -> load.Validator:
    schema = json.loads(SCHEMA.read_text())
    return load._rs_validator(schema) or load._py_validator(schema)


def _gpu(gpu: dict[str, Any] | None) -> str:
    if not gpu:
        return ""
    return f" GPU{gpu['index']}" if gpu.get("index") is not None else f" {gpu.get('uuid') or ''}"


def findings(summary: dict[str, Any]) -> dict[str, HostFindings]:
    """Per host, the fleet's findings as drain reasons (FAIL) and notes (WARN)."""
    hosts: dict[str, HostFindings] = {}
    for entry in summary["hosts"]:
        name = sl.node_name(entry["host"], "fleet summary: host")
        hosts[name] = HostFindings(name, name.split(".")[0], entry["status"])

    def add(host: str, status: str | None, text: str) -> None:
        found = hosts.get(host)
        if found is None:
            found = hosts[host] = HostFindings(host, sl.node_name(host, "fleet summary: host")
                                               .split(".")[0], "FAIL")
        (found.failing if status == "FAIL" else found.warnings).append(text)

    for s in summary["stragglers"]:
        add(s["host"], s["status"], f"straggler {s['check']} {s['name']}{_gpu(s['gpu'])} "
                                    f"{s['deficit_pct']:.0f}% below fleet median")
    for odd in (summary.get("digests") or {}).get("odd", []):
        add(odd["host"], odd["status"], f"digest mismatch{_gpu(odd['gpu'])} "
                                        f"{str(odd['digest'])[:12]} vs majority "
                                        f"{str(odd['majority'] or '?')[:12]}")
    for d in summary.get("drift") or []:
        add(d["host"], d["status"], f"drift {d['check']} {d['name']}{_gpu(d['gpu'])} "
                                    f"{d['deficit_pct']:.0f}% below own baseline")
    for lemon in summary["lemons"]:
        for host in lemon["hosts"]:
            add(host, "FAIL", f"lemon GPU {lemon['uuid']} failed {lemon['failed_runs']} of last "
                              f"{lemon['window']} runs")
    for entry in summary["hosts"]:
        found = hosts[entry["host"]]
        if entry["status"] == "FAIL" and not found.failing:
            problems = ",".join(entry.get("problems") or []) or "FAIL"
            found.failing.append(f"host FAIL {problems}")
    return hosts


@dataclass(frozen=True)
class Membership:
    partitions: dict[str, set[str]]  # partition -> its nodes
    of_node: dict[str, set[str]]  # node -> its partitions
    states: dict[str, sl.NodeState]
    hostnames: dict[str, str] = field(default_factory=dict)  # node -> its NodeHostname


def membership() -> Membership:
    if sl.offline:  # --dry-run: no node's state, no partition known
        print("dry run, Slurm not asked (--dry-run): no node's state read, no partition guard "
              "applied: each failing host with the drain it would get (an already drained node "
              "would be left as it is); resumes are not shown")
        return Membership({}, {}, {})
    out = sl.run(["sinfo", "-h", "-N", "-o", "%N|%n|%P|%T|%E"])
    partitions: dict[str, set[str]] = defaultdict(set)
    of_node: dict[str, set[str]] = defaultdict(set)
    states: dict[str, sl.NodeState] = {}
    hostnames: dict[str, str] = {}
    for line in out.splitlines():
        parts = line.split("|", 4)
        if len(parts) != 5:
            continue
        node, hostname, part, state, reason = (p.strip() for p in parts)
        part = part.rstrip("*")  # the default partition is marked
        partitions[part].add(node)
        of_node[node].add(part)
        hostnames[node] = hostname
        states[node] = sl.parse_state(state, reason)  # keeps @ and ^: a reboot is due
    return Membership(dict(partitions), dict(of_node), states, hostnames)


def _reason(prefix: str, found: HostFindings) -> str:
    more = f" (+{len(found.failing) - 1} more)" if len(found.failing) > 1 else ""
    return sl.drain_reason(prefix, f"fleet {found.failing[0]}{more}")


# The guard drains the most severe findings first: wrong results before a failed check, a GPU
# that keeps failing, then figures below a baseline or the fleet (a straggler slows, it does not
# corrupt).
SEVERITY = ("digest mismatch", "host FAIL", "lemon GPU", "drift", "straggler")


def _rank(finding: str) -> int:
    return next((i for i, kind in enumerate(SEVERITY) if finding.startswith(kind)), len(SEVERITY))


def _resume(found: HostFindings, state: sl.NodeState, apply: bool) -> None:
    """A host a fleet run drained passes now: resumed, unless a reboot is pending or issued (a
    RESUME would cancel it, scontrol(1); the node is judged after the reboot)."""
    if state.reboot_pending:
        print(f"{found.node}: {found.status}; a reboot is "
              f"{'issued' if '^' in state.flags else 'pending'} ({state.state}{state.flags}, "
              f"{state.reason}): left to it, not resumed")
        return
    sl.act(sl.Action("resume", found.node, f"{found.status} in this fleet run; drained by a "
                                           f"fleet run ({state.reason})"), apply)


def act_on_summary(path: Path, prefix: str, apply: bool, max_fraction: float) -> int:
    try:
        summary = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise sl.InputError(f"{path}: fleet summary unreadable: {sl.one_line(str(exc))}") from None
    problem = _validator()(summary)
    if problem:
        raise sl.InputError(f"{path}: not a valid fleet summary: {problem}")
    try:
        per_host = findings(summary)
    except sl.InputError as exc:
        raise sl.InputError(f"{path}: {exc}") from None
    where = membership()
    for found in per_host.values():  # fully qualified NodeNames, NodeHostname != NodeName
        found.node = sl.match_node(found.host, where.hostnames) or found.node
    ours = f"{prefix}:"  # an administrator's drains do not use up the budget
    drained_now = {p: sum(1 for n in nodes if where.states[n].drained
                          and where.states[n].reason.startswith(ours))
                   for p, nodes in where.partitions.items()}
    allowed = {p: max(1, math.floor(max_fraction * len(nodes)))
               for p, nodes in where.partitions.items()}
    fleet_ours = f"{prefix}: fleet "
    failed = False
    for found in per_host.values():
        found.failing.sort(key=_rank)  # the reason names the most severe finding
    for found in sorted(per_host.values(),
                        key=lambda f: (_rank(f.failing[0]) if f.failing else len(SEVERITY), f.host)):
        for note in found.warnings:
            print(f"{found.node}: note: {note}")
        state = where.states.get(found.node, sl.UNKNOWN if sl.offline else None)
        if state is None:
            print(f"{found.node}: not a node of this Slurm cluster; {found.status}, nothing done")
            failed = failed or bool(found.failing)
            continue
        if found.failing:
            failed = True
            reason = _reason(prefix, found)
            if state.drained:
                print(f"{found.node}: already drained ({state.reason or 'no reason'}); "
                      f"fleet finding: {found.failing[0]}")
                continue
            full = [p for p in sorted(where.of_node.get(found.node, ())) if drained_now[p] >= allowed[p]]
            if full:
                p = full[0]
                print(f"{found.node}: held back by the drain guard: partition {p} has "
                      f"{drained_now[p]} of {len(where.partitions[p])} nodes drained, at most "
                      f"{allowed[p]} at once (--max-drain-fraction {max_fraction:g}); would "
                      f"drain: {reason}")
                continue
            for p in where.of_node.get(found.node, ()):
                drained_now[p] += 1
            sl.act(sl.Action("drain", found.node, f"fails: fleet {found.failing[0]}", reason),
                   apply)
        elif found.status in ("ERROR", "MISSING"):
            failed = True
            print(f"{found.node}: {found.status}: could not be judged; reported, not drained "
                  "or resumed")
        elif state.drained and state.reason.startswith(fleet_ours):
            _resume(found, state, apply)
        else:
            print(f"{found.node}: {found.status}; {state.state or 'state unknown'}, nothing to do")
    return sl.EXIT_FAIL if failed else 0
