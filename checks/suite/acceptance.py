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

JOBS = ("dp", "ddp", "pipeline", "hybrid", "syncbn",
        "fsdp", "tp", "bf16", "compile", "accum", "loader", "ckpt", "throughput")
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
    "fsdp": "rerun `python -m trainer fsdp`; check NCCL all-gather/reduce-scatter (collective "
            "checks) and that torch matches requires in pyproject",
    "tp": "rerun `python -m trainer tp`; check NCCL all-reduce and the torch install",
    "bf16": "rerun `python -m trainer bf16`; a loss outside the band with an exact fp32 ddp job "
            "points at the GPU's bf16 path (compute checks)",
    "compile": "rerun `python -m trainer compile`; check the C++ compiler / Triton install",
    "accum": "rerun `python -m trainer accum`; check NCCL all-reduce (collective checks)",
    "loader": "rerun `python -m trainer loader`; check /dev/shm and the dataloader checks",
    "ckpt": "rerun `python -m trainer ckpt`; check the scratch filesystem (space, permissions)",
    "throughput": "compare with `python -m trainer throughput` on a healthy node of this model; "
                  "check clocks, power caps and NVLink (health checks)",
}
# Profile keys for the throughput check (optional; GPU hosts only): thresholds.train_tokens_per_s
# (per GPU), thresholds.train_mfu (fraction of peaks.bf16_tflops), thresholds.train_weak_scaling
# (tokens/s on N GPUs / (N x one GPU)).
THROUGHPUT_FLOORS = {"train_tokens_per_s": "throughput_tokens_per_s_per_rank",
                     "train_mfu": "mfu", "train_weak_scaling": "throughput_weak_scaling_efficiency"}

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
            # On CPU hosts inductor's C++ build would cost ~20 s of the stage per launch; the
            # compile job there runs dynamo + AOTAutograd + DDP's graph split without codegen.
            cfg = TrainConfig(compile_backend="inductor" if ctx.hw.torch().device_count
                              else "aot_eager")
            suite = run_jobs(jobs, cfg, nproc=nproc, timeout_s=LAUNCH_TIMEOUT_S,
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
    if job == "throughput" and reports[job].status == "PASS":
        return _throughput(ctx, reports[job])
    return _result(job, reports[job])


def _throughput(ctx: Context, report: Any) -> Result:
    """Figures as information; MFU against the profile's bf16 peak and the profile's floors on
    GPU hosts (a CPU has no bf16 peak in any profile)."""
    figures = dict(report.figures)
    on_gpu = report.details.get("backend") == "nccl"
    peak = ctx.profile.get("peaks.bf16_tflops")
    if on_gpu and peak:
        figures["mfu"] = figures["throughput_model_tflops_per_rank"] / float(peak)
    details = {"figures": figures, **{k: v for k, v in report.details.items() if k != "log_tail"},
               "bf16_peak_tflops": peak if on_gpu else None}
    kw: dict[str, Any] = {"details": details, "value": figures["throughput_tokens_per_s_per_rank"],
                          "unit": "tokens/s per rank"}
    mfu = f", MFU {figures['mfu']:.1%} of {peak:g} TFLOP/s bf16" if "mfu" in figures else (
        ", MFU n/a (CPU)" if not on_gpu else f", MFU n/a (profile {ctx.profile.name} has no "
                                              "peaks.bf16_tflops)")
    low = []
    for key, figure in THROUGHPUT_FLOORS.items():
        floor = ctx.profile.get(f"thresholds.{key}")
        if on_gpu and floor is not None and figure in figures and figures[figure] < float(floor):
            low.append(f"{figure} {figures[figure]:.4g} < thresholds.{key} {float(floor):g}")
    if low:
        return fail(f"below profile {ctx.profile.name}: {'; '.join(low)}",
                    remedy=REMEDY["throughput"], **kw)
    floors = [k for k in THROUGHPUT_FLOORS if ctx.profile.get(f"thresholds.{k}") is not None]
    note = (f"; floors {', '.join(floors)} met" if on_gpu and floors
            else "; information (no floor applies)")
    return passed(report.message + mfu + note, **kw)


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
_register("fsdp", "ACC006", "FSDP2 (fully_shard) equals one device; bf16 mixed precision in band")
_register("tp", "ACC007", "tensor parallel and 2D (data x tensor) equal one device")
_register("bf16", "ACC008", "DDP under bf16 autocast keeps the loss within the band of fp32")
_register("compile", "ACC009", "DDP over torch.compile equals eager and really compiles")
_register("accum", "ACC010", "DDP with several buckets and no_sync accumulation equals one device")
_register("loader", "ACC011", "DDP fed by DataLoader workers and DistributedSampler equals one "
          "device")
_register("ckpt", "ACC012", "checkpoint mid-run (rank-0 and DCP), resume, equal uninterrupted")
_register("throughput", "ACC013", "GPT-style training throughput, MFU and weak scaling")
