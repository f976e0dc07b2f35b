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
REASON_MAX = 120  # keep reasons readable in sinfo -R
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


@dataclass(frozen=True)
class NodeState:
    state: str  # sinfo %T, lower case, flags (*~#...) stripped: idle, drained, draining, mixed ...
    reason: str  # "" when none

    @property
    def drained(self) -> bool:
        return "drain" in self.state


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
    reason = f"{prefix}: {summary}"
    return reason if len(reason) <= REASON_MAX else reason[: REASON_MAX - 1] + "…"


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
    reason = reason.strip()
    return NodeState(state.strip().lower().rstrip("*~#!%$@^-"), "" if reason == "none" else reason)


def decide(node: str, result: Verdict, state: NodeState, prefix: str,
           slurm_error_ours: bool = False) -> Action:
    """slurm_error_ours: a "Prolog error"/"Epilog error" drain was caused by our own wrapper."""
    ours = state.reason.startswith(f"{prefix}:") or (
        slurm_error_ours and state.reason.startswith(SLURM_ERROR_REASONS))
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
