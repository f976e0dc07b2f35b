"""Acceptance stage: the reference training jobs of trainer/, proven equal to one device.

One launch of the ranks runs every job (start-up dominates on CPU); the checks share it, cached
per Context. Ranks (trainer.placement.plan_ranks, the decision `python -m trainer` makes): NCCL
with one rank per GPU; on a one-GPU host one rank, and every job that needs more GPUs SKIPs
"needs 2 GPUs, this host has 1" (two ranks sharing the GPU over gloo would pass and prove nothing
about the node); without GPUs gloo on 4 CPU ranks. `train-single` trains every GPU alone against
float64 and is, with `train-throughput`, the verdict of a one-GPU host; `train-localize` names a
GPU whose gradients differ. Decided before anything launches (and so testable on scenarios):
- GPUs on the PCI bus that torch cannot use (CUDA_VISIBLE_DEVICES=NoDevFiles/""/-1, a CPU-only
  torch, a broken CUDA stack): every acceptance check FAILs saying why, never a CPU PASS;
- --expect-gpus N >= 2 with fewer GPUs usable: the multi-GPU jobs FAIL (single and localize
  still run on the GPUs there are);
- --nproc above the GPU count: SKIP with the reason.
Figures (samples/s, scaling efficiency vs one device) and the comparison tolerances go into each
result's details for the fleet report.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from checks.model import Result, error, fail, passed, skip
from checks.node import rules, workload_plan
from checks.node.context import Context
from checks.node.registry import Budget, Cost, check, shared_launch

JOBS = ("single", "localize", "dp", "ddp", "pipeline", "hybrid", "syncbn",
        "fsdp", "tp", "bf16", "compile", "accum", "loader", "ckpt", "throughput")
# Jobs that judge each GPU on its own: they run on whatever GPUs are usable. Every other job
# proves training ACROSS GPUs, and FAILs when fewer than --expect-gpus are usable.
PER_DEVICE = ("single", "localize")
SIMULATED = "simulated hardware: training jobs need the real machine"
# Tests only, like NODECERT_INJECT: comma-separated negative controls (trainer.config.CONTROLS) the
# acceptance launch runs with, so a test can make every job FAIL through `python -m checks` and see
# that FAIL reach the check and the exit code. Named in every result it touched.
ENV_CONTROLS = "NODECERT_TRAIN_CONTROLS"
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
    "single": "rerun `python -m trainer single`; a GPU that differs again computes wrong: drain "
              "it, run the vendor diagnostics (dcgmi diag -r 3) and RMA it quoting its serial",
    "localize": "rerun `python -m trainer localize`; the named GPU computes wrong gradients: "
                "drain it, run dcgmi diag -r 3 and RMA it quoting its serial",
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
REMEDY_BLOCKED = ("make torch see the GPUs: unset or fix CUDA_VISIBLE_DEVICES (Slurm: request "
                  "GPUs with --gres/--gpus), install a CUDA build of torch (make provision), see "
                  "gpu-count and cuda-compat")
REMEDY_FEWER = ("check CUDA_VISIBLE_DEVICES, the container's --gpus and the scheduler's GPU "
                "request, and gpu-count for GPUs that fell off the bus")

_cache: weakref.WeakKeyDictionary[Context, dict[str, Any]] = weakref.WeakKeyDictionary()
_prepared: weakref.WeakKeyDictionary[Context, Any] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


@dataclass
class Plan:
    jobs: list[str]  # to launch
    nproc: int = 0
    shared: bool = False  # ranks share GPUs over gloo (plan_ranks never asks it here)
    verdicts: dict[str, Result] = field(default_factory=dict)  # decided without launching


# Jobs that open a second CUDA context on a GPU another rank holds: DataParallel replicates onto
# every GPU from rank 0, the pipeline job checks its split on cuda:1. EXCLUSIVE_PROCESS refuses it.
SECOND_CONTEXT = {"dp": "DataParallel in rank 0 replicates onto GPUs the other ranks hold",
                  "pipeline": "the pipeline split check opens cuda:1, which rank 1 holds"}


def _exclusive_skips(wanted: list[str], decided: dict[str, Result], names: str) -> dict[str, Result]:
    return {j: skip(f"{why}, but {names} is in compute mode EXCLUSIVE_PROCESS (one process per GPU): "
                    "running it would fail for the mode, not the hardware")
            for j, why in SECOND_CONTEXT.items() if j in wanted and j not in decided}


def _cvd_note(ctx: Context) -> str:
    cvd = ctx.hw.environ().get("CUDA_VISIBLE_DEVICES")
    return "" if cvd is None else f" (CUDA_VISIBLE_DEVICES={cvd!r})"


def plan(ctx: Context) -> Plan:
    """Which jobs launch, on how many ranks, and which verdicts need no launch."""
    from trainer.placement import plan_ranks, why_torch_cannot_use_gpus

    wanted = [j for j in JOBS if not ctx.selected or f"train-{j}" in ctx.selected]
    plat = workload_plan.platform(ctx)
    if plat.kind == "blocked":
        why = why_torch_cannot_use_gpus(ctx.hw.torch(), ctx.hw.environ(), len(ctx.pci_gpus))
        verdict = fail(f"{len(ctx.pci_gpus)} NVIDIA GPU(s) on the PCI bus but torch cannot use "
                       f"any: {why}; the training jobs would run on the CPU and prove nothing "
                       "about the GPUs", value=0, expected=f"{len(ctx.pci_gpus)} GPU(s) in torch",
                       remedy=REMEDY_BLOCKED)
        return Plan([], verdicts={j: verdict for j in wanted})
    gpus = plat.devices
    verdicts: dict[str, Result] = {}
    expect = ctx.options.expect_gpus
    if expect is not None and expect >= 2 and gpus < expect:
        short = fail(f"--expect-gpus {expect} but torch can use {gpus} GPU(s){_cvd_note(ctx)}: "
                     f"a multi-GPU job on {gpus} cannot prove training on {expect}", value=gpus,
                     expected=f"{expect} GPUs", remedy=REMEDY_FEWER)
        verdicts.update({j: short for j in wanted if j not in PER_DEVICE})
    exclusive = workload_plan.exclusive_gpus(ctx) if gpus else None
    try:
        # The trainer's own decision: on one GPU one rank, and the jobs needing more SKIP.
        ranks = plan_ranks([j for j in wanted if j not in verdicts], ctx.options.nproc,
                           "auto" if gpus else "cpu", gpus, exclusive=bool(exclusive))
    except ValueError as exc:
        reason = skip(f"{exc} (--nproc of `checks verify`)")
        verdicts.update({j: reason for j in wanted if j not in verdicts})
        return Plan([], verdicts=verdicts)
    verdicts.update({j: skip(why) for j, why in ranks.skips.items()})
    if "dp" in wanted and "dp" not in verdicts and gpus < 2:
        verdicts["dp"] = skip(f"needs ≥ 2 CUDA devices, have {gpus} (DataParallel without them "
                              "is a pass-through: a CPU run would prove nothing)")
    if exclusive:
        verdicts.update(_exclusive_skips(wanted, verdicts, exclusive))
    return Plan([j for j in wanted if j not in verdicts], ranks.nproc, ranks.shared, verdicts)


def _config(ctx: Context, p: Plan) -> Any:
    from trainer.config import TrainConfig

    # On CPU hosts inductor's C++ build would cost ~20 s of the stage per launch; the compile
    # job there runs dynamo + AOTAutograd + DDP's graph split without codegen.
    return TrainConfig(compile_backend="inductor" if ctx.hw.torch().device_count else "aot_eager",
                       controls=test_controls(p.jobs))


def _workdir(ctx: Context) -> Path | None:
    return Path(ctx.options.workdir) / "acceptance" if ctx.options.workdir else None


def prepare_launch(ctx: Context) -> Any:
    """Prepare hook of every train-* check (registry.PrepareFn): at the start of the run, start
    the acceptance launcher, so that its imports (torch, the jobs' modules: 5-8 s of one core)
    overlap the checks before the stage instead of adding to it. Nothing when no launch will
    happen (simulated hardware, an unusable torch, every job decided without one)."""
    info = ctx.hw.torch()
    if ctx.hw.simulated or info.version is None or info.error:
        return None
    p = plan(ctx)
    if not p.jobs:
        return None
    from trainer.launcher import prepare_jobs

    with _lock:
        if ctx in _cache or ctx in _prepared:
            return None
        _prepared[ctx] = prepare_jobs(p.jobs, _config(ctx, p), nproc=p.nproc, stall_s=STALL_S,
                                      workdir=_workdir(ctx))

    def discard() -> None:
        """The end of the run: close it if the stage never took it (a used one is the
        launch's: its workdir may hold flight-recorder dumps a FAIL names)."""
        unused = _prepared.pop(ctx, None)
        if unused is not None:
            unused.close()

    return discard


def _run_suite(ctx: Context, p: Plan) -> dict[str, Any]:
    """{job: JobReport} from one shared launch (run on the first call for this Context)."""
    with _lock:
        if ctx not in _cache:
            from trainer.launcher import run_jobs

            cfg = _config(ctx, p)
            suite = run_jobs(p.jobs, cfg, nproc=p.nproc, timeout_s=LAUNCH_TIMEOUT_S,
                             stall_s=STALL_S, workdir=_workdir(ctx), share_gpu=p.shared,
                             prepared=_prepared.pop(ctx, None))
            for report in suite.reports.values():
                report.details["launch"] = {
                    "launches": len(suite.launches), "duration_s": round(suite.duration_s, 3),
                    "prepared": suite.prepared}
            if cfg.controls:
                from trainer.config import CONTROL_JOB

                for job, report in suite.reports.items():
                    report.details["negative_controls"] = [
                        c for c in cfg.controls if CONTROL_JOB[c] == job]
            _cache[ctx] = dict(suite.reports)
        return _cache[ctx]


def test_controls(jobs: list[str]) -> list[str]:
    """The negative controls ENV_CONTROLS asks for whose job is launched (tests only)."""
    import os

    from trainer.config import CONTROL_JOB

    wanted = [c for c in os.environ.get(ENV_CONTROLS, "").split(",") if c]
    return [c for c in wanted if CONTROL_JOB.get(c) in jobs]


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
    if report.details.get("expected"):
        kw["expected"] = report.details["expected"]
    elif tol:
        kw["expected"] = f"equal to one device within rtol {tol['rtol']:g} / atol {tol['atol']:g}"
    if report.status == "PASS":
        return passed(report.message, **kw)
    if report.status == "SKIP":
        return skip(report.message, details=details)
    if report.status == "ERROR":
        return error(report.message, **kw)
    return fail(report.message, remedy=REMEDY[job], **kw)


def _job_check(ctx: Context, job: str) -> Result:
    info = ctx.hw.torch()
    if info.version is None:
        return error(f"torch unusable: {info.error}")
    p = plan(ctx)
    if job in p.verdicts:
        return p.verdicts[job]
    if ctx.hw.simulated:
        return skip(SIMULATED)
    if info.error:
        return error(f"torch unusable: {info.error}")
    reports = _run_suite(ctx, p)
    if job not in reports:
        return error(f"the acceptance launch did not run {job}")
    if job == "throughput" and reports[job].status == "PASS":
        return _throughput(ctx, reports[job])
    return _result(job, reports[job])


def _throughput(ctx: Context, report: Any) -> Result:
    """Figures as information; MFU against the profile's bf16 peak and the profile's floors on
    GPU hosts (a CPU has no bf16 peak in any profile)."""
    figures = dict(report.figures)
    # MFU and the floors judge real training's size; a small run on a GPU is information
    on_gpu = report.details.get("backend") == "nccl"
    large = (report.details.get("size") or {}).get("name") == "large"
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
        if on_gpu and large and floor is not None and figure in figures \
                and rules.below(figures[figure], float(floor)):
            low.append(f"{figure} {figures[figure]:.4g} < thresholds.{key} {float(floor):g}")
    if low:
        return fail(f"below profile {ctx.profile.name}: {'; '.join(low)}",
                    remedy=REMEDY["throughput"], **kw)
    floors = [k for k in THROUGHPUT_FLOORS if ctx.profile.get(f"thresholds.{k}") is not None]
    note = (f"; floors {', '.join(floors)} met" if on_gpu and large and floors
            else "; information (no floor applies)")
    return passed(report.message + mfu + note, **kw)


# The budget of the one launch every job shares, paid by the first job a --budget plan chooses
# (GPU: every GPU, estimated). Measured cpu, all fifteen jobs at the small size, 4 gloo ranks
# forked by checks.supervise.forkrun: 13.8 s idle on the 2026-12-02 VM, 12.4 s under a full test
# run on the 2026-12-03 one (8.6 s idle there); counted as 20 s.
LAUNCH = shared_launch("acceptance", cost=Cost(cpu=20, gpu=90, per_gpu=2), source="measured cpu")


def _register(job: str, code: str, title: str, *, value: int) -> None:
    """One acceptance check; `value` is its budget value (1-10). Its own cost is counted as 1 s:
    the launch is paid once, as LAUNCH."""
    def run(ctx: Context) -> Result:
        return _job_check(ctx, job)

    run.__doc__ = f"`python -m trainer {job}`: {title}. See docs/trainer.md."
    check(f"train-{job}", code=code, title=title, level="standard", stage="acceptance",
          timeout_s=LAUNCH_TIMEOUT_S + 120, prepare=prepare_launch,
          gated_by=("gpu-occupied",), nvml=("compute_capability", "compute_mode"),
          budget=Budget(value=value, cost=Cost(cpu=1, gpu=1), source="measured cpu",
                        shared=LAUNCH))(run)


_register("dp", "ACC001", "DataParallel over all GPUs equals one GPU", value=3)
_register("ddp", "ACC002", "DistributedDataParallel equals single-device training", value=5)
_register("pipeline", "ACC003", "pipeline parallel (GPipe, 1F1B) equals the unsplit model", value=4)
_register("hybrid", "ACC004", "pipeline x data parallel (2 stages x N replicas) equals one device", value=4)
_register("syncbn", "ACC005", "SyncBatchNorm equals BatchNorm over the global batch", value=4)
# The one-device and localisation jobs are what a one-GPU node is accepted on (valued above the
# multi-GPU jobs); the later ones prove today's parallelism.
_register("single", "ACC006", "every GPU (and the CPU) trains alone in fp32 within the rounding "
          "bound of float64", value=7)
_register("localize", "ACC007", "every rank's local gradients on the same batch equal float64 "
          "before the all-reduce (names a faulty GPU)", value=6)
_register("fsdp", "ACC008", "FSDP2 (fully_shard) equals one device; bf16 mixed precision in band", value=5)
_register("tp", "ACC009", "tensor parallel and 2D (data x tensor) equal one device", value=4)
_register("bf16", "ACC010", "DDP under bf16 autocast keeps the loss within the band of fp32", value=4)
_register("compile", "ACC011", "DDP over torch.compile equals eager and really compiles", value=3)
_register("accum", "ACC012", "DDP with several buckets and no_sync accumulation equals one device", value=4)
_register("loader", "ACC013", "DDP fed by DataLoader workers and DistributedSampler equals one "
          "device", value=4)
_register("ckpt", "ACC014", "checkpoint mid-run (rank-0 and DCP), resume, equal uninterrupted", value=4)
_register("throughput", "ACC015", "GPT-style training throughput, MFU and weak scaling", value=3)
