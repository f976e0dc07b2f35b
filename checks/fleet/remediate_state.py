"""The remediation loop's state: its policy, the node's record (remediation/node.json), the
cluster as one sinfo shows it, and the run that reads it, logs each action (the append-only
remediation/actions.jsonl) and runs (or, in a dry run, prints) each Slurm command.

Shared by the decision (checks.fleet.remediate), the actions (remediate_actions), the budget
and breaker (remediate_guard) and the evidence (remediate_evidence)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from checks import safeio
from checks.fleet import slurm_control as control
from checks.fleet import slurm_gate as gate
from checks.fleet.slurm_control import NodeState, SlurmError, one_line, parse_state

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


def note_resume(state_dir: Path, node: str, by: str, reason: str) -> None:
    """A resume of one of nodecert's drains done outside the loop (the health check resumes its
    own plain drains when it passes), written to the loop's action log: the loop counts
    drain/resume cycles from the log, so a node the health check drains and resumes over and
    over still escalates as flapping. Best effort: a log that cannot be written changes nothing
    else (the resume itself is done)."""
    entry = {"t": round(time.time(), 3), "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "node": node,
             "action": "resume", "result": "ok", "stage_before": "drained", "stage_after": "in-service",
             "fault": "", "gpus": [], "remedy": "", "attempt": 0, "detail": f"by {by}: {reason}"}
    with contextlib.suppress(OSError):
        directory = state_dir / DIR
        directory.mkdir(parents=True, exist_ok=True)
        with open(directory / LOG, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")


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
            entry = merged.setdefault(parts[0], (state, [], slurm_time(parts[3])))
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


def slurm_time(text: str) -> float | None:
    try:
        return time.mktime(time.strptime(text.strip(), "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None
