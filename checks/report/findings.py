"""What the fleet report holds per host, per lemon GPU and per drifting figure: value types
shared by the aggregation (aggregate.py), its history (history.py), drift judging (drift.py) and
the digest comparison (digest_groups.py), so that none of them imports another for a type."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from checks.report.figures import GpuRef

FINDING_KINDS = ("digest", "straggler", "drift", "lemon")


@dataclass(frozen=True)
class Finding:
    """A fleet-level verdict on one host that its own report cannot give: its GPU computes other
    bits than the fleet (digest), is well below its peers (straggler) or its own history (drift),
    or keeps failing run after run (lemon). `reason` is one line, fit for a drain reason."""

    kind: str  # one of FINDING_KINDS
    status: str  # "FAIL" or "WARN"
    check: str  # the check the finding is about ("reference-digest", "gpu-matmul", ...)
    gpu: GpuRef | None
    reason: str
    figure: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "status": self.status, "check": self.check,
                "figure": self.figure, "gpu": self.gpu.to_dict() if self.gpu else None,
                "reason": self.reason}


@dataclass
class HostEntry:
    host: str
    status: str
    reason: str | None = None
    hostname: str | None = None
    profile: str | None = None
    summary: dict[str, int] | None = None
    problems: list[str] = field(default_factory=list)  # check ids with FAIL/ERROR/WARN results
    report: Mapping[str, Any] | None = None  # a summary.Packed when read from a directory
    findings: list[Finding] = field(default_factory=list)  # fleet-level verdicts on this host
    # When its newest report finished (Unix time): this run's report, else the last one the
    # history holds; None when no report of it was ever seen.
    report_finished_at: float | None = None
    # The site policy it ran under (checks/site.py): the first 12 hex digits of the site file's
    # SHA-256, None for the package's own profiles (docs/checks.md, "Tuning for your site").
    site: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "status": self.status, "reason": self.reason,
                "hostname": self.hostname, "profile": self.profile, "summary": self.summary,
                "problems": self.problems, "findings": [f.to_dict() for f in self.findings],
                "report_finished_at": self.report_finished_at, "site": self.site}


@dataclass(frozen=True)
class Lemon:
    uuid: str
    failed_runs: int
    seen_runs: int
    window: int  # the M of "N of the last M runs"
    hosts: tuple[str, ...]
    checks: tuple[str, ...]
    last_failed_run: str

    def to_dict(self) -> dict[str, Any]:
        return {"uuid": self.uuid, "failed_runs": self.failed_runs, "seen_runs": self.seen_runs,
                "window": self.window, "hosts": list(self.hosts), "checks": list(self.checks),
                "last_failed_run": self.last_failed_run}


@dataclass(frozen=True)
class Drift:
    """One figure of one GPU (or host) judged against its own baseline in this run."""

    host: str
    check: str
    name: str
    gpu: GpuRef | None
    value: float
    baseline: float
    baseline_kind: str  # "median" of the last runs, or "first" recorded value
    runs: int  # earlier values the baseline came from
    deficit_pct: float
    warn_pct: float
    fail_pct: float
    status: str | None  # "FAIL", "WARN" or None (within limits)
    series: tuple[float, ...] = field(default=(), compare=False)  # earlier values, then this run

    @property
    def key(self) -> str:
        return self.gpu.uuid if self.gpu and self.gpu.uuid else f"host:{self.host}"

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "check": self.check, "name": self.name,
                "gpu": self.gpu.to_dict() if self.gpu else None, "value": self.value,
                "baseline": self.baseline, "baseline_kind": self.baseline_kind, "runs": self.runs,
                "deficit_pct": round(self.deficit_pct, 2), "warn_pct": self.warn_pct,
                "fail_pct": self.fail_pct, "status": self.status, "series": list(self.series)}
