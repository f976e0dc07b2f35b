"""Drain Slurm nodes that fail nodecert, and resume the ones nodecert drained once they pass.

    python -m checks.fleet.slurm report reports/run1/node07.json --node node07     # dry run
    python -m checks.fleet.slurm report reports/run1/node07.json --node node07 --apply
    python -m checks.fleet.slurm health-check --apply        # HealthCheckProgram: runs checks here
    python -m checks.fleet.slurm prolog                      # Prolog: refuse a node that failed
    python -m checks.fleet.slurm scripts /etc/slurm/nodecert # write the three wrappers slurm.conf names
    python -m checks.fleet.slurm batch-script --nodes 2      # sbatch script: cross-host stage

A failed node is drained with `scontrol update NodeName=<node> State=DRAIN
Reason="NODECERT: <fault code> <check-id> <message>"` (the prefix follows LBNL NHC's `NHC:`
convention). Health-check mode keeps the node's last report in --state-dir (last.json), which
the prolog reads: a job does not start on a node whose last verdict failed. A node
is resumed (`State=RESUME`) only if it is drained with a reason carrying our prefix: a node an
administrator drained stays drained. Dry run by default: the exact command is printed, not run.
The current state and reason come from `sinfo -h -N -n <node> -o '%T|%E'`.

Exit status: 0 the node passes, 1 the node fails (drained, or would be), 2 bad input (unreadable
report, bad options), 3 a Slurm command failed or is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from checks import cliutil
from checks.fleet import load

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
    code = result.get("fault_code") or first.get("code")
    code = f"{code} " if code else ""
    return Verdict(True, f"{code}{first['id']} {_one_line(result['message'])}{more}")


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


STATE_DIR = "/var/lib/nodecert"
LAST = "last.json"


def run_checks(level: str, extra: Sequence[str], timeout_s: float,
               state_dir: Path | None = None) -> Verdict:
    """Run `python -m checks` on this node; a run that crashes or hangs is a failure too. The
    report (or, when none came, a stand-in saying why) is kept as state_dir/last.json."""
    with tempfile.TemporaryDirectory(prefix="nodecert-") as tmp:
        path = Path(tmp) / "report.json"
        result = _run_checks(path, level, extra, timeout_s)
        if state_dir is not None:
            keep_last(state_dir, path, result)
        return result


def keep_last(state_dir: Path, report: Path, result: Verdict) -> None:
    """Replace state_dir/last.json atomically: a prolog reading it never sees half a file."""
    state_dir.mkdir(parents=True, exist_ok=True)
    if report.exists():
        doc = json.loads(report.read_text())
    else:  # the run hung or crashed: the verdict is still FAIL, and says why
        doc = {"verdict": "FAIL", "summary_line": result.summary, "checks": []}
    doc["nodecert_slurm"] = {"failed": result.failed, "summary": result.summary,
                             "at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    tmp = state_dir / f".{LAST}.{os.getpid()}"
    tmp.write_text(json.dumps(doc))
    tmp.replace(state_dir / LAST)


def last_verdict(state_dir: Path) -> Verdict | None:
    """The verdict health-check mode kept, None when it has not run yet."""
    path = state_dir / LAST
    if not path.exists():
        return None
    try:
        doc = json.loads(path.read_text())
        kept = doc["nodecert_slurm"]
        return Verdict(bool(kept["failed"]), str(kept["summary"]))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(f"{path}: unreadable last verdict ({exc})") from exc


def _run_checks(path: Path, level: str, extra: Sequence[str], timeout_s: float) -> Verdict:
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


WRAPPERS = {
    # name: (what slurm.conf calls it, subcommand and options)
    "nodecert-healthcheck": ("HealthCheckProgram", ["health-check", "--apply"]),
    "nodecert-prolog": ("Prolog", ["prolog"]),
    "nodecert-epilog": ("Epilog", ["health-check", "--apply"]),
}


def write_scripts(directory: Path, state_dir: Path, prefix: str, timeout_s: float,
                  checks_args: Sequence[str]) -> list[Path]:
    """Slurm runs a program path without arguments: one small wrapper per role, naming this
    Python (the node's nodecert venv) and SLURM_CONF when one is set."""
    directory.mkdir(parents=True, exist_ok=True)
    conf = os.environ.get("SLURM_CONF")
    written = []
    for name, (_, sub) in WRAPPERS.items():
        args = [*sub, "--prefix", prefix, "--state-dir", str(state_dir)]
        if sub[0] == "health-check":
            args += ["--timeout", f"{timeout_s:g}"]
            if checks_args:
                args += ["--", *checks_args]
        lines = ["#!/bin/sh",
                 f"# {WRAPPERS[name][0]} for Slurm, written by python -m checks.fleet.slurm scripts"]
        if conf:
            lines.append(f"export SLURM_CONF={shlex.quote(conf)}")
        lines.append(f"exec {shlex.quote(sys.executable)} -m checks.fleet.slurm {shlex.join(args)}")
        path = directory / name
        tmp = directory / f".{name}.tmp"
        tmp.write_text("\n".join(lines) + "\n")
        tmp.chmod(0o755)
        tmp.replace(path)
        written.append(path)
    return written


BATCH = """#!/bin/bash
#SBATCH --job-name=nodecert-verify
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node=1
#SBATCH --time={minutes}
#SBATCH --output={out}/%j.log
# Multi-node verification over the nodes Slurm allocated (written by
# `python -m checks.fleet.slurm batch-script`). One task per node: the node's own checks, then
# the cross-host stage (torchrun through python -m checks.node.crosshost_node) with the rendezvous at the
# first node of the allocation, addressed as Slurm knows it (NodeAddr). The batch host then
# builds the fleet report, which names the node or link that broke a group.
set -uo pipefail
python={python}
run={out}/$SLURM_JOB_ID
mkdir -p "$run/crosshost/r0g0"
addr() {{ scontrol show node -o "$1" | tr ' ' '\\n' | sed -n 's/^NodeAddr=//p'; }}
hosts=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | paste -sd, -)
addresses=$(for h in ${{hosts//,/ }}; do printf '"%s": "%s",' "$h" "$(addr "$h")"; done)
"$python" -m checks.fleet.crosshost_plan --hosts "$hosts" --mode all --base-port {port} \\
  --run-id "nodecert-$SLURM_JOB_ID" --addresses "{{${{addresses%,}}}}" > "$run/crosshost/plan.json"
endpoint=$("$python" -c 'import json,sys; print(json.load(sys.stdin)["rounds"][0][0]["endpoint"])' \\
  < "$run/crosshost/plan.json")
export python run endpoint
srun --kill-on-bad-exit=0 --ntasks-per-node=1 bash -c '
  me=$SLURMD_NODENAME
  local=$(scontrol show node -o "$me" | tr " " "\\n" | sed -n "s/^NodeAddr=//p")
  "$python" -m checks --level {level} --json "$run/$me.json" -q {checks_args}
  "$python" -m checks.node.crosshost_node --group r0g0 --nnodes "$SLURM_NNODES" \\
    --node-rank "$SLURM_NODEID" --rdzv-endpoint "$endpoint" --rdzv-id "nodecert-$SLURM_JOB_ID-r0g0" \\
    --local-addr "$local" --host "$me" --json "$run/crosshost/r0g0/$me.json" {node_args}
  true'
exec "$python" -m checks.fleet report "$run" --no-history --json "$run/fleet.json"
"""


def batch_script(nodes: int, out: str, port: int, minutes: int, level: str,
                 checks_args: Sequence[str], node_args: Sequence[str]) -> str:
    return BATCH.format(nodes=nodes, out=shlex.quote(out), port=port, minutes=minutes,
                        level=level, python=shlex.quote(sys.executable),
                        checks_args=shlex.join(checks_args), node_args=shlex.join(node_args))


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
    hc.add_argument("--state-dir", default=STATE_DIR, metavar="DIR",
                    help=f"keep the last report here for the prolog (default {STATE_DIR})")
    hc.add_argument("--budget", metavar="TIME",
                    help="passed to python -m checks --budget: the most valuable checks that fit "
                         "(e.g. 90s; keep it below --timeout)")
    pro = sub.add_parser("prolog", parents=[common],
                         help="Prolog: exit 1 (Slurm then holds the job and drains the node) "
                              "when this node's last verdict failed")
    pro.add_argument("--state-dir", default=STATE_DIR, metavar="DIR")
    sc = sub.add_parser("scripts", parents=[common],
                        help="write nodecert-healthcheck, -prolog and -epilog wrappers for slurm.conf")
    sc.add_argument("directory", metavar="DIR")
    sc.add_argument("--state-dir", default=STATE_DIR, metavar="DIR")
    sc.add_argument("--timeout", type=float, default=120.0, metavar="S",
                    help="health-check time budget (default 120; keep it below HealthCheckInterval)")
    bs = sub.add_parser("batch-script", help="print an sbatch script for multi-node verification")
    bs.add_argument("--nodes", type=int, required=True)
    bs.add_argument("--out", default="reports/slurm", help="report directory (shared by the nodes)")
    bs.add_argument("--port", type=int, default=29400, help="rendezvous port on the first node")
    bs.add_argument("--minutes", type=int, default=30, help="job time limit")
    bs.add_argument("--level", default="quick", choices=("quick", "standard", "burn-in"))
    bs.add_argument("--ifname", help="network interface for NCCL/gloo between the nodes")
    bs.add_argument("--nproc-per-node", type=int, help="ranks per node (default: GPUs, or 1)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    # Everything after "--" goes to python -m checks (health-check, scripts, batch-script).
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    args = cliutil.parse(build_parser(), argv[:cut])
    if isinstance(args, int):
        return args
    args.checks_args = argv[cut + 1:]
    args.prefix = getattr(args, "prefix", DEFAULT_PREFIX)
    if not args.prefix or ":" in args.prefix:
        print("error: --prefix must be non-empty and without ':'", file=sys.stderr)
        return EXIT_USAGE
    try:
        if args.command == "scripts":
            extra = args.checks_args
            for path in write_scripts(Path(args.directory), Path(args.state_dir), args.prefix,
                                      args.timeout, extra):
                print(f"wrote {path} ({WRAPPERS[path.name][0]}={path})")
            return 0
        if args.command == "batch-script":
            if args.nodes < 2:
                raise InputError("--nodes must be at least 2 (the cross-host stage pairs nodes)")
            node_args = [*(["--ifname", args.ifname] if args.ifname else []),
                         *(["--nproc-per-node", str(args.nproc_per_node)]
                           if args.nproc_per_node else [])]
            # Slurm opens --output before the script runs: the directory must exist (on the
            # file system the nodes share).
            Path(args.out).mkdir(parents=True, exist_ok=True)
            out = str(Path(args.out).resolve())
            sys.stdout.write(batch_script(args.nodes, out, args.port, args.minutes, args.level,
                                          args.checks_args, node_args))
            return 0
        if args.command == "prolog":
            kept = last_verdict(Path(args.state_dir))
            if kept is not None and kept.failed:
                print(f"nodecert: this node's last verdict failed: {kept.summary}", file=sys.stderr)
                return EXIT_FAIL
            return 0
        if args.command == "report":
            item = load.read(Path(args.report))
            if item is None or item.report is None:
                why = item.error if item else "a fleet summary, not a host report"
                raise InputError(f"{args.report}: {why}")
            node = args.node or str(item.report["host"]).split(".")[0]
            result = verdict(item.report)
        else:
            extra = [*(["--budget", args.budget] if args.budget else []), *args.checks_args]
            node = args.node or local_node()
            result = run_checks(args.level, extra, args.timeout, Path(args.state_dir))
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
