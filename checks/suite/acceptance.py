"""Acceptance stage: the reference training jobs of trainer/, proven equal to one device.

One launch of the ranks runs every job (start-up dominates on CPU); the five checks share it,
cached per Context. On GPUs: NCCL, one rank per GPU; without GPUs: gloo on 4 CPU ranks (hybrid
needs 2 stages x 2 replicas). Figures (samples/s, scaling efficiency vs one device) and the
comparison tolerances go into each result's details for the fleet report.
"""

from __future__ import annotations

import threading
import weakref
from pathlib import Path
from typing import Any

from ..context import Context
from ..model import Result, error, fail, passed, skip
from ..registry import check

JOBS = ("dp", "ddp", "pipeline", "hybrid", "syncbn")
SIMULATED = "simulated hardware: training jobs need the real machine"
CPU_RANKS = 4
LAUNCH_TIMEOUT_S = 600.0  # the launch kills its ranks by then; the checks' own limit is above
STALL_S = 90.0
REMEDY = {
    "ddp": "rerun `python -m trainer ddp` on this host; a mismatch with healthy collectives "
           "points at the torch/NCCL install (make provision) or a faulty GPU",
    "pipeline": "rerun `python -m trainer pipeline`; check GPU peer-to-peer (p2p checks) and NCCL",
    "hybrid": "rerun `python -m trainer hybrid`; replicas that drift mean gradients were not "
              "synchronised",
    "syncbn": "rerun `python -m trainer syncbn`; check NCCL all-reduce (collective checks)",
    "dp": "rerun `python -m trainer dp`; check GPU peer-to-peer and the driver",
}

_cache: weakref.WeakKeyDictionary[Context, dict[str, Any]] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def _plan(ctx: Context) -> tuple[list[str], int]:
    gpus = ctx.hw.torch().device_count
    nproc = ctx.options.nproc or gpus or CPU_RANKS
    jobs = [j for j in JOBS if (j != "dp" or gpus >= 2)
            and (not ctx.selected or f"train-{j}" in ctx.selected)]
    return jobs, nproc


def _run_suite(ctx: Context) -> dict[str, Any]:
    """{job: JobReport} from one shared launch (run on the first call for this Context)."""
    with _lock:
        if ctx not in _cache:
            from trainer.config import TrainConfig
            from trainer.launcher import run_jobs

            jobs, nproc = _plan(ctx)
            workdir = Path(ctx.options.workdir) / "acceptance" if ctx.options.workdir else None
            suite = run_jobs(jobs, TrainConfig(), nproc=nproc, timeout_s=LAUNCH_TIMEOUT_S,
                             stall_s=STALL_S, workdir=workdir)
            _cache[ctx] = dict(suite.reports)
        return _cache[ctx]


def _result(job: str, report: Any) -> Result:
    comparisons = [c.__dict__ for c in report.comparisons]
    worst = max(report.comparisons, key=lambda c: c.max_abs, default=None)
    details: dict[str, Any] = {
        "figures": report.figures, "comparisons": comparisons,
        "max_abs_diff": worst.max_abs if worst else None,
        "max_rel_diff": max((c.max_rel for c in report.comparisons), default=None),
        **{k: v for k, v in report.details.items() if k != "log_tail"}}
    if report.details.get("log_tail"):
        details["log_tail"] = report.details["log_tail"][-1500:]
    rate = report.figures.get(f"{job}_samples_per_s")
    kw: dict[str, Any] = {"details": details, "value": rate,
                          "unit": "samples/s" if rate is not None else None}
    tol = report.details.get("tolerances")
    if tol:
        kw["expected"] = f"equal to one device within rtol {tol['rtol']:g} / atol {tol['atol']:g}"
    if report.status == "PASS":
        return passed(report.message, **kw)
    if report.status == "SKIP":
        return skip(report.message, details=details)
    if report.status == "ERROR":
        return error(report.message, **kw)
    return fail(report.message, remedy=REMEDY[job], **kw)


def _job_check(ctx: Context, job: str) -> Result:
    if ctx.hw.simulated:
        return skip(SIMULATED)
    info = ctx.hw.torch()
    if info.error:
        return error(f"torch unusable: {info.error}")
    if job == "dp" and info.device_count < 2:
        return skip(f"needs ≥ 2 CUDA devices, have {info.device_count} (DataParallel without "
                    "them is a pass-through: a CPU run would prove nothing)")
    reports = _run_suite(ctx)
    if job not in reports:
        return error(f"the acceptance launch did not run {job}")
    return _result(job, reports[job])


def _register(job: str, code: str, title: str) -> None:
    def run(ctx: Context) -> Result:
        return _job_check(ctx, job)

    run.__doc__ = f"`python -m trainer {job}`: {title}. See docs/trainer.md."
    check(f"train-{job}", code=code, title=title, level="standard", stage="acceptance",
          timeout_s=LAUNCH_TIMEOUT_S + 120)(run)


_register("dp", "ACC001", "DataParallel over all GPUs equals one GPU")
_register("ddp", "ACC002", "DistributedDataParallel equals single-device training")
_register("pipeline", "ACC003", "pipeline parallel (GPipe, 1F1B) equals the unsplit model")
_register("hybrid", "ACC004", "pipeline x data parallel (2 stages x N replicas) equals one device")
_register("syncbn", "ACC005", "SyncBatchNorm equals BatchNorm over the global batch")
