"""`loader`: DDP fed the way the tutorials teach (DataLoader workers, pin_memory,
DistributedSampler + set_epoch) equals single-device training.

Each rank reads its DistributedSampler shard (shuffle, drop_last=True, set_epoch every epoch)
through a DataLoader with WORKERS worker processes (persistent across epochs) and pin_memory on
GPU hosts, and trains DDP for cfg.steps steps across several epochs. Rank 0 rebuilds the global
batches from the sampler's documented per-epoch permutation (trainer.data.global_batches) and
trains the unwrapped initial weights on them; parameters must match, replicas be bit-identical.
The job observes that the workers it names did the loading: every sample carries the id of the
worker process that produced it (`get_worker_info()`, -1 in the training process), and every
rank must have received batches from each of its WORKERS workers and none from itself.
Negative controls: `loader-no-sampler`, DataLoader(shuffle=True) without a DistributedSampler, so
the ranks draw overlapping batches of the whole dataset; `loader-no-workers`, num_workers=0 (same
numbers, so only the worker-id observation catches it).

    torchrun --standalone --nproc-per-node=2 -m trainer loader
"""

from __future__ import annotations

import copy
import gc
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler, get_worker_info

from trainer.config import TrainConfig
from trainer.data import TeacherDataset, dataset_size, global_batches
from trainer.distenv import DistEnv, StepTimer, training_steps
from trainer.jobs import common
from trainer.models import D_IN, D_OUT, mlp, params_of, unwrap_names
from trainer.report import Comparison, JobReport, compare, identical

NAME = "loader"
WORKERS = 2


class WorkerTagged(Dataset[tuple[torch.Tensor, torch.Tensor, int]]):
    """The dataset's (input, target) plus the id of the DataLoader worker that read it."""

    def __init__(self, data: TeacherDataset) -> None:
        self.data = data

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        info = get_worker_info()
        return (*self.data[i], -1 if info is None else info.id)


def workers_used(per_rank: list[list[int]], workers: int) -> Comparison:
    """Each rank's batches came from all of its `workers` worker processes and from no other
    source (-1: built in the training process itself)."""
    want = list(range(workers))
    bad = [(r, ids) for r, ids in enumerate(per_rank) if ids != want]
    return common.holds(f"batches produced by {workers} DataLoader worker(s) on every rank",
                        workers > 0 and not bad,
                        "no workers configured" if workers < 1 else "" if not bad else
                        f"rank {bad[0][0]} got batches from worker id(s) {bad[0][1]} "
                        "(-1 = the training process itself)")


class _NoEpochs:
    """Stands in for the sampler when the control leaves it out (nothing to set_epoch)."""

    def set_epoch(self, epoch: int) -> None:
        del epoch


def run(env: DistEnv, cfg: TrainConfig) -> JobReport | None:
    world = env.world_size
    if world < 2:
        return JobReport(NAME, "SKIP", f"needs >= 2 ranks, have {world}")
    b, dtype = cfg.batch_size, getattr(torch, cfg.dtype)
    data = TeacherDataset(dataset_size(world, b, cfg.steps_per_epoch), (D_IN,), D_OUT,
                          seed=cfg.seed, dtype=dtype)
    no_sampler = cfg.control("loader-no-sampler")
    workers = 0 if cfg.control("loader-no-workers") else WORKERS
    sampler: DistributedSampler[Any] | None = None if no_sampler else DistributedSampler(
        data, num_replicas=world, rank=env.rank, shuffle=True, seed=cfg.seed, drop_last=True)
    loader = DataLoader(WorkerTagged(data), batch_size=b, sampler=sampler, shuffle=no_sampler,
                        drop_last=no_sampler, num_workers=workers, persistent_workers=workers > 0,
                        pin_memory=env.is_cuda,
                        generator=torch.Generator().manual_seed(cfg.seed + env.rank))
    torch.manual_seed(cfg.seed)
    initial = mlp(cfg.hidden)
    env.beat(f"{NAME}/setup")
    model = common.ddp(copy.deepcopy(initial).to(env.device, dtype), env)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    timer = StepTimer(cfg.warmup, env.device)
    worker_ids: set[int] = set()
    for x, y, wid in training_steps(env, loader, sampler or _NoEpochs(), timer, cfg.steps,
                                    cfg.beats_at, NAME):
        worker_ids.update(wid.tolist())
        x, y = x.to(env.device, non_blocking=True), y.to(env.device, non_blocking=True)
        opt.zero_grad(set_to_none=True)
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    final = unwrap_names(params_of(model))
    del opt, model, loader  # workers exit with their loader
    gc.collect()
    env.beat(f"{NAME}/gather")
    gathered = env.gather({"params": final, "samples_per_s": timer.samples_per_s(b * world),
                           "worker_ids": sorted(worker_ids)})
    if gathered is None:
        return None
    env.beat(f"{NAME}/reference")
    rtol, atol = cfg.tolerances()
    ref = copy.deepcopy(initial).to(env.device, dtype)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    for idx in global_batches(len(data), world, b, cfg.seed, cfg.steps):
        ref_opt.zero_grad(set_to_none=True)
        nn.functional.mse_loss(ref(data.x[idx].to(env.device)), data.y[idx].to(env.device)).backward()
        ref_opt.step()
    comparisons = [
        compare("parameters vs single-device reference", final, params_of(ref), rtol, atol),
        identical("replicas identical", [g["params"] for g in gathered]),
        workers_used([g["worker_ids"] for g in gathered], WORKERS),
    ]
    details = {"world_size": world, "workers_per_rank": workers,
               "worker_ids_per_rank": [g["worker_ids"] for g in gathered],
               "persistent_workers": workers > 0,
               "pin_memory": env.is_cuda, "dataset_size": len(data),
               "sampler": "none, shuffle=True (negative control)" if no_sampler
               else "DistributedSampler(shuffle, drop_last) + set_epoch",
               "epochs": -(-cfg.steps // cfg.steps_per_epoch), "dtype": cfg.dtype,
               "tolerances": {"rtol": rtol, "atol": atol}}
    return JobReport.judge(NAME, comparisons,
                           f"{world} ranks x {WORKERS} DataLoader workers, DistributedSampler + "
                           f"set_epoch (batches seen from every worker), equal the single-device "
                           f"reference (max abs diff "
                           f"{comparisons[0].max_abs:.2g}); replicas identical",
                           figures={"loader_samples_per_s": gathered[0]["samples_per_s"]},
                           details=details)
