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
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import re
import shlex
import signal
import sys
import tarfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from checks import cliutil, safeio
from checks.fleet import slurm_control as control
from checks.fleet import slurm_gate as gate
from checks.fleet.slurm_control import NodeState, SlurmError, one_line, parse_state
from checks.hw import kernel_log

DIR = "remediation"
RECORD = "node.json"
LOG = "actions.jsonl"
BREAKER = "breaker.json"
EVIDENCE = "evidence"
BUNDLES = "bundles"
TEXTFILE = "nodecert-remediation.prom"
LOG_TAIL_BYTES = 4 << 20  # the history a decision reads: the log's last 4 MiB
LEVELS = ("quick", "standard", "burn-in")
STAGES = ("detected", "rebooting", "verify", "in-service", "escalated", "held", "released")
ACTIVE = ("detected", "rebooting", "verify")  # what the budget counts, and the stuck alert
# The words after "<prefix>: " that mark a reason as the loop's own: the health check and the
# Prolog leave such a node to it (checks.fleet.slurm_control.decide).
HELD_WORDS = control.REMEDIATION_WORDS
PARKED_WORDS = ("RMA", "HOLD")  # waiting for a person: not counted by the breaker
JOB_STATES = ("mixed", "allocated", "completing", "draining")
RESERVATION = "nodecert_{node}"
DAY_S = 86400.0
MAINT_WAIT_S = 15.0  # how long a reboot waits for slurmctld to mark the reservation (sinfo $)


class Stopped(Exception):
    """SIGTERM/SIGINT/SIGHUP (a timer's stop, a shutdown): the run ends, the node stays drained."""


@dataclass(frozen=True)
class Policy:
    repeat_limit: int = 2  # remedies of one fault on one GPU before it escalates ...
    repeat_window_s: float = 7 * DAY_S  # ... within this window
    flap_limit: int = 3  # drain/resume cycles within a day before it escalates
    max_remediating: int = 2  # nodes in remediation at once (K)
    max_fraction: float = 0.10  # ... and this share of a partition (P; at least one node)
    breaker_drains: int = 5  # nodes drained by nodecert within the window that open the breaker
    breaker_window_s: float = 3600.0
    verify_timeout_s: float = 1800.0
    keep_evidence: int = 5
    min_level: str = "standard"


@dataclass
class Record:
    """The node's remediation state (remediation/node.json)."""

    stage: str = "in-service"
    fault: str = ""
    remedy: str = ""
    gpus: list[str] = field(default_factory=list)
    serials: list[str] = field(default_factory=list)
    why: str = ""
    level: str = "standard"
    attempt: int = 0  # remedies taken for this drain
    reason: str = ""  # the Slurm reason this loop last set (or adopted)
    since: float = 0.0
    reboot_issued_at: float = 0.0
    reservation: str = ""
    evidence: list[str] = field(default_factory=list)
    bundle: str = ""

    @classmethod
    def load(cls, path: Path) -> Record | None:
        try:
            doc = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise gate.StateError(f"{path.name} unreadable: {one_line(str(exc))}") from None
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in doc.items() if k in names}) if isinstance(doc, dict) else None


@dataclass(frozen=True)
class Seen:
    """One node as the cluster-wide sinfo shows it."""

    name: str
    state: NodeState
    partitions: tuple[str, ...]
    reason_at: float | None  # when the reason was set (sinfo %H), None when unknown


