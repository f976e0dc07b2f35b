"""Back into service: one remediation step per run for this node, when nodecert drained it.

    python -m checks.fleet.slurm remediate                 # dry run: what it would do, every scontrol
    python -m checks.fleet.slurm remediate --apply         # what DIR/nodecert-remediate runs (a timer)
    python -m checks.fleet.slurm remediate --reset-breaker --apply

It runs on the node it remediates, like the health check (`scripts DIR` writes the wrapper with
the same --state-dir, --prefix and check options): only there can a GPU be reset, the node be
verified at the level that caught the fault (minutes: no HealthCheckProgram's 60 s), and the
report, the kernel log and the attempts be kept. The state directory holds the node's record
(remediation/node.json), the append-only action log (remediation/actions.jsonl) and the
evidence; slurmctld holds what every node sees (state, reason, reboot flags), read with one sinfo.

The stages, each shown in the Slurm reason so that `sinfo -R` tells the story:

    detected   (the health check's reason)     the remedy comes from the report (checks.report.remedy)
    reset      NODECERT: RESET <code> n/N       the GPUs the fault names are reset, a marker kept
    rebooting  NODECERT: REBOOT <code> n/N      scontrol reboot ASAP nextstate=DOWN: Slurm waits for jobs
    verify     NODECERT: VERIFY <code> ...      python -m checks at the level that caught it (standard+)
    in-service (resumed)                        only after a passing verification
    escalated  NODECERT: RMA <code> <serial> bundle <path>   never resumed by nodecert
    held       NODECERT: HOLD <class> <code> ...             reprovision / none: a person decides

Guards: only nodes drained with our reason; a node with a reboot pending or issued is never
touched; an administrator's drain, reason, reboot or RESUME ends nodecert's hold (released); the
state is read again before each action; one run at a time (flock on the state directory's lock,
shared with the health check); at most --max-remediating nodes (and --max-remediating-fraction of
a partition) in remediation at once; a breaker that stops new remedies when --breaker-drains nodes
were drained by nodecert within --breaker-window, until --reset-breaker. Exit status: 0 the step
was taken (or there was none), 1 the step failed (the node stays drained), 2 bad input, 3 a Slurm
command failed.

This module decides the step and holds the command; the steps themselves are in
remediate_actions (reboot, reset, verify, resume, escalate, hold, release), the budget and
breaker in remediate_guard, the evidence, bundle and textfile in remediate_evidence, and the
record, the sinfo view and the action log in remediate_state.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from checks import cliutil
from checks.fleet import slurm_control as control
from checks.fleet import slurm_gate as gate
from checks.fleet.remediate_actions import after_reboot, escalate, hold, reboot, release, reset, verify
from checks.fleet.remediate_evidence import keep_evidence, publish, remedy_of, verify_level
from checks.fleet.remediate_guard import breaker_open, claim, reset_breaker
from checks.fleet.remediate_state import (
    DAY_S,
    DIR,
    HELD_WORDS,
    JOB_STATES,
    LEVELS,
    RECORD,
    TEXTFILE,
    Policy,
    Record,
    Run,
    Seen,
    Stopped,
)


def count_remedies(run: Run, rec: Record) -> int:
    """Remedies this loop took for the same fault on the same GPU (or node) within the window."""
    since = time.time() - run.policy.repeat_window_s
    gpus = set(rec.gpus)
    return sum(1 for e in run.history()
               if e.get("action") in ("gpu-reset", "reboot", "recheck") and e.get("result") == "ok"
               and float(e.get("t", 0)) >= since and e.get("fault") == rec.fault
               and ((not gpus and not e.get("gpus")) or gpus & set(e.get("gpus") or ())))


def count_cycles(run: Run) -> int:
    since = time.time() - DAY_S
    return sum(1 for e in run.history()
               if e.get("action") == "resume" and e.get("result") == "ok" and float(e.get("t", 0)) >= since)


def detect(run: Run, seen: Seen) -> Record:
    """A new drain of ours: the remedy, the evidence, the record."""
    kind, fault, gpus, serials, why, level = remedy_of(run.state_dir, seen.state.reason, run.prefix)
    rec = Record(stage="detected", fault=fault, remedy=kind, gpus=gpus, serials=serials, why=why,
                 level=verify_level(level, run.policy.min_level), reason=seen.state.reason,
                 since=time.time())
    path = keep_evidence(run, rec, why)
    if path:
        rec.evidence.append(path)
    run.log("detect", "ok", "in-service", "detected", rec, f"{seen.state.reason} -> remedy {kind}: {why}")
    run.save(rec)
    return rec


def escalation_due(run: Run, rec: Record) -> str:
    """Why this drain escalates instead of another remedy ("" when it does not)."""
    if rec.remedy == "rma":
        return f"the fault calls for an RMA: {rec.why}"
    cycles = count_cycles(run)
    if cycles >= run.policy.flap_limit:
        return (f"flapping: {cycles} drain/resume cycles within a day (at most "
                f"{run.policy.flap_limit - 1})")
    done = count_remedies(run, rec)
    if done >= run.policy.repeat_limit:
        where = f" on {', '.join(rec.gpus)}" if rec.gpus else ""
        return (f"{rec.fault}{where} after {done} remedies within "
                f"{run.policy.repeat_window_s / DAY_S:g} days (at most {run.policy.repeat_limit})")
    return ""


def remedy_step(run: Run, seen: Seen, rec: Record) -> int:
    """detected: escalate, hold, or start the remedy (reset, reboot, recheck)."""
    why = escalation_due(run, rec)
    if why:
        return escalate(run, rec, why)
    if rec.remedy in ("none", "reprovision"):
        return hold(run, rec)
    if breaker_open(run):
        run.log("wait", "breaker", "detected", "detected", rec,
                "the breaker is open: no new remedies (remediate --reset-breaker)")
        return 0
    n = f"{rec.attempt + 1}/{run.policy.repeat_limit}"
    jobs = seen.state.state in JOB_STATES
    if rec.remedy == "reboot":
        return reboot(run, rec, n, jobs)
    if jobs:
        run.log("wait", "jobs", "detected", "detected", rec,
                f"jobs still run ({seen.state.state}): a {rec.remedy} never kills a job")
        return 0
    if rec.remedy == "gpu-reset":
        return reset(run, rec, n)
    reason = f"{run.prefix}: VERIFY {rec.fault} recheck {n}, level {rec.level}"
    if not claim(run, rec, reason, "detected"):
        return 0
    rec.attempt += 1
    rec.stage, rec.reason = "verify", reason
    run.save(rec)
    run.log("recheck", "ok", "detected", "verify", rec, f"checked again at level {rec.level}")
    return verify(run, rec)


def step(run: Run) -> int:
    """The one step this run takes for this node."""
    seen = run.look()
    rec = Record.load(run.directory / RECORD)
    state, reason = seen.state, seen.state.reason
    stage = rec.stage if rec else "in-service"
    if rec and stage == "rebooting":
        return after_reboot(run, seen, rec)
    if state.reboot_pending:
        run.log("wait", "reboot", stage, stage, rec,
                f"a reboot is pending ({state.state}{state.flags}, {reason or 'no reason'}): left to it")
        return 0
    if not run.ours(reason) or not (state.drained or state.state == "down"):
        if rec and stage in ("detected", "verify", "escalated", "held"):
            return release(run, rec, seen, "an administrator changed the node")
        print(f"{run.node}: nothing to do ({state.state}{state.flags}, {reason or 'no reason'})")
        return 0
    if rec and stage in ("escalated", "held"):
        if reason != rec.reason:
            return release(run, rec, seen, "the reason is no longer the one nodecert set")
        print(f"{run.node}: {stage}: {reason} (never resumed by nodecert)")
        return 0
    if rec and stage in ("detected", "verify") and reason != rec.reason \
            and run.word(reason) not in HELD_WORDS and run.word(rec.reason):
        # the health check drained it again for a new fault while the loop held it
        rec.reason = reason
    if not rec or stage in ("in-service", "released"):
        if run.word(reason):
            print(f"{run.node}: {reason}: set by another nodecert loop; left as it is")
            return 0
        rec = detect(run, seen)
    if rec.stage == "verify":
        return verify(run, rec)
    return remedy_step(run, seen, rec)


@contextlib.contextmanager
def _signals_stop() -> Iterator[None]:
    """SIGTERM, SIGINT and SIGHUP end the run through an exception: its children (the check
    run, nvidia-smi) are killed on the way out."""

    def stop(signum: int, frame: object) -> None:
        raise Stopped(f"signal {signum}")

    old = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def add_parser(sub: Any, common: argparse.ArgumentParser, node_help: str, state_dir: str) -> None:
    p = sub.add_parser("remediate", parents=[common],
                       help="one remediation step for this node when nodecert drained it "
                            "(reset, reboot, verify, resume or escalate); a timer runs it")
    p.add_argument("--node", help=node_help)
    p.add_argument("--state-dir", default=state_dir, metavar="DIR",
                   help=f"the health check's state directory (default {state_dir})")
    p.add_argument("--textfile-dir", metavar="DIR",
                   help=f"node_exporter textfile directory: write DIR/{TEXTFILE}")
    p.add_argument("--reset-breaker", action="store_true",
                   help="close the breaker: drains before now no longer count")
    num = cliutil.number
    p.add_argument("--repeat-limit", type=num(int, minimum=1), default=Policy.repeat_limit, metavar="N",
                   help="escalate after N remedies of one fault on one GPU within --repeat-window "
                        f"(default {Policy.repeat_limit})")
    p.add_argument("--repeat-window", type=num(float, above=0), default=Policy.repeat_window_s / DAY_S,
                   metavar="DAYS", help="default 7")
    p.add_argument("--flap-limit", type=num(int, minimum=1), default=Policy.flap_limit, metavar="N",
                   help=f"escalate at N drain/resume cycles within a day (default {Policy.flap_limit})")
    p.add_argument("--max-remediating", type=num(int, minimum=1), default=Policy.max_remediating,
                   metavar="K", help=f"nodes in remediation at once (default {Policy.max_remediating})")
    p.add_argument("--max-remediating-fraction", type=num(float, above=0, maximum=1),
                   default=Policy.max_fraction, metavar="P",
                   help="and at most this share of a partition, at least one node (default 0.10)")
    p.add_argument("--breaker-drains", type=num(int, minimum=1), default=Policy.breaker_drains,
                   metavar="N", help="open the breaker when N nodes were drained by nodecert within "
                                     f"--breaker-window (default {Policy.breaker_drains})")
    p.add_argument("--breaker-window", type=num(float, above=0), default=Policy.breaker_window_s,
                   metavar="S", help="default 3600")
    p.add_argument("--verify-timeout", type=num(float, above=0), default=Policy.verify_timeout_s,
                   metavar="S", help="the verification's deadline (default 1800); the timer's "
                                     "limit must be longer")
    p.add_argument("--keep-evidence", type=num(int, minimum=1), default=Policy.keep_evidence,
                   metavar="N", help="evidence directories kept per node (default 5)")
    p.add_argument("--min-level", choices=LEVELS[1:], default=Policy.min_level,
                   help="the least level a verification runs at (default standard)")


def main(args: argparse.Namespace) -> int:
    """The subcommand (checks.fleet.slurm dispatches here)."""
    policy = Policy(args.repeat_limit, args.repeat_window * DAY_S, args.flap_limit,
                    args.max_remediating, args.max_remediating_fraction, args.breaker_drains,
                    args.breaker_window, args.verify_timeout, args.keep_evidence, args.min_level)
    if control.offline:
        print(f"{args.node}: --dry-run asks no Slurm daemon: the node's state is unknown, so no "
              "step can be chosen; run without --dry-run (no --apply) to see the step and its "
              "scontrol commands")
        return 0
    state_dir = Path(args.state_dir)
    run = Run(args.node, state_dir / DIR, state_dir, args.prefix, args.apply, policy,
              list(args.checks_args), Path(args.textfile_dir) if args.textfile_dir else None)
    try:
        with _signals_stop(), gate.state_lock(state_dir, wait_s=2.0, create=args.apply) as held:
            if not held:
                print(f"{run.node}: another nodecert run holds {state_dir / gate.LOCK}: it acts",
                      file=sys.stderr)
                return 0
            code = reset_breaker(run) if args.reset_breaker else step(run)
            publish(run)
            return code
    except FileNotFoundError as exc:
        if not args.apply and exc.filename and str(exc.filename).startswith(str(state_dir)):
            print(f"{run.node}: no state directory {state_dir}: nothing remediated here yet")
            return 0
        raise
    except Stopped as exc:
        print(f"error: {run.node}: remediation stopped ({exc}); the node stays drained",
              file=sys.stderr)
        return 1
    except gate.StateError as exc:
        print(f"error: {run.node}: {exc}", file=sys.stderr)
        return control.EXIT_USAGE


def wrapper_lines(python: str, scontrol: str, prefix: str, state_dir: Path, call_s: float,
                  textfile_dir: str | None, checks_args: Sequence[str]) -> list[str]:
    """DIR/nodecert-remediate: the command a systemd timer or cron runs on each node, with the
    health check's state directory, prefix and check options. Not a Slurm program: a failed
    step leaves the node drained (nothing to fail closed)."""
    q = shlex.quote
    args = ["remediate", "--apply", "--prefix", prefix, "--state-dir", str(state_dir),
            "--slurm-timeout", f"{call_s:g}"]
    if textfile_dir:
        args += ["--textfile-dir", textfile_dir]
    tail = f" -- {shlex.join(checks_args)}" if checks_args else ""
    path = ":".join(dict.fromkeys([str(Path(scontrol).parent), "/usr/local/sbin", "/usr/local/bin",
                                   "/usr/sbin", "/usr/bin", "/sbin", "/bin"]))
    lines = ["#!/bin/sh",
             "# the remediation loop, one step per run: for a systemd timer or cron (docs/operations.md);",
             "# written by python -m checks.fleet.slurm scripts",
             f"PATH={q(path)}${{PATH:+:$PATH}}; export PATH",
             f"NODECERT_STATE_DIR={q(str(state_dir))}; export NODECERT_STATE_DIR"]
    conf = os.environ.get("SLURM_CONF")
    if conf:
        lines.append(f"export SLURM_CONF={q(conf)}")
    # "$@": an operator's options for this run (--reset-breaker, a limit), before the checks'
    return [*lines, f'exec {q(python)} -m checks.fleet.slurm {shlex.join(args)} "$@"{tail}']
