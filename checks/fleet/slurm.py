"""Drain Slurm nodes that fail nodecert, and resume the ones nodecert drained once they pass.

    python -m checks.fleet.slurm report reports/run1/node07.json --node node07     # dry run
    python -m checks.fleet.slurm report reports/run1/node07.json --node node07 --apply
    python -m checks.fleet.slurm health-check --apply        # HealthCheckProgram: runs checks here

A failed node is drained with `scontrol update NodeName=<node> State=DRAIN
Reason="NODECERT: <check-id> <message>"` (the prefix follows LBNL NHC's `NHC:` convention). A node
is resumed (`State=RESUME`) only if it is drained with a reason carrying our prefix: a node an
administrator drained stays drained. Dry run by default: the exact command is printed, not run.
The current state and reason come from `sinfo -h -N -n <node> -o '%T|%E'`.

Exit status: 0 the node passes, 1 the node fails (drained, or would be), 2 bad input (unreadable
report, bad options), 3 a Slurm command failed or is missing.
"""

from __future__ import annotations

import argparse
import os
import shlex
import socket
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import cliutil
from . import load

DEFAULT_PREFIX = "NODECERT"
REASON_MAX = 120  # keep reasons readable in sinfo -R
EXIT_FAIL, EXIT_USAGE, EXIT_SLURM = 1, 2, 3
RUN_ID = "nodecert-run"  # stands for the check id in the reason when the checks did not finish


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


@dataclass(frozen=True)
class Verdict:
    failed: bool
    summary: str  # "<check-id> <message>" of the first failure; empty when passed


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


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def verdict(report: dict[str, Any]) -> Verdict:
    """The report's verdict and its first failing check (FAIL before ERROR, in report order)."""
    if report["verdict"] != "FAIL":
        return Verdict(False, "")
    bad = [c for c in report["checks"] if c["status"] in ("FAIL", "ERROR")]
    first = next((c for c in bad if c["status"] == "FAIL"), bad[0] if bad else None)
    if first is None:
        return Verdict(True, "report verdict FAIL")
    result = next(r for r in first["results"] if r["status"] == first["status"])
    more = f" (+{len(bad) - 1} more)" if len(bad) > 1 else ""
    return Verdict(True, f"{first['id']} {_one_line(result['message'])}{more}")


def drain_reason(prefix: str, summary: str) -> str:
    reason = f"{prefix}: {summary}"
    return reason if len(reason) <= REASON_MAX else reason[: REASON_MAX - 1] + "…"


def _run(cmd: list[str], timeout_s: float = 30.0) -> str:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except FileNotFoundError:
        raise SlurmError(f"{cmd[0]} not found on PATH") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{shlex.join(cmd)} timed out after {timeout_s:g} s") from None
    if proc.returncode != 0:
        detail = _one_line(proc.stderr or proc.stdout) or f"exit {proc.returncode}"
        raise SlurmError(f"{shlex.join(cmd)} failed: {detail}")
    return proc.stdout


def node_state(node: str) -> NodeState:
    out = _run(["sinfo", "-h", "-N", "-n", node, "-o", "%T|%E"])
    line = next((ln for ln in out.splitlines() if ln.strip()), None)
    if line is None:
        raise SlurmError(f"sinfo knows no node {node!r}")
    state, _, reason = line.partition("|")
    reason = reason.strip()
    return NodeState(state.strip().lower().rstrip("*~#!%$@^-"), "" if reason == "none" else reason)


def decide(node: str, result: Verdict, state: NodeState, prefix: str) -> Action:
    ours = state.reason.startswith(f"{prefix}:")
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
    if state.drained:
        return Action("none", node, f"passes; drained by someone else ({state.reason or 'no reason'}), "
                                    "not ours to resume")
    return Action("none", node, f"passes; {state.state or 'state unknown'}, nothing to do")


def act(action: Action, apply: bool) -> None:
    cmd = action.command()
    print(f"{action.node}: {action.kind}: {action.why}")
    if cmd is None:
        return
    if apply:
        _run(cmd)
        print(f"ran: {shlex.join(cmd)}")
    else:
        print(f"dry run (--apply to run): {shlex.join(cmd)}")


def local_node() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def run_checks(level: str, extra: Sequence[str], timeout_s: float) -> Verdict:
    """Run `python -m checks` on this node; a run that crashes or hangs is a failure too."""
    with tempfile.TemporaryDirectory(prefix="nodecert-") as tmp:
        path = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "checks", "--level", level, "--json", str(path), "-q", *extra]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            return Verdict(True, f"{RUN_ID} did not finish in {timeout_s:g} s")
        if proc.returncode == 2:
            raise InputError(f"python -m checks: {_one_line(proc.stderr) or 'bad usage'}")
        item = load.read(path) if path.exists() else None
        if item is None or item.report is None:
            why = item.error if item else (_one_line(proc.stderr)[-80:] or f"exit {proc.returncode}")
            return Verdict(True, f"{RUN_ID} did not complete: {why}")
        return verdict(item.report)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m checks.fleet.slurm",
                                description="Drain failed Slurm nodes, resume the ones nodecert drained.",
                                epilog="Exit status: 0 node passes, 1 node fails, 2 bad input, "
                                       "3 Slurm command failed. Dry run unless --apply.")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--prefix", default=DEFAULT_PREFIX,
                        help=f"reason prefix that marks nodecert's drains (default {DEFAULT_PREFIX})")
    common.add_argument("--apply", action="store_true", help="run scontrol (default: print the command)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    rep = sub.add_parser("report", parents=[common], help="act on a host report (JSON)")
    rep.add_argument("report", metavar="FILE", help="host report from python -m checks --json")
    rep.add_argument("--node", help="Slurm node name (default: the report's host, short name)")
    hc = sub.add_parser("health-check", parents=[common],
                        help="run python -m checks here, then act on this node (HealthCheckProgram)")
    hc.add_argument("--node", help="Slurm node name (default: $SLURMD_NODENAME, else hostname -s)")
    hc.add_argument("--level", default="quick", choices=("quick", "standard", "burn-in"),
                    help="check level (default quick: seconds, safe between jobs)")
    hc.add_argument("--timeout", type=float, default=300.0, metavar="S",
                    help="a check run longer than this is a failure (default 300)")
    hc.add_argument("checks_args", nargs=argparse.REMAINDER, metavar="-- ARGS",
                    help="further options for python -m checks (after --)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = cliutil.parse(build_parser(), argv)
    if isinstance(args, int):
        return args
    if not args.prefix or ":" in args.prefix:
        print("error: --prefix must be non-empty and without ':'", file=sys.stderr)
        return EXIT_USAGE
    try:
        if args.command == "report":
            item = load.read(Path(args.report))
            if item is None or item.report is None:
                why = item.error if item else "a fleet summary, not a host report"
                raise InputError(f"{args.report}: {why}")
            node = args.node or str(item.report["host"]).split(".")[0]
            result = verdict(item.report)
        else:
            extra = [a for a in args.checks_args if a != "--"]
            node = args.node or local_node()
            result = run_checks(args.level, extra, args.timeout)
        act(decide(node, result, node_state(node), args.prefix), args.apply)
    except (InputError, ImportError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except SlurmError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_SLURM
    return EXIT_FAIL if result.failed else 0


if __name__ == "__main__":
    sys.exit(main())
