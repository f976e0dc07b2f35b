"""Supervisor side: launch the ranks once for all selected jobs, collect one verdict per job.

Built on checks.dist.launch (torchrun in its own session, heartbeats, hard timeout, whole-group
SIGKILL, the failing rank named). A crash or hang inside a job fails that job, naming the rank and
the job; the jobs it kept from running are relaunched so one broken job does not hide the others.
"""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from checks.dist.launch import LaunchOutcome, launch

from .config import TrainConfig
from .jobs import ORDER
from .report import FAIL, JobReport
from .worker import job_file

DEFAULT_CPU_RANKS = 4  # hybrid needs 2 stages x 2 replicas; every job spans the whole world


@dataclass
class SuiteOutcome:
    reports: dict[str, JobReport]
    nproc: int
    duration_s: float
    launches: list[LaunchOutcome] = field(default_factory=list)


def default_nproc() -> int:
    """One rank per GPU; DEFAULT_CPU_RANKS without one."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return count or DEFAULT_CPU_RANKS


def _collect(workdir: Path, jobs: list[str]) -> dict[str, JobReport]:
    """Every rank writes the same (broadcast) verdict; on a node of a multi-node launch only the
    local ranks' files are here, so take whichever exists."""
    found: dict[str, JobReport] = {}
    for job in jobs:
        for path in sorted(workdir.glob(job_file(Path(), job, 0).name.replace("-0.json", "-*.json"))):
            try:
                found[job] = JobReport.from_dict(json.loads(path.read_text()))
                break
            except (OSError, ValueError, KeyError):
                continue
    return found


def _failure(job: str, outcome: LaunchOutcome) -> JobReport:
    what = "hung" if outcome.hung else "crashed"
    return JobReport(job, FAIL, f"job {job} {what}: {outcome.summary}", details={
        "culprit_ranks": outcome.culprits, "hung": outcome.hung,
        "phases": {r: s.phase for r, s in outcome.ranks.items()},
        "log_tail": outcome.log_tail[-3000:], "workdir": outcome.workdir})


def run_jobs(jobs: list[str], cfg: TrainConfig, *, nproc: int | None = None,
             timeout_s: float = 600.0, stall_s: float = 60.0, start_timeout_s: float = 120.0,
             pg_timeout_s: float | None = None, workdir: str | Path | None = None,
             env: dict[str, str] | None = None, nnodes: int = 1, node_rank: int | None = None,
             rdzv_endpoint: str | None = None, rdzv_id: str | None = None,
             local_addr: str | None = None) -> SuiteOutcome:
    """Run `jobs` (names from trainer.jobs.ORDER) on `nproc` ranks per node; one report per job.

    Multi-node: give nnodes, rdzv_endpoint (HOST:PORT on the first node) and the same rdzv_id on
    every node; each node's call supervises its local ranks (no relaunch across nodes).
    """
    cfg.validate()
    nproc = nproc or default_nproc()
    order = [j for j in ORDER if j in jobs]
    base = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="nodecert-train-"))
    deadline = time.monotonic() + timeout_s
    start = time.monotonic()
    reports: dict[str, JobReport] = {}
    launches: list[LaunchOutcome] = []
    remaining = list(order)
    while remaining:
        wd = base / f"launch-{len(launches)}"
        args = [*remaining, "--config-json", json.dumps(cfg.to_dict()),
                "--pg-timeout", str(pg_timeout_s or max(stall_s * 2, 60.0))]
        outcome = launch("trainer", args, nproc=nproc, timeout_s=max(deadline - time.monotonic(), 1),
                         stall_s=stall_s, start_timeout_s=start_timeout_s, env=env, workdir=wd,
                         nnodes=nnodes, rdzv_endpoint=rdzv_endpoint, rdzv_id=rdzv_id,
                         node_rank=node_rank, local_addr=local_addr)
        launches.append(outcome)
        reports.update(_collect(wd, remaining))
        remaining = [j for j in remaining if j not in reports]
        if not remaining:
            break
        if outcome.ok:
            for job in remaining:
                reports[job] = JobReport(job, "ERROR", "the ranks finished without reporting "
                                         f"this job ({outcome.summary})")
            break
        # Jobs run in order: the first one without a report is the one that broke, provided a
        # rank got into it (phases are "<job>/<what>"); otherwise the launch itself failed.
        in_job = any("/" in (s.phase or "") for s in outcome.ranks.values())
        if not in_job or nnodes > 1 or time.monotonic() >= deadline:
            for job in remaining:
                reports[job] = _failure(job, outcome)
            break
        reports[remaining[0]] = _failure(remaining[0], outcome)
        remaining = remaining[1:]
    return SuiteOutcome(reports={j: reports[j] for j in order}, nproc=nproc,
                        duration_s=time.monotonic() - start, launches=launches)


def run_ddp_multinode(rdzv_endpoint: str, nnodes: int, node_rank: int, *, nproc: int | None = None,
                      rdzv_id: str = "nodecert-ddp", cfg: TrainConfig | None = None,
                      local_addr: str | None = None, timeout_s: float = 600.0,
                      stall_s: float = 60.0, start_timeout_s: float = 300.0,
                      env: dict[str, str] | None = None) -> JobReport:
    """The `ddp` job across hosts through torchrun's c10d rendezvous. Call it on every node with
    the same endpoint (the first node's cluster address, e.g. "10.0.0.1:29400") and rdzv_id, and
    node_rank 0..nnodes-1; set NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME through `env` if needed."""
    suite = run_jobs(["ddp"], cfg or TrainConfig(), nproc=nproc, timeout_s=timeout_s,
                     stall_s=stall_s, start_timeout_s=start_timeout_s, nnodes=nnodes,
                     node_rank=node_rank, rdzv_endpoint=rdzv_endpoint, rdzv_id=rdzv_id,
                     local_addr=local_addr, env=env)
    return suite.reports["ddp"]
