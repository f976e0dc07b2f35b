"""Acceptance-stage benchmark: total wall time, and the ddp job's overhead vs a bare DDP loop.

1. The acceptance stage as `make verify` runs it (every train-* check, one shared launch, the
   small size), with each job's own time and share of the stage, and the launch overhead (the
   stage's wall time the jobs do not account for). Goal on the 2-core development machine:
   <= 45 s.
2. In one 2-rank launch, alternately: the `ddp` job (its steady-state samples/s) and a minimal
   hand-written DDP loop (same model, DataLoader, DistributedSampler, batch, optimizer), 3 rounds
   each; the ratio of the medians. Goal: >= 0.95.

    .venv/bin/python benchmarks/acceptance_bench.py
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

STEPS, WARMUP, ROUNDS = 80, 10, 5
STAGE_GOAL_S, RATIO_GOAL = 45.0, 0.95


def minimal_ddp_loop(env, cfg) -> float:  # type: ignore[no-untyped-def]
    """The loop anyone would write: no heartbeats, no bookkeeping. Samples/s after WARMUP steps."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler

    from trainer.data import TeacherDataset, dataset_size
    from trainer.models import mlp

    world, b = env.world_size, cfg.batch_size
    data = TeacherDataset(dataset_size(world, b, cfg.steps_per_epoch), (16,), 4, seed=cfg.seed)
    sampler = DistributedSampler(data, shuffle=True, seed=cfg.seed, drop_last=True)
    loader = DataLoader(data, batch_size=b, sampler=sampler)
    model = DDP(mlp(cfg.hidden), process_group=dist.new_group())
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    loss_fn = torch.nn.MSELoss()
    step, epoch, start = 0, 0, 0.0
    while step < cfg.steps:
        sampler.set_epoch(epoch)
        for x, y in loader:
            if step == cfg.steps:
                break
            if step == cfg.warmup:
                start = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss_fn(model(x), y).backward()
            opt.step()
            step += 1
        epoch += 1
    elapsed = time.perf_counter() - start
    del model, opt
    return b * world * (cfg.steps - cfg.warmup) / elapsed


def rank_program() -> int:
    """Runs on every rank of the side-by-side launch."""
    from checks.supervise.rank import Rank, run_rank
    from trainer import distenv
    from trainer.config import TrainConfig
    from trainer.jobs import ddp

    def body(rank: Rank) -> dict:
        env = distenv.init(rank, "cpu")
        cfg = TrainConfig(steps=STEPS, warmup=WARMUP, steps_per_epoch=20)
        job, bare = [], []
        for i in range(ROUNDS):
            env.beat(f"round-{i}")
            report = env.broadcast(ddp.run(env, cfg))
            job.append(report.figures["ddp_samples_per_s"])
            bare.append(minimal_ddp_loop(env, cfg))
        env.barrier()
        distenv.shutdown()
        return {"job": job, "bare": bare, "status": report.status}

    return run_rank(body)


def main() -> int:
    from checks import profiles
    from checks.hw.linux import LinuxBackend
    from checks.node.context import Context, Options
    from checks.node.suite import acceptance
    from checks.supervise.launch import launch

    ctx = Context(LinuxBackend(), profiles.load("generic"), Options())
    start = time.monotonic()
    results = {job: acceptance._job_check(ctx, job) for job in acceptance.JOBS}
    stage_s = time.monotonic() - start
    took = {job: (r.details or {}).get("duration_s") for job, r in results.items()}
    in_jobs = sum(t for t in took.values() if isinstance(t, (int, float)))
    for job, r in results.items():
        t = took[job]
        took_s = (f"{t:5.1f} s {t / stage_s:6.1%}" if isinstance(t, (int, float))
                  else "   -          ")
        print(f"  train-{job:10s} {r.status:5s} {took_s}  {r.message[:100]}")
    # what the jobs do not account for: the launcher (forkrun: torch and the jobs' modules
    # imported once, here not prepared ahead), process groups, teardown, the supervisor
    print(f"  launch overhead        {stage_s - in_jobs:5.1f} s {(stage_s - in_jobs) / stage_s:6.1%}"
          "  (stage wall - sum of the jobs' own times)")
    print(f"acceptance stage: {stage_s:.1f} s wall for {len(results)} jobs "
          f"(goal <= {STAGE_GOAL_S:g} s) {'OK' if stage_s <= STAGE_GOAL_S else 'MISSED'}")

    outcome = launch("acceptance_bench", ["--rank"], nproc=2, timeout_s=300, stall_s=60,
                     env={"PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT)])})
    if not outcome.ok:
        print(f"side-by-side launch failed: {outcome.summary}\n{outcome.log_tail}")
        return 1
    res = outcome.results[0]
    job, bare = statistics.median(res["job"]), statistics.median(res["bare"])
    ratio = job / bare
    print(f"ddp job {job:.0f} samples/s vs minimal DDP loop {bare:.0f} samples/s "
          f"(medians of {ROUNDS}, 2 ranks, {STEPS - WARMUP} steady steps; job verdict "
          f"{res['status']}): ratio {ratio:.3f} (goal >= {RATIO_GOAL}) "
          f"{'OK' if ratio >= RATIO_GOAL else 'MISSED'}")
    print(f"  rounds: job {[round(v) for v in res['job']]}, bare {[round(v) for v in res['bare']]}")
    bad = [j for j, r in results.items() if r.status in ("FAIL", "ERROR")]
    return 1 if bad or res["status"] != "PASS" else 0


if __name__ == "__main__":
    sys.exit(rank_program() if "--rank" in sys.argv else main())