@dataclass
class Run:
    node: str
    directory: Path  # state_dir/remediation
    state_dir: Path
    prefix: str
    apply: bool
    policy: Policy
    checks_args: list[str]
    textfile_dir: Path | None
    cluster: dict[str, Seen] = field(default_factory=dict)
    exit: int = 0

    # -- reading -------------------------------------------------------------------------------
    def look(self) -> Seen:
        """Read the cluster again (one sinfo): every decision is taken on a fresh state."""
        out = control.run(["sinfo", "-h", "-N", "-o", "%N|%P|%T|%H|%E"])
        merged: dict[str, tuple[NodeState, list[str], float | None]] = {}
        for line in out.splitlines():
            parts = [p.strip() for p in line.split("|", 4)]
            if len(parts) != 5 or not parts[0]:
                continue
            state = parse_state(parts[2], parts[4])
            entry = merged.setdefault(parts[0], (state, [], _slurm_time(parts[3])))
            entry[1].append(parts[1].rstrip("*"))
        self.cluster = {n: Seen(n, s, tuple(p), t) for n, (s, p, t) in merged.items()}
        if self.node not in self.cluster:
            raise SlurmError(f"sinfo knows no node {self.node!r}")
        return self.cluster[self.node]

    def ours(self, reason: str) -> bool:
        return reason.startswith(f"{self.prefix}:")

    def word(self, reason: str) -> str:
        """The loop's own word in a reason of ours ("" for the health check's reasons)."""
        if not self.ours(reason):
            return ""
        head = reason[len(self.prefix) + 1:].split(None, 1)
        return head[0] if head and head[0] in HELD_WORDS else ""

    # -- the log and the record ---------------------------------------------------------------
    def log(self, action: str, result: str, before: str, after: str, rec: Record | None,
            detail: str = "", command: list[str] | None = None) -> None:
        """One line of the append-only action log (only when applying), and the run's output."""
        entry: dict[str, Any] = {
            "t": round(time.time(), 3), "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "node": self.node, "action": action, "result": result, "stage_before": before,
            "stage_after": after, "fault": rec.fault if rec else "",
            "gpus": list(rec.gpus) if rec else [], "remedy": rec.remedy if rec else "",
            "attempt": rec.attempt if rec else 0, "detail": detail}
        if command:
            entry["command"] = shlex.join(command)
        print(f"{self.node}: {action} ({result}): {before} -> {after}" + (f": {detail}" if detail else ""))
        if self.apply:
            self.directory.mkdir(parents=True, exist_ok=True)
            with open(self.directory / LOG, "a", encoding="utf-8") as f:
                f.write(json.dumps(entry) + "\n")
                f.flush()
                os.fsync(f.fileno())

    def history(self) -> list[dict[str, Any]]:
        path = self.directory / LOG
        try:
            with path.open("rb") as f:
                f.seek(max(0, path.stat().st_size - LOG_TAIL_BYTES))
                data = f.read().decode("utf-8", "replace")
        except OSError:
            return []
        found = []
        for line in data.splitlines():
            with contextlib.suppress(ValueError):
                doc = json.loads(line)
                if isinstance(doc, dict) and doc.get("node") == self.node:
                    found.append(doc)
        return found

    def save(self, rec: Record) -> None:
        if self.apply:
            self.directory.mkdir(parents=True, exist_ok=True)
            safeio.write_text(self.directory / RECORD, json.dumps(dataclasses.asdict(rec), indent=1))

    # -- Slurm ----------------------------------------------------------------------------------
    def slurm(self, cmd: list[str], what: str) -> None:
        """Run a Slurm command (or print it: a dry run)."""
        if self.apply:
            control.run(cmd)
            print(f"ran: {shlex.join(cmd)}")
        else:
            print(f"dry run (--apply to run): {shlex.join(cmd)}  # {what}")

    def set_reason(self, reason: str) -> list[str]:
        cmd = ["scontrol", "update", f"NodeName={self.node}", "State=DRAIN", f"Reason={reason}"]
        self.slurm(cmd, "drained, with the stage in the reason")
        return cmd


