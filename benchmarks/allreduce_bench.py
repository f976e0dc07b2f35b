"""All-reduce bus bandwidth: the collective check's timing vs a minimal hand-written loop.

Both run in the same torchrun launch, size by size, alternating which goes first, so they see
the same machine state. Prints one row per size and the ratio (target >= 0.95). On GPUs the
backend is NCCL; when nccl-tests' `all_reduce_perf` is on PATH its peak busbw is printed too.

    .venv/bin/python benchmarks/allreduce_bench.py [--nproc 2] [--max-bytes 4194304]
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))


def baseline_seconds(buf: Any, warmup: int, iters: int) -> float:
    """What anyone would write: warm up, synchronise, time a loop of all_reduce."""
    import torch
    import torch.distributed as dist

    for _ in range(warmup):
        dist.all_reduce(buf)
    if buf.is_cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(buf)
    if buf.is_cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters


def rank_main(args: argparse.Namespace, rank: Any) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from checks.hw.measure import busbw
    from checks.hw.measure.collective_rank import Collectives, _init

    device = _init(rank, "auto", 300)
    c = Collectives(rank, device)
    rows = []
    for k, size in enumerate(busbw.sweep_sizes(args.min_bytes, args.max_bytes, args.factor)):
        count = busbw.elements_for("all_reduce", size, c.n)
        rank.beat(f"size {size}")
        buf = torch.zeros(count, device=device)
        pair = {"ours": math.inf, "base": math.inf}
        for r in range(args.repeats):  # best of N, alternating who goes first: a noisy host
            for which in (("ours", "base") if (k + r) % 2 == 0 else ("base", "ours")):
                seconds = (c.timed("all_reduce", count, args.warmup, args.iters)
                           if which == "ours" else baseline_seconds(buf, args.warmup, args.iters))
                pair[which] = min(pair[which], seconds)
        t = torch.tensor([pair["ours"], pair["base"]], device=device, dtype=torch.float64)
        dist.all_reduce(t)
        t /= c.n
        ours = busbw.complete_row("all_reduce", {"bytes": count * 4, "time_us": t[0].item() * 1e6},
                                  c.n)
        base = busbw.complete_row("all_reduce", {"bytes": count * 4, "time_us": t[1].item() * 1e6},
                                  c.n)
        rows.append({"bytes": count * 4, "ours_gbs": ours["busbw_gbs"],
                     "base_gbs": base["busbw_gbs"]})
    backend = dist.get_backend()
    dist.destroy_process_group()
    return {"rows": rows, "backend": backend, "world_size": c.n}


def nccl_tests_peak(gpus: int, max_bytes: int) -> float | None:
    exe = shutil.which("all_reduce_perf")
    if exe is None:
        return None
    out = subprocess.run([exe, "-b", "8", "-e", str(max_bytes), "-f", "2", "-g", str(gpus)],
                         capture_output=True, text=True, timeout=600, check=False).stdout
    peaks = [float(m.group(1)) for m in re.finditer(
        r"^\s+\d+\s+\d+\s+\w+\s+\w+\s+-?\d+\s+[\d.]+\s+[\d.]+\s+([\d.]+)", out, re.MULTILINE)]
    return max(peaks) if peaks else None


def supervise(args: argparse.Namespace) -> int:
    import torch

    from checks.supervise import launch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    nproc = args.nproc or (gpus if gpus >= 2 else 2)
    max_bytes = args.max_bytes or ((256 << 20) if gpus >= 2 else (4 << 20))
    env = {"PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT)])}
    argv = [f"--min-bytes={args.min_bytes}", f"--max-bytes={max_bytes}", f"--factor={args.factor}",
            f"--warmup={args.warmup}", f"--iters={args.iters}", f"--repeats={args.repeats}",
            "--rank"]
    outcome = launch.launch("allreduce_bench", argv, nproc=nproc, timeout_s=600, stall_s=120,
                            env=env)
    if not outcome.ok:
        print(f"launch failed: {outcome.summary}\n{outcome.log_tail}")
        return 1
    res = outcome.results[0]
    print(f"all-reduce, {res['world_size']} ranks, {res['backend']}: busbw GB/s, ours (the "
          f"nccl-allreduce check's timing) vs a hand-written torch.distributed loop")
    print(f"{'bytes':>10} {'ours':>10} {'loop':>10} {'ratio':>7}")
    ratios = []
    for r in res["rows"]:
        ratio = r["ours_gbs"] / r["base_gbs"] if r["base_gbs"] else float("nan")
        ratios.append(ratio)
        print(f"{r['bytes']:>10} {r['ours_gbs']:>10.3f} {r['base_gbs']:>10.3f} {ratio:>7.3f}")
    peak_ours = max(r["ours_gbs"] for r in res["rows"])
    peak_base = max(r["base_gbs"] for r in res["rows"])
    geo = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
    print(f"peak busbw: ours {peak_ours:.3f} GB/s, loop {peak_base:.3f} GB/s, ratio "
          f"{peak_ours / peak_base:.3f} (target >= 0.95)")
    print(f"geometric mean ratio over sizes: {geo:.3f}")
    if gpus >= 2:
        ref = nccl_tests_peak(nproc, max_bytes)
        print("nccl-tests all_reduce_perf: not on PATH" if ref is None else
              f"nccl-tests all_reduce_perf peak busbw {ref:.2f} GB/s; ours/nccl-tests "
              f"{peak_ours / ref:.3f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=int, default=None)
    p.add_argument("--min-bytes", type=int, default=1024)
    p.add_argument("--max-bytes", type=int, default=None)
    p.add_argument("--factor", type=int, default=4)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--repeats", type=int, default=5, help="best of N per size and side")
    p.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.rank:
        from checks.supervise.rank import run_rank

        return run_rank(lambda rank: rank_main(args, rank))
    return supervise(args)


if __name__ == "__main__":
    sys.exit(main())
