"""`python -m trainer JOB...`: run reference training jobs and prove them equal to one device.

Outside torchrun the command supervises: it launches the ranks itself (torchrun underneath,
heartbeats, hard timeout, the failing rank named) and runs all the named jobs in that one launch.
Under torchrun (RANK/WORLD_SIZE set) it is the rank program: the jobs run in this process.

Exit status: 0 no job FAIL/ERROR and at least one PASS, 1 a job FAIL/ERROR, 2 bad usage,
77 every job SKIP (with reason: nothing was proven, nothing failed), 128 + N stopped by signal N
(130 SIGINT, 143 SIGTERM) after killing every rank. In --json, a skipped job has "status": "SKIP"
and its reason in "message".
Rank count (trainer.placement.plan_ranks): one rank per GPU; 4 ranks on the CPU. A host with one
visible GPU runs one rank: the jobs that need 2 GPUs (all but single and throughput) SKIP "needs
2 GPUs, this host has 1" without a launch. `--nproc` above the GPU count is a usage error unless
--share-gpu (ranks share GPUs over gloo: the code paths run, nothing about the node is proven).
With `--device auto` on a host whose NVIDIA GPUs torch cannot use, nothing trains on the CPU
quietly: the command stops (exit 1) saying why; `--device cpu` asks for the CPU explicitly.

    python -m trainer all                          # every job, one launch
    python -m trainer single                       # in-process: each GPU in turn, then the CPU
    python -m trainer ddp --nproc 3 --steps 20
    torchrun --standalone --nproc-per-node=2 -m trainer ddp pipeline syncbn
    torchrun --nnodes=2 --nproc-per-node=8 --rdzv-backend=c10d --rdzv-endpoint=HOST:29400 \\
        --rdzv-id=nodecert-ddp -m trainer ddp
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from checks import cliutil
from trainer.config import CONTROL_JOB, CONTROLS, TrainConfig
from trainer.jobs import ORDER
from trainer.report import ERROR, FAIL, PASS, SKIP, JobReport

EXIT_PASS, EXIT_FAIL, EXIT_USAGE, EXIT_SKIP = 0, 1, 2, 77


def build_parser() -> argparse.ArgumentParser:
    d = TrainConfig()
    p = argparse.ArgumentParser(
        prog="python -m trainer",
        description="Reference training jobs: each parallel mode trained k steps and compared "
                    "with the same k steps on one device.",
        epilog="Exit status: 0 PASS, 1 FAIL/ERROR, 2 usage, 77 every job skipped (one-GPU host: "
               "the jobs that need 2 GPUs SKIP). Docs: docs/trainer.md")
    p.add_argument("jobs", nargs="+", metavar="JOB", help=f"{', '.join(ORDER)} or all")
    p.add_argument("--steps", type=cliutil.number(int, minimum=1), default=d.steps,
                   help=f"training steps (default {d.steps})")
    p.add_argument("--batch-size", type=cliutil.number(int, minimum=1), default=d.batch_size,
                   help=f"samples per rank or per micro-batch (default {d.batch_size})")
    p.add_argument("--lr", type=cliutil.number(float, above=0), default=d.lr)
    p.add_argument("--hidden", type=cliutil.number(int, minimum=1), default=d.hidden, help="MLP width")
    # torch.Generator.manual_seed takes a 64-bit seed; the sampler adds the epoch to it
    p.add_argument("--seed", type=cliutil.number(int, minimum=0, maximum=2**62), default=d.seed)
    p.add_argument("--dtype", choices=("float32", "float64"), default=d.dtype)
    p.add_argument("--rtol", type=cliutil.number(float, minimum=0),
                   help="relative tolerance (default per dtype)")
    p.add_argument("--atol", type=cliutil.number(float, minimum=0),
                   help="absolute tolerance (default per dtype)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default=d.device)
    p.add_argument("--size", choices=("auto", "small", "large"), default=d.size,
                   help="small: the calibrated test size (default on CPU); large: sized from the "
                        "GPU's memory, real training's message sizes (default on GPU; needs one). "
                        "docs/trainer.md lists each profile's memory and time")
    p.add_argument("--control", action="append", default=[], metavar="NAME",
                   help="negative control that must FAIL: " +
                        "; ".join(f"{k} ({v})" for k, v in CONTROLS.items()))
    sup = p.add_argument_group("supervised launch (ignored under torchrun)")
    sup.add_argument("--nproc", type=cliutil.number(int, minimum=1),
                     help="ranks per node (default: one per GPU; 2 sharing a single GPU; 4 on CPU)")
    sup.add_argument("--share-gpu", action="store_true",
                     help="allow more ranks than GPUs: ranks share GPUs over gloo (no send/recv: "
                          "pipeline and hybrid SKIP)")
    sup.add_argument("--timeout", type=cliutil.number(float, above=0), default=600.0,
                     help="hard limit, seconds")
    sup.add_argument("--stall", type=cliutil.number(float, above=0), default=60.0,
                     help="no heartbeat from any rank for this long = hung (seconds)")
    sup.add_argument("--nnodes", type=cliutil.number(int, minimum=1), default=1)
    sup.add_argument("--node-rank", type=cliutil.number(int, minimum=0))
    sup.add_argument("--rdzv-endpoint", metavar="HOST:PORT")
    sup.add_argument("--rdzv-id", default="nodecert-train")
    sup.add_argument("--json", type=cliutil.output_file, metavar="FILE",
                     help="write the reports as JSON ('-' for stdout)")
    p.add_argument("--config-json", help=argparse.SUPPRESS)
    p.add_argument("--pg-timeout", type=cliutil.number(float, above=0), default=120.0, help=argparse.SUPPRESS)
    return p


def _config(args: argparse.Namespace) -> TrainConfig:
    if args.config_json:
        return TrainConfig.from_dict(json.loads(args.config_json))
    return TrainConfig(steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                       hidden=args.hidden, seed=args.seed, dtype=args.dtype, rtol=args.rtol,
                       atol=args.atol, device=args.device, controls=list(args.control),
                       size=args.size)


def _jobs(names: list[str]) -> list[str]:
    wanted = list(ORDER) if "all" in names else names
    unknown = [n for n in wanted if n not in ORDER]
    if unknown:
        raise ValueError(f"unknown job {', '.join(unknown)} (jobs: {', '.join(ORDER)}, all)")
    return [j for j in ORDER if j in wanted]


def exit_status(reports: Sequence[JobReport]) -> int:
    statuses = {r.status for r in reports}
    if statuses & {FAIL, ERROR}:
        return EXIT_FAIL
    if statuses == {SKIP}:
        return EXIT_SKIP
    return EXIT_PASS


def format_report(r: JobReport) -> str:
    lines = [f"{r.job:9s} {r.status:5s} {r.message}"]
    for c in r.comparisons:
        lines.append(f"{'':16s}{c.describe()}")
    if r.figures:
        lines.append(f"{'':16s}" + ", ".join(f"{k}={v:.4g}" for k, v in r.figures.items()))
    if "syncbn_impl" in r.details:
        lines.append(f"{'':16s}SyncBN implementation: {r.details['syncbn_impl']}")
    return "\n".join(lines)


def _unusable_gpus(device: str) -> str | None:
    """With --device auto: NVIDIA GPUs on the PCI bus that torch cannot use (the jobs would
    quietly train on the CPU), as one line; None when torch uses them or there are none."""
    if device != "auto":
        return None
    from checks.hw.base import HardwareError
    from checks.hw.linux import LinuxBackend
    from checks.hw.torchview import read_torch
    from trainer.placement import why_torch_cannot_use_gpus

    info = read_torch()
    if info.device_count:
        return None
    backend = LinuxBackend()
    try:
        gpus = [d for d in backend.pci_devices() if d.is_nvidia_gpu]
    except HardwareError:
        return None
    if not gpus:
        return None
    return (f"{len(gpus)} NVIDIA GPU(s) on the PCI bus but torch cannot use any: "
            f"{why_torch_cannot_use_gpus(info, backend.environ(), len(gpus))}; fix that, or pass "
            "--device cpu to train on the CPU on purpose")


def _under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "LOCAL_RANK" in os.environ


def main(argv: Sequence[str] | None = None) -> int:
    args = cliutil.parse(build_parser(), argv)
    if isinstance(args, int):
        return args
    try:
        names = _jobs(args.jobs)
        cfg = _config(args)
        cfg.validate()
        stray = [c for c in cfg.controls if CONTROL_JOB[c] not in names]
        if stray:
            raise ValueError(f"control {stray[0]} belongs to job {CONTROL_JOB[stray[0]]}, "
                             "which is not selected")
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE

    if _under_torchrun():
        return _rank_main(names, cfg, args.pg_timeout)
    from trainer.gpumode import exclusive_process
    from trainer.launcher import cuda_count, skip_reports
    from trainer.placement import plan_ranks

    try:
        count = cuda_count()
        plan = plan_ranks(names, args.nproc, cfg.device, count, share=args.share_gpu,
                          exclusive=cfg.device != "cpu" and count > 0 and exclusive_process(),
                          nnodes=args.nnodes)
        nproc, shared = plan.nproc, plan.shared
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if cfg.size == "large" and (cfg.device == "cpu" or not cuda_count()):
        print("error: --size large is sized from the GPU's memory and needs a GPU; use --size "
              "small on the CPU", file=sys.stderr)
        return EXIT_USAGE
    unusable = _unusable_gpus(cfg.device)
    if unusable:
        print(f"error: {unusable}", file=sys.stderr)
        return EXIT_FAIL
    skipped = skip_reports(plan, count)
    launched = [n for n in names if n not in skipped]
    local = {"dp", "single"}
    if not launched:
        reports = []
    elif set(launched) <= local and args.nnodes == 1:
        from trainer.jobs import dp, single

        runners = {"dp": dp.run_local, "single": single.run_local}
        reports = [runners[n](cfg) for n in launched]
    else:
        from checks.supervise.procs import Terminated
        from trainer.launcher import run_jobs

        try:
            suite = run_jobs(launched, cfg, nproc=nproc, timeout_s=args.timeout,
                             stall_s=args.stall, nnodes=args.nnodes, node_rank=args.node_rank,
                             rdzv_endpoint=args.rdzv_endpoint, rdzv_id=args.rdzv_id,
                             share_gpu=shared)
        except Terminated as exc:  # SIGINT/SIGTERM/SIGHUP (__main__): the launch unwound
            print(f"stopped by {exc.name}: the ranks were killed and the workdir removed",
                  file=sys.stderr)
            return exc.exit_code
        reports = list(suite.reports.values())
        how = " sharing the GPU over gloo" if shared else ""
        print(f"{len(reports)} job(s) on {suite.nproc} rank(s) per node{how} in "
              f"{suite.duration_s:.1f} s")
    by_job = {**{r.job: r for r in reports}, **skipped}
    reports = [by_job[n] for n in names]
    for r in reports:
        print(format_report(r))
    try:
        _write_json(args.json, reports)
    except OSError as exc:  # read-only or full disk, a directory: one line, not a traceback
        print(f"error: cannot write {args.json}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE
    return exit_status(reports)


def _rank_main(names: list[str], cfg: TrainConfig, pg_timeout_s: float) -> int:
    from checks.supervise.rank import ENV_WORKDIR
    from trainer import worker

    _, results = worker.main(names, cfg, pg_timeout_s)
    if ENV_WORKDIR in os.environ:
        return EXIT_PASS  # supervised: verdicts travel in the job files
    reports = [JobReport.from_dict(results[n]) for n in names]
    if int(os.environ["RANK"]) == 0:
        for r in reports:
            print(format_report(r), flush=True)
    return exit_status(reports)


def _write_json(path: str | None, reports: list[JobReport]) -> None:
    if not path:
        return
    text = json.dumps({r.job: r.to_dict() for r in reports}, indent=2, default=str)
    if path == "-":
        print(text)
    else:
        with open(path, "w") as fh:
            fh.write(text + "\n")


__all__ = ["EXIT_FAIL", "EXIT_PASS", "EXIT_SKIP", "EXIT_USAGE", "PASS", "main"]
