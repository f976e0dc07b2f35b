"""What nodecert says to Slurm, shared by the wrappers (slurm_gate), the fleet summary
(slurm_fleet), the batch script (slurm_batch) and the command line (slurm): one node name,
the verdict of a report, the drain reason, sinfo/scontrol calls and the drain/resume decision."""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
from dataclasses import dataclass
from typing import Any

from checks.supervise import procs


@dataclass(frozen=True)
class Verdict:
    failed: bool
    summary: str  # "<check-id> <message>" of the first failure; empty when passed


def one_line(text: str) -> str:
    return " ".join(str(text).split())


DEFAULT_PREFIX = "NODECERT"
# Slurm keeps a reason of any length (scontrol(1) sets no limit; 22.05 kept and printed 4809
# characters, tests/fleet/test_slurm_guards.py), but `sinfo -R` shows its first 20 characters
# (sinfo(1)) and a terminal line ~120: the reason is cut for people reading it, never for Slurm.
# What it keeps is what a ticket rule and an operator key on (drain_reason); the whole summary
# stays in the kept report (last.json: nodecert_slurm.summary).
REASON_MAX = 120
MORE = re.compile(r" \(\+\d+ more\)$")  # verdict()'s count of the other failing checks
EXIT_FAIL, EXIT_USAGE, EXIT_SLURM = 1, 2, 3
# One Slurm node name: scontrol expands "gpu[001-512]", "a,b" and ALL into many nodes, so none
# of these may come from a report (hostname(7) characters, at most 63 per label as DNS allows).
NODE_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,252})")
RESERVED_NODE_NAMES = {"all"}  # scontrol(1): NodeName=ALL means every node
SLURM_ERROR_REASONS = ("Prolog error", "Epilog error")  # what slurmctld sets (slurm.conf(5))
call_timeout_s = 30.0  # each sinfo/scontrol call; the wrappers pass the slurm.conf deadline
# --dry-run: no sinfo or scontrol call at all (a preview on a machine without slurmctld): every
# node's state is UNKNOWN, node names are taken as given, and act() prints what it would run.
offline = False


class SlurmError(Exception):
    """A Slurm command is missing or failed (one-line message)."""


class InputError(Exception):
    """Bad report or options (one-line message)."""


# The flags sinfo's %T appends to a state (sinfo(1), NODE STATE CODES): * not responding,
# ~ powered off, # powering up, ! pending power down, % powering down, $ maintenance reservation,
# @ reboot pending, ^ reboot issued, - planned by the backfill scheduler.
STATE_FLAGS = "*~#!%$@^-"
REBOOT_FLAGS = "@^"


@dataclass(frozen=True)
class NodeState:
    state: str  # sinfo %T, lower case, without its flags: idle, drained, draining, mixed, reboot ...
    reason: str  # "" when none
    flags: str = ""  # the flags sinfo appended (STATE_FLAGS), kept: @ and ^ say a reboot is due

    @property
    def drained(self) -> bool:
        return "drain" in self.state

    @property
    def reboot_pending(self) -> bool:
        """A reboot is requested or issued (`scontrol reboot`; sinfo's @ or ^, or the state
        REBOOT_REQUESTED / REBOOT_ISSUED that sinfo prints as "reboot..."). A RESUME would
        cancel a requested reboot (scontrol(1)), so nodecert leaves such a node to it."""
        return any(f in self.flags for f in REBOOT_FLAGS) or self.state.startswith("reboot")


def parse_state(text: str, reason: str) -> NodeState:
    """One node's sinfo `%T` and `%E`, its flags kept apart from the state."""
    raw = text.strip().lower()
    state = raw.rstrip(STATE_FLAGS)
    reason = reason.strip()
    return NodeState(state, "" if reason == "none" else reason, raw[len(state):])


UNKNOWN = NodeState("state unknown (--dry-run: Slurm not asked)", "")


@dataclass(frozen=True)
class Action:
    kind: str  # "drain", "resume" or "none"
    node: str
    why: str
    reason: str = ""

    def command(self) -> list[str] | None:
        if self.kind == "drain":
            return ["scontrol", "update", f"NodeName={self.node}", "State=DRAIN", f"Reason={self.reason}"]
        if self.kind == "resume":
            return ["scontrol", "update", f"NodeName={self.node}", "State=RESUME"]
        return None


