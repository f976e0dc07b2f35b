"""`ddp`: DistributedDataParallel equals single-device training on the global batch.

Each rank trains on its DistributedSampler shard (shuffle, set_epoch, drop_last=True) for k steps;
rank 0 then trains an unwrapped copy of the initial weights (taken after DDP's broadcast) on the
global batches it rebuilds from the sampler's permutation, and compares parameters. The ranks'
parameters must be bit-identical. A missing set_epoch, a sum-reduced loss, padded indices or
gradients all-reduced at fp16 precision (`ddp-fp16-allreduce`) FAIL.

One node, 2 ranks (gloo on CPU, NCCL with one GPU per rank):
    torchrun --standalone --nproc-per-node=2 -m trainer ddp
Several nodes (run on every node; HOST is the first node's address on the cluster network):
    torchrun --nnodes=2 --nproc-per-node=8 --rdzv-backend=c10d --rdzv-endpoint=HOST:29400 \
        --rdzv-id=nodecert-ddp -m trainer ddp
Supervised (heartbeats, hard timeout, failing rank named): python -m trainer ddp --nproc 2
"""

from __future__ import annotations

import copy
import gc
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

from trainer.config import TrainConfig
from trainer.data import TeacherDataset, dataset_size, global_batches
from trainer.distenv import DistEnv, StepTimer, training_steps
from trainer.models import mlp, params_of, unwrap_names
from trainer.report import JobReport, compare, identical, throughput

NAME = "ddp"


def run(env: DistEnv, cfg: TrainConfig) -> JobReport | None:
    if env.world_size < 2:
        return JobReport(NAME, "SKIP", f"needs >= 2 ranks, have {env.world_size}")
    dtype = getattr(torch, cfg.dtype)
    world, b = env.world_size, cfg.batch_size
    n = dataset_size(world, b, cfg.steps_per_epoch)
    data = TeacherDataset(n, (16,), 4, seed=cfg.seed, dtype=dtype)
    sampler: DistributedSampler[Any] = DistributedSampler(
        data, num_replicas=world, rank=env.rank, shuffle=True, seed=cfg.seed,
        drop_last=not cfg.control("pad-indices"))
    loader = DataLoader(data, batch_size=b, sampler=sampler)

    env.beat(f"{NAME}/setup")
    # Different weights per rank on purpose: DDP must broadcast rank 0's.
    torch.manual_seed(cfg.seed + env.rank)
    group = env.new_group()
    model = mlp(cfg.hidden).to(env.device, dtype)
    ddp = DDP(model, device_ids=[env.device] if env.is_cuda else None, process_group=group)
    if cfg.control("ddp-fp16-allreduce"):
        # A reduction at fp16 precision (what a broken or misconfigured compression gives):
        # ~3e-5 off after 10-20 steps, which the fp32 tolerance must not admit.
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        ddp.register_comm_hook(group, default_hooks.fp16_compress_hook)
    initial = copy.deepcopy(ddp.module).cpu()  # after the constructor's broadcast
    opt = torch.optim.SGD(ddp.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    loss_fn = nn.MSELoss(reduction="sum" if cfg.control("sum-loss") else "mean")

    timer = StepTimer(cfg.warmup, env.device)
    losses: list[float] = []
    for x, y in training_steps(env, loader, sampler, timer, cfg.steps, cfg.beats_at, NAME,
                               set_epoch=not cfg.control("no-set-epoch")):
        x, y = x.to(env.device, non_blocking=True), y.to(env.device, non_blocking=True)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(ddp(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    final = unwrap_names(params_of(ddp))
    losses_f = [float(v) for v in losses]
    env.beat(f"{NAME}/gather")
    gathered = env.gather({"params": final, "samples_per_s": timer.samples_per_s(b * world)})
    del ddp, opt, model  # release the reducer before the group goes away (gloo teardown hang)
    gc.collect()
    if gathered is None:
        return None

    env.beat(f"{NAME}/reference")
    rtol, atol = cfg.tolerances()
    ref, ref_rate = _reference(initial, data, cfg, world, env.device)
    comparisons = [
        compare("parameters vs single-device reference", final, params_of(ref), rtol, atol),
        identical("replicas identical", [g["params"] for g in gathered]),
    ]
    rate = gathered[0]["samples_per_s"]
    figures = {"ddp_samples_per_s": rate, "ddp_reference_samples_per_s": ref_rate,
               "ddp_scaling_efficiency": rate / (world * ref_rate), "ddp_world_size": world}
    details = {"world_size": world, "dataset_size": n, "global_batch": b * world,
               "epochs": -(-cfg.steps // len(loader)), "loss_first": losses_f[0], "loss_last": losses_f[-1],
               "tolerances": {"rtol": rtol, "atol": atol}, "dtype": cfg.dtype,
               "backend": env.backend}
    return JobReport.judge(NAME, comparisons,
                           f"{world} ranks x {cfg.steps} steps equal the single-device reference "
                           f"(max abs diff {comparisons[0].max_abs:.2g}); replicas identical",
                           figures=figures, details=details)


def _reference(initial: nn.Module, data: TeacherDataset, cfg: TrainConfig, world: int,
               device: torch.device) -> tuple[nn.Module, float]:
    """Single-device training on the global batches DistributedSampler hands out."""
    model = copy.deepcopy(initial).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    loss_fn = nn.MSELoss()
    batches = global_batches(len(data), world, cfg.batch_size, cfg.seed, cfg.steps)
    timer = StepTimer(cfg.warmup, device)
    for idx in batches:
        timer.tick()
        x, y = data.x[idx].to(device), data.y[idx].to(device)
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()
    timer.stop()
    return model, throughput(cfg.batch_size * world * (timer.steps - timer.warmup), timer.elapsed)