def _slurm_time(text: str) -> float | None:
    try:
        return time.mktime(time.strptime(text.strip(), "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


# -- the remedy a report calls for -----------------------------------------------------------

def kept_report(state_dir: Path) -> dict[str, Any] | None:
    """last.json when it holds a report (not a stand-in for a hung or crashed run)."""
    try:
        doc = json.loads((state_dir / gate.LAST).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and "schema" in doc else None


def remedy_of(state_dir: Path, reason: str, prefix: str) -> tuple[str, str, list[str], list[str],
                                                                 str, str]:
    """(class, fault, GPUs, serials, why, level) for the node's kept report; a drain with no
    report behind it (a hung or killed run, a wrapper error) is checked again (recheck)."""
    from checks.report import remedy as remedies

    report = kept_report(state_dir)
    summary = reason[len(prefix) + 1:].strip()
    if report is None:
        fault = summary.split(None, 1)[0] if summary else "unknown"
        if fault.startswith(gate.WRAPPER_ID) or fault.startswith("nodecert-config"):
            return "none", fault, [], [], f"nodecert itself failed: {summary}", "standard"
        return "recheck", fault, [], [], f"no report behind the drain: {summary}", "standard"
    level = str(report.get("level") or "standard")
    found = remedies.remedy_for(report)
    if found is None:  # the kept report passes: the drain is older than it
        return "recheck", summary.split(None, 1)[0] or "unknown", [], [], \
            "the kept report passes; verify before resuming", level
    return (found.kind, found.fault, list(found.gpus), list(found.serials), found.reason, level)


def verify_level(report_level: str, minimum: str) -> str:
    """The level that caught the fault, at least `minimum`."""
    ranks = [LEVELS.index(x) for x in (report_level, minimum) if x in LEVELS]
    return LEVELS[max(ranks, default=1)]


# -- the breaker and the budget ----------------------------------------------------------------

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


# -- evidence ---------------------------------------------------------------------------------

def _backend(checks_args: Sequence[str]) -> Any:
    """The hardware backend the node's checks use (--simulate SCENARIO among the options)."""
    from checks.node import node_cli

    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--simulate")
    known, _ = parser.parse_known_args(list(checks_args))
    return node_cli.make_backend(known.simulate)


KERNEL_LINE = re.compile(r"NVRM|Xid|SXid|AER|nvidia|nvswitch|fallen off", re.IGNORECASE)


def keep_evidence(run: Run, rec: Record, why: str) -> str:
    """A directory with the failing report, the kernel-log lines behind it and the attempts so
    far; the oldest beyond --keep-evidence are removed. Returns its path ("" in a dry run)."""
    if not run.apply:
        return ""
    stamp = time.strftime("%Y%m%dT%H%M%S")
    base = run.directory / EVIDENCE
    path = base / f"{stamp}-{re.sub(r'[^A-Za-z0-9_.-]', '_', rec.fault)[:32]}"
    n = 1
    while path.exists():
        path = base / f"{stamp}-{n}-{rec.fault[:32]}"
        n += 1
    path.mkdir(parents=True)
    with contextlib.suppress(OSError):
        (path / "report.json").write_bytes((run.state_dir / gate.LAST).read_bytes())
    lines: list[str] = []
    report = kept_report(run.state_dir) or {}
    for chk in report.get("checks") or []:
        for result in chk.get("results") or []:
            details = result.get("details") if isinstance(result, dict) else None
            if result.get("status") in ("FAIL", "ERROR") and isinstance(details, dict) \
                    and isinstance(details.get("last"), str):
                lines.append(f"# {chk.get('id')}: {details['last']}")
    try:
        log = _backend(run.checks_args).kernel_log()
        lines += [line for line in log if KERNEL_LINE.search(line)][-500:]
    except Exception as exc:  # evidence is best effort: say why it is missing
        lines.append(f"# kernel log not read: {type(exc).__name__}: {one_line(str(exc))}")
    (path / "kernel.log").write_text("\n".join(lines) + "\n")
    (path / "attempts.json").write_text(json.dumps(
        {"why": why, "record": dataclasses.asdict(rec), "actions": run.history()[-50:]}, indent=1))
    kept = sorted(p for p in base.iterdir() if p.is_dir())
    for old in kept[:-run.policy.keep_evidence]:
        for f in old.iterdir():
            f.unlink()
        old.rmdir()
    return str(path)


def bundle(run: Run, rec: Record) -> str:
    """One tar.gz of the node's evidence, its record and its action log, for the RMA ticket."""
    if not run.apply:
        return str(run.directory / BUNDLES / f"{run.node}-<time>.tar.gz")
    out = run.directory / BUNDLES
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{run.node}-{time.strftime('%Y%m%dT%H%M%S')}.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name in (EVIDENCE, LOG, RECORD):
            if (run.directory / name).exists():
                tar.add(run.directory / name, arcname=f"{run.node}/{name}")
    return str(path)


# -- the steps --------------------------------------------------------------------------------

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


def escalate(run: Run, rec: Record, why: str) -> int:
    before = rec.stage
    rec.bundle = bundle(run, rec)
    serial = ",".join(rec.serials) or "-"
    reason = f"{run.prefix}: RMA {rec.fault} {serial} bundle {rec.bundle}"
    cmd = run.set_reason(reason)
    rec.stage, rec.reason = "escalated", reason
    run.save(rec)
    run.log("escalate", "ok", before, "escalated", rec, why, cmd)
    return 0


def hold(run: Run, rec: Record) -> int:
    before = rec.stage
    what = ("run the provisioning play for this host, then resume it" if rec.remedy == "reprovision"
            else "a person decides (nothing is done unattended)")
    reason = f"{run.prefix}: HOLD {rec.remedy} {rec.fault}: {what}"
    cmd = run.set_reason(reason)
    rec.stage, rec.reason = "held", reason
    run.save(rec)
    run.log("hold", "ok", before, "held", rec, rec.why, cmd)
    return 0


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


def reboot(run: Run, rec: Record, n: str, jobs: bool) -> int:
    """scontrol reboot ASAP nextstate=DOWN: Slurm drains, waits for the jobs, reboots; the node
    comes back DOWN (ReturnToService=0/1). With ReturnToService=2 slurmctld would return it to
    service at registration whatever its checks say, so a maintenance reservation holds it
    until this loop has drained it again for the verification."""
    reason = f"{run.prefix}: REBOOT {rec.fault} {n}, then verify {rec.level}"
    if not claim(run, rec, reason, "detected"):
        return 0
    if return_to_service() == 2:
        name = RESERVATION.format(node=run.node)
        cmd = ["scontrol", "create", "reservation", f"ReservationName={name}", f"Nodes={run.node}",
               "StartTime=now", "Duration=infinite", "Users=root", "Flags=MAINT,IGNORE_JOBS"]
        try:
            run.slurm(cmd, "ReturnToService=2: keeps the node from jobs between reboot and verify")
        except SlurmError as exc:
            if "exist" not in str(exc).lower():
                raise
        rec.reservation = name
        run.save(rec)
        # slurmctld marks a reservation's nodes (sinfo's $) on its own later pass; before that
        # a node that registers after its reboot shows IDLE: the reboot waits for the mark
        deadline = time.monotonic() + MAINT_WAIT_S
        while run.apply and "$" not in run.look().state.flags:
            if time.monotonic() > deadline:
                run.log("wait", "reservation", "detected", "detected", rec,
                        f"{name} does not hold the node yet (no $ in sinfo): reboot next run")
                return 0
            time.sleep(0.5)
    cmd = ["scontrol", "reboot", "ASAP", "nextstate=DOWN", f"reason={reason}", run.node]
    rec.reboot_issued_at = time.time()
    run.slurm(cmd, "reboot when the jobs have ended; DOWN after it until verified")
    rec.attempt += 1
    rec.stage, rec.reason = "rebooting", reason
    run.save(rec)
    run.log("reboot", "ok", "detected", "rebooting", rec,
            "issued while jobs run: Slurm reboots when they end" if jobs else "issued", cmd)
    return 0


def gpu_processes(hw: Any, uuids: Sequence[str]) -> list[str]:
    """`uuid: pid` of every compute process on the GPUs (this tool's own left out)."""
    nvml = hw.nvml()
    own = hw.own_pids()
    found = []
    for i in range(nvml.device_count()):
        gpu = nvml.gpu(i)
        uuid = str(gpu.query("uuid"))
        if uuids and uuid not in uuids:
            continue
        for proc in gpu.query("compute_processes") or []:
            pid = proc.get("pid") if isinstance(proc, dict) else proc
            if pid not in own:
                found.append(f"{uuid}: pid {pid}")
    return found


def reset(run: Run, rec: Record, n: str) -> int:
    """Reset the GPUs the fault names, with no process on them; a marker per GPU lets the
    kernel-log checks judge only what it logged after its reset. A GPU that cannot be reset
    makes the remedy a reboot."""
    if not rec.gpus:
        rec.remedy = "reboot"
        run.save(rec)
        run.log("gpu-reset", "failed", "detected", "detected", rec, "the fault names no GPU: reboot instead")
        return 0
    hw = _backend(run.checks_args)
    try:
        busy = gpu_processes(hw, rec.gpus)
    except Exception as exc:
        busy = [f"cannot list the GPUs' processes: {one_line(str(exc))}"]
    if busy:
        run.log("wait", "gpu-busy", "detected", "detected", rec,
                f"a process holds the GPU ({'; '.join(busy[:4])}): no reset")
        return 0
    reason = f"{run.prefix}: RESET {rec.fault} {n}, then verify {rec.level}"
    if not claim(run, rec, reason, "detected"):
        return 0
    if not run.apply:
        print(f"dry run: would reset {', '.join(rec.gpus)} and verify at level {rec.level}")
        return 0
    boot = kernel_log.boot_id()
    for uuid in rec.gpus:
        try:
            clock = hw.reset_gpu(uuid)
        except Exception as exc:
            rec.remedy = "reboot"
            run.save(rec)
            run.log("gpu-reset", "failed", "detected", "detected", rec,
                    f"{uuid}: {one_line(str(exc))}: reboot instead")
            return 1
        kernel_log.record_reset(run.state_dir, kernel_log.ResetMarker(
            boot, clock, uuid, _pci_of(hw, uuid), time.strftime("%Y-%m-%dT%H:%M:%S%z")))
    rec.attempt += 1
    rec.stage = "verify"
    rec.reason = f"{run.prefix}: VERIFY {rec.fault} after gpu-reset {n}, level {rec.level}"
    run.set_reason(rec.reason)
    run.save(rec)
    run.log("gpu-reset", "ok", "detected", "verify", rec, f"reset {', '.join(rec.gpus)}; marker kept")
    return 0


def _pci_of(hw: Any, uuid: str) -> str:
    nvml = hw.nvml()
    for i in range(nvml.device_count()):
        gpu = nvml.gpu(i)
        if str(gpu.query("uuid")) == uuid:
            return str(gpu.query("pci_bus_id")).lower()
    return ""


def verify(run: Run, rec: Record) -> int:
    """python -m checks at the record's level, under its deadline (the whole process group is
    killed at it); pass: resume; fail: back to detected with the new report's remedy."""
    if not run.apply:
        print(f"dry run: would verify at level {rec.level} (python -m checks {shlex.join(run.checks_args)})")
        return 0
    os.environ[kernel_log.ENV_STATE_DIR] = str(run.state_dir)  # the checks honour its reset markers
    started = time.monotonic()
    try:
        result, report = gate.run_checks(rec.level, run.checks_args, run.policy.verify_timeout_s,
                                         run.state_dir / gate.PROGRESS)
    except gate.Terminated:
        run.log("verify", "failed", "verify", "verify", rec, "stopped by a signal: verified again next run")
        raise Stopped("verification stopped by a signal") from None
    gate.keep_last(run.state_dir, report, result)
    took = f"{time.monotonic() - started:.1f} s"
    if result.failed:
        rec.stage = "detected"
        seen = run.look()
        kind, fault, gpus, serials, why, level = remedy_of(run.state_dir, control.drain_reason(
            run.prefix, result.summary), run.prefix)
        rec.remedy, rec.fault, rec.why = kind, fault, why
        rec.gpus = gpus or rec.gpus
        rec.serials = serials or rec.serials
        rec.level = verify_level(level, rec.level)
        rec.reason = control.drain_reason(run.prefix, result.summary)
        path = keep_evidence(run, rec, f"verification failed: {result.summary}")
        if path:
            rec.evidence.append(path)
        cmd = run.set_reason(rec.reason) if run.ours(seen.state.reason) or not seen.state.reason \
            else None
        run.save(rec)
        run.log("verify", "failed", "verify", "detected", rec, f"{result.summary} ({took})", cmd)
        return 1
    seen = run.look()
    if seen.state.reboot_pending or not run.ours(seen.state.reason):
        run.log("verify", "ok", "verify", "verify", rec,
                f"passed ({took}), but the node changed meanwhile ({seen.state.state}"
                f"{seen.state.flags}, {seen.state.reason or 'no reason'}): not resumed")
        return 0
    run.log("verify", "ok", "verify", "verify", rec, f"passed at level {rec.level} ({took})")
    cmd = ["scontrol", "update", f"NodeName={run.node}", "State=RESUME"]
    run.slurm(cmd, "back in service after a passing verification")
    rec.stage, rec.reason = "in-service", ""
    run.save(rec)
    run.log("resume", "ok", "verify", "in-service", rec, "back in service", cmd)
    return 0


def return_to_service() -> int:
    """slurmctld's ReturnToService (scontrol show config), 1 (Slurm's default) when unreadable."""
    out = control.run(["scontrol", "show", "config"])
    match = re.search(r"^ReturnToService\s*=\s*(\d+)", out, re.MULTILINE)
    return int(match[1]) if match else 1


def boot_time(node: str) -> float | None:
    """The node's BootTime as slurmd reported it (scontrol show node)."""
    out = control.run(["scontrol", "-o", "show", "node", node])
    match = re.search(r"\bBootTime=(\S+)", out)
    return _slurm_time(match[1]) if match else None


def release(run: Run, rec: Record, seen: Seen, why: str) -> int:
    """Someone else acted on the node: nodecert's hold ends, its reservation goes."""
    before = rec.stage
    if rec.reservation:
        with contextlib.suppress(SlurmError):
            run.slurm(["scontrol", "delete", f"ReservationName={rec.reservation}"], "our hold ends")
        rec.reservation = ""
    rec.stage = "released"
    run.save(rec)
    run.log("release", "ok", before, "released", rec,
            f"{why} ({seen.state.state}{seen.state.flags}, {seen.state.reason or 'no reason'}): "
            "nodecert's hold ends")
    return 0


def after_reboot(run: Run, seen: Seen, rec: Record) -> int:
    """rebooting: wait for Slurm; once the node booted after the request, drain it for the
    verification (it is DOWN, or back in a maintenance reservation), drop the reservation and
    verify."""
    if seen.state.reboot_pending:
        run.log("wait", "reboot", "rebooting", "rebooting", rec,
                f"the reboot is {'issued' if '^' in seen.state.flags else 'pending'} "
                f"({seen.state.state}{seen.state.flags})")
        return 0
    booted = boot_time(run.node)
    if booted is None or booted < math.floor(rec.reboot_issued_at):
        if run.ours(seen.state.reason):
            run.log("wait", "reboot", "rebooting", "rebooting", rec, "no reboot yet")
            return 0
        return release(run, rec, seen, "the reboot was cancelled")
    reason = (f"{run.prefix}: VERIFY {rec.fault} after reboot {rec.attempt}/"
              f"{run.policy.repeat_limit}, level {rec.level}")
    cmd = run.set_reason(reason)
    if rec.reservation:
        run.slurm(["scontrol", "delete", f"ReservationName={rec.reservation}"],
                  "drained now: the reservation is no longer needed")
        rec.reservation = ""
    rec.stage, rec.reason = "verify", reason
    run.save(rec)
    run.log("rebooted", "ok", "rebooting", "verify", rec,
            f"booted {time.strftime('%H:%M:%S', time.localtime(booted))}", cmd)
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


def publish(run: Run) -> None:
    """DIR/nodecert-remediation.prom: this node's stage, its actions by kind and result, the
    breaker (node_exporter's textfile collector)."""
    if run.textfile_dir is None or not run.apply:
        return
    rec = Record.load(run.directory / RECORD)
    stage = rec.stage if rec else "in-service"
    counts: dict[tuple[str, str], int] = {}
    for e in run.history():
        key = (str(e.get("action")), str(e.get("result")))
        counts[key] = counts.get(key, 0) + 1
    host = run.node
    breaker = int(bool(load_breaker(run.directory).get("open")))
    out = ["# HELP nodecert_remediation_state 1 for the remediation stage this node is in.",
           "# TYPE nodecert_remediation_state gauge"]
    for s in STAGES:
        labels = f'host="{host}",state="{s}"'
        if s == stage and rec and s in ("escalated", "held"):
            labels += f',fault="{_q(rec.fault)}",reason="{_q(rec.reason)}"'
        out.append(f"nodecert_remediation_state{{{labels}}} {int(s == stage)}")
    out += ["# HELP nodecert_remediation_actions_total Remediation actions on this node, by kind "
            "and result (the action log).", "# TYPE nodecert_remediation_actions_total counter"]
    out += [f'nodecert_remediation_actions_total{{host="{host}",kind="{_q(k)}",result="{_q(r)}"}} {n}'
            for (k, r), n in sorted(counts.items())]
    out += ["# HELP nodecert_remediation_breaker_open 1 while the breaker stops new remedies "
            "(remediate --reset-breaker).", "# TYPE nodecert_remediation_breaker_open gauge",
            f'nodecert_remediation_breaker_open{{host="{host}"}} {breaker}',
            "# HELP nodecert_remediation_last_run_timestamp_seconds When the remediation loop last "
            "ran on this host.", "# TYPE nodecert_remediation_last_run_timestamp_seconds gauge",
            f'nodecert_remediation_last_run_timestamp_seconds{{host="{host}"}} {time.time():.3f}']
    run.textfile_dir.mkdir(parents=True, exist_ok=True)
    safeio.write_bytes(run.textfile_dir / TEXTFILE, ("\n".join(out) + "\n").encode(), mode=0o644)


def _q(text: str) -> str:
    return str(text).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


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