def node_name(text: str, what: str = "node name") -> str:
    """`text` when it names exactly one Slurm node, else InputError (one line)."""
    if (not isinstance(text, str) or not NODE_NAME.fullmatch(text)
            or text.lower() in RESERVED_NODE_NAMES):
        raise InputError(f"{what} {text!r} is not one Slurm node name (letters, digits, '-', '_', "
                         "'.'; no ranges, lists, ALL, spaces or control characters)")
    return text


def verdict(report: dict[str, Any]) -> Verdict:
    """The report's first failing check (FAIL before ERROR, in report order). The verdict is
    computed from the checks, not taken from the report's `verdict` field."""
    bad = [c for c in report["checks"] if c["status"] in ("FAIL", "ERROR")]
    if not bad and report["verdict"] != "FAIL":
        return Verdict(False, "")
    first = next((c for c in bad if c["status"] == "FAIL"), bad[0] if bad else None)
    if first is None:
        return Verdict(True, "report verdict FAIL")
    result: dict[str, Any] = next(
        (r for r in first["results"] if r["status"] == first["status"]), {})
    more = f" (+{len(bad) - 1} more)" if len(bad) > 1 else ""
    code = result.get("fault_code") or first.get("code")
    code = f"{code} " if code else ""
    message = one_line(result.get("message") or first["status"])
    return Verdict(True, f"{code}{first['id']} {message}{more}")


def drain_reason(prefix: str, summary: str) -> str:
    """`<prefix>: <summary>` within REASON_MAX characters: a long message is cut at a word
    boundary with "...", keeping the fault code and check id in front and the "(+N more)"
    count of the other failing checks at the end."""
    reason = f"{prefix}: {one_line(summary)}"
    if len(reason) <= REASON_MAX:
        return reason
    more = MORE.search(reason)
    tail = more.group(0) if more else ""
    room = REASON_MAX - len(tail) - len("...")
    cut = reason[:room]
    word = cut.rsplit(" ", 1)[0]
    if len(word) > room * 2 // 3:  # a boundary near the end; else one long word is cut
        cut = word
    return f"{cut.rstrip(' ,;:')}...{tail}"


def run(cmd: list[str], timeout_s: float | None = None) -> str:
    if offline:  # a path that would still ask Slurm fails loudly instead
        raise SlurmError(f"--dry-run: {shlex.join(cmd)} not run (no Slurm is asked in a dry run)")
    timeout_s = call_timeout_s if timeout_s is None else timeout_s
    try:
        proc = procs.run(cmd, timeout_s=timeout_s, text=True)
    except FileNotFoundError:
        raise SlurmError(f"{cmd[0]} not found on PATH") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{shlex.join(cmd)} timed out after {timeout_s:g} s") from None
    if proc.returncode != 0:
        detail = one_line(proc.stderr or proc.stdout) or f"exit {proc.returncode}"
        raise SlurmError(f"{shlex.join(cmd)} failed: {detail}")
    return proc.stdout


def node_state(node: str) -> NodeState:
    if offline:
        return UNKNOWN
    out = run(["sinfo", "-h", "-N", "-n", node, "-o", "%T|%E"])
    line = next((ln for ln in out.splitlines() if ln.strip()), None)
    if line is None:
        raise SlurmError(f"sinfo knows no node {node!r}")
    state, _, reason = line.partition("|")
    return parse_state(state, reason)


# The remediation loop's own reasons (checks.fleet.remediate: "<prefix>: REBOOT ...", "VERIFY",
# "RESET", "RMA", "HOLD", and "CLAIM" while it takes a place in its budget): a health check or
# Prolog neither resumes such a node (only a verification at the level that caught the fault
# does) nor hides the stage behind a new reason.
REMEDIATION_WORDS = ("CLAIM", "RESET", "REBOOT", "VERIFY", "RMA", "HOLD")


def held_by_remediation(reason: str, prefix: str) -> bool:
    head = reason[len(prefix) + 1:].split(None, 1) if reason.startswith(f"{prefix}:") else []
    return bool(head) and head[0] in REMEDIATION_WORDS


