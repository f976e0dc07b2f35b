"""`hybrid`: data-parallel replicas of a pipelined model equal one device (2 stages x N replicas).

Rank r is stage r % 2 of replica r // 2. Each replica pipelines its DistributedSampler shard
(shuffle, set_epoch, drop_last=True) through 2 stages with 1F1B; each stage module is wrapped in
DDP over its data-parallel group (the ranks holding that stage in every replica). Rank 0 checks
that the replicas of each stage are bit-identical and that replica 0 equals the unsplit model
trained on the global batches.

The traps (torch 2.13): given no stage shapes, PipelineStage runs a real forward/backward to
infer them, outside the schedule; DDP's reducer then expects a reduction that never comes and the
second step dies in the reducer, and `static_graph=True` "fixes" that by silently never syncing
the gradients again (the replicas drift apart). Here the stage shapes are static, so DDP runs with
its defaults; the `static-graph` negative control rebuilds the silent case and must FAIL.

One node, 4 ranks (2 stages x 2 replicas):
    torchrun --standalone --nproc-per-node=4 -m trainer hybrid
Several nodes (stages within a node, replicas across nodes; HOST = first node's address):
    torchrun --nnodes=2 --nproc-per-node=8 --rdzv-backend=c10d --rdzv-endpoint=HOST:29400 \
        --rdzv-id=nodecert-hybrid -m trainer hybrid
Supervised: python -m trainer hybrid --nproc 4
"""

from __future__ import annotations

import copy
import gc
from typing import Any

import torch
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

from trainer.config import TrainConfig
from trainer.data import TeacherDataset, dataset_size, global_batches
from trainer.distenv import DistEnv, StepTimer, training_steps
from trainer.jobs.pipeline import NO_P2P, static_stage
from trainer.models import D_IN, D_OUT, mlp_blocks, params_of, unwrap_names
from trainer.report import JobReport, compare, identical

NAME = "hybrid"
STAGES = 2
BLOCKS_PER_STAGE = 2


def run(env: DistEnv, cfg: TrainConfig) -> JobReport | None:
    world = env.world_size
    if world < 2 * STAGES or world % STAGES:
        return JobReport(NAME, "SKIP", f"needs an even number of ranks >= {2 * STAGES} "
                         f"({STAGES} stages x >= 2 replicas), have {world}")
    if not env.p2p:
        return JobReport(NAME, "SKIP", NO_P2P)
    dtype = getattr(torch, cfg.dtype)
    replicas = world // STAGES
    index, replica = env.rank % STAGES, env.rank // STAGES
    # Every rank creates every group, in the same order.
    pipe_groups = [env.new_group([r * STAGES + s for s in range(STAGES)]) for r in range(replicas)]
    data_groups = [env.new_group([r * STAGES + s for r in range(replicas)]) for s in range(STAGES)]

    micro_batches = 2 * STAGES
    batch = micro_batches * cfg.batch_size  # per replica
    n = dataset_size(replicas, batch, cfg.steps_per_epoch)
    data = TeacherDataset(n, (D_IN,), D_OUT, seed=cfg.seed, dtype=dtype)
    sampler: DistributedSampler[Any] = DistributedSampler(
        data, num_replicas=replicas, rank=replica, shuffle=True, seed=cfg.seed, drop_last=True)
    loader = DataLoader(data, batch_size=batch, sampler=sampler)

    env.beat(f"{NAME}/setup")
    torch.manual_seed(cfg.seed)
    blocks = mlp_blocks(STAGES * BLOCKS_PER_STAGE, cfg.hidden)
    initial = nn.Sequential(*copy.deepcopy(blocks))
    mine = blocks[index * BLOCKS_PER_STAGE:(index + 1) * BLOCKS_PER_STAGE]
    module = nn.Sequential(*mine).to(env.device, dtype)
    silent = cfg.control("static-graph")
    ddp = DDP(module, device_ids=[env.device] if env.is_cuda else None,
              process_group=data_groups[index], static_graph=silent)
    width_in = D_IN if index == 0 else cfg.hidden
    width_out = D_OUT if index == STAGES - 1 else cfg.hidden
    if silent:
        stage = PipelineStage(ddp, index, STAGES, env.device, group=pipe_groups[replica])
    else:
        stage = static_stage(ddp, index, STAGES, cfg.batch_size, width_in, width_out, env.device,
                             dtype, pipe_groups[replica])
    schedule = Schedule1F1B(stage, micro_batches, loss_fn=nn.MSELoss())
    opt = torch.optim.SGD(ddp.parameters(), lr=cfg.lr, momentum=cfg.momentum)

    timer = StepTimer(cfg.warmup, env.device)
    for x, y in training_steps(env, loader, sampler, timer, cfg.steps, cfg.beats_at, NAME):
        opt.zero_grad(set_to_none=True)
        if index == 0:
            schedule.step(x.to(env.device))
        else:
            schedule.step(target=y.to(env.device))
        opt.step()
    env.beat(f"{NAME}/gather")
    gathered = env.gather({"params": unwrap_names(params_of(ddp)),
                           "samples_per_s": timer.samples_per_s(batch * replicas)})
    del schedule, stage, opt, ddp, module
    gc.collect()
    if gathered is None:
        return None

    env.beat(f"{NAME}/reference")
    rtol, atol = cfg.tolerances()
    comparisons = [identical(f"stage {s}: replicas identical",
                             [gathered[r * STAGES + s]["params"] for r in range(replicas)])
                   for s in range(STAGES)]
    actual = {}
    for s in range(STAGES):
        for key, value in gathered[s]["params"].items():
            block, rest = key.split(".", 1)
            actual[f"{s * BLOCKS_PER_STAGE + int(block)}.{rest}"] = value
    reference, ref_rate = _reference(initial, data, cfg, replicas, batch, env.device, dtype)
    comparisons.append(compare("replica 0 vs single-device reference", actual,
                               params_of(reference), rtol, atol))
    rate = gathered[STAGES - 1]["samples_per_s"]
    figures = {"hybrid_samples_per_s": rate, "hybrid_reference_samples_per_s": ref_rate,
               "hybrid_scaling_efficiency": rate / (world * ref_rate)}
    details: dict[str, Any] = {
        "stages": STAGES, "replicas": replicas, "micro_batches": micro_batches,
        "global_batch": batch * replicas, "schedule": "1F1B",
        "epochs": -(-cfg.steps // len(loader)),
        "ddp": "static_graph=True, inferred stage shapes (negative control)" if silent
        else "defaults, static stage shapes", "tolerances": {"rtol": rtol, "atol": atol}}
    return JobReport.judge(NAME, comparisons,
                           f"{STAGES} stages x {replicas} replicas equal the single-device "
                           f"reference (max abs diff {comparisons[-1].max_abs:.2g}); "
                           "replicas identical", figures=figures, details=details)


def _reference(model: nn.Module, data: TeacherDataset, cfg: TrainConfig, replicas: int,
               batch: int, device: torch.device, dtype: torch.dtype) -> tuple[nn.Module, float]:
    model = model.to(device, dtype)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    timer = StepTimer(cfg.warmup, device)
    for idx in global_batches(len(data), replicas, batch, cfg.seed, cfg.steps):
        timer.tick()
        opt.zero_grad(set_to_none=True)
        nn.functional.mse_loss(model(data.x[idx].to(device)), data.y[idx].to(device)).backward()
        opt.step()
    timer.stop()
    return model, timer.samples_per_s(batch * replicas)