def decide(node: str, result: Verdict, state: NodeState, prefix: str,
           slurm_error_ours: bool = False) -> Action:
    """slurm_error_ours: a "Prolog error"/"Epilog error" drain was caused by our own wrapper."""
    ours = state.reason.startswith(f"{prefix}:") or (
        slurm_error_ours and state.reason.startswith(SLURM_ERROR_REASONS))
    if state.reboot_pending and (state.drained or not result.failed):
        # An administrator's (or the remediation's) reboot decides what the node does next; a
        # RESUME would cancel it and a new reason would hide it. The health check slurmd runs
        # after the reboot judges the node again. Only a node still in service that fails is
        # drained: a pending plain `scontrol reboot` does not keep new jobs off it.
        return Action("none", node, f"{'fails' if result.failed else 'passes'}; a reboot is "
                                    f"{'issued' if '^' in state.flags else 'pending'} "
                                    f"({state.state}{state.flags}, {state.reason or 'no reason'}): "
                                    "left to it, not resumed")
    if ours and held_by_remediation(state.reason, prefix):
        return Action("none", node, f"{'fails' if result.failed else 'passes'}; held by nodecert's "
                                    f"remediation ({state.reason}): it verifies and resumes")
    if result.failed:
        reason = drain_reason(prefix, result.summary)
        if state.drained and not ours:
            return Action("none", node, f"already drained by someone else ({state.reason or 'no reason'}); "
                                        "left as it is")
        if state.drained and state.reason == reason:
            return Action("none", node, f"already drained: {reason}")
        return Action("drain", node, f"fails: {result.summary}", reason)
    if state.drained and ours:
        return Action("resume", node, f"passes; drained by nodecert ({state.reason})")
    if state == UNKNOWN:  # a dry run cannot tell: show the resume it would run if ours
        return Action("resume", node, f"passes; resumed only if drained with a '{prefix}:' reason "
                                      "(--dry-run: its state was not read)")
    if state.drained:
        return Action("none", node, f"passes; drained by someone else ({state.reason or 'no reason'}), "
                                    "not ours to resume")
    return Action("none", node, f"passes; {state.state or 'state unknown'}, nothing to do")


def act(action: Action, apply: bool) -> None:
    cmd = action.command()
    print(f"{action.node}: {action.kind}: {action.why}")
    if cmd is None:
        return
    if offline:
        print(f"dry run, Slurm not asked (--dry-run): {shlex.join(cmd)}")
    elif apply:
        run(cmd)
        print(f"ran: {shlex.join(cmd)}")
    else:
        print(f"dry run (--apply to run): {shlex.join(cmd)}")


def node_hostnames() -> dict[str, str]:
    """Every node's NodeName and NodeHostname (one `sinfo -N`; the hostname is the NodeName
    when slurm.conf sets none)."""
    out = run(["sinfo", "-h", "-N", "-o", "%N|%n"])
    pairs = (line.split("|", 1) for line in out.splitlines() if "|" in line)
    return {name.strip(): host.strip() for name, host in pairs if name.strip()}


def match_node(host: str, nodes: dict[str, str]) -> str | None:
    """The NodeName a host name stands for, matched exactly (no case folding, no prefixes): a
    NodeName equal to it, else the one node whose NodeHostname equals it; then the same for its
    short name (before the first '.'). `nodes`: NodeName -> NodeHostname. None when nothing
    matches, or when several nodes share that NodeHostname (several slurmd on one host)."""
    for name in dict.fromkeys([host, host.split(".")[0]]):
        if name in nodes:
            return name
        by_host = [node for node, hostname in nodes.items() if hostname == name]
        if len(by_host) == 1:
            return by_host[0]
    return None


def resolve_node(host: str) -> str:
    """match_node against the cluster (one sinfo call); SlurmError when it knows no such node.
    In a dry run, the host name as it is."""
    if offline:
        return host
    found = match_node(host, node_hostnames())
    if found is None:
        raise SlurmError(f"sinfo knows no node for host {host!r} (matched exactly: a NodeName "
                         "or NodeHostname equal to the full, then the short name)")
    return found


def local_node() -> str:
    """This node's NodeName: $SLURMD_NODENAME, which slurmd sets for the programs it runs, taken
    as it is; elsewhere (cron, by hand) this host's name matched against the cluster's nodes
    (resolve_node: fully qualified NodeNames, NodeHostname != NodeName)."""
    return os.environ.get("SLURMD_NODENAME") or resolve_node(socket.gethostname())
