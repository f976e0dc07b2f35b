"""`syncbn`: synchronized BatchNorm under DDP equals BatchNorm over the concatenated batch.

Rank r holds batch_size + r samples (uneven on purpose). On GPUs the model's BatchNorm becomes
torch's nn.SyncBatchNorm (convert_sync_batchnorm, NCCL); on CPU, where nn.SyncBatchNorm cannot
train, the project's GlooSyncBatchNorm (trainer/syncbn_cpu.py) takes its place; the report says
which ran. Rank 0 runs plain BatchNorm on the concatenation of all ranks' inputs and compares, at
the first step, each rank's output slice, input-gradient slice and the BN weight/bias gradients,
and after k steps every parameter and the running mean/variance (unbiased over the global count).

Loss weighting: each rank's loss is its squared-error sum x world / global element count, so DDP's averaging
gives the gradient of the global mean even with uneven batches. Every rank's backward
differentiates the SUM of all ranks' losses (the statistics are shared), so input gradients equal
world x the reference's.

One node:  torchrun --standalone --nproc-per-node=2 -m trainer syncbn
Several nodes: torchrun --nnodes=2 --nproc-per-node=8 --rdzv-backend=c10d \
    --rdzv-endpoint=HOST:29400 --rdzv-id=nodecert-syncbn -m trainer syncbn
Supervised: python -m trainer syncbn --nproc 2
"""

from __future__ import annotations

import copy
import gc
from typing import Any, cast

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from trainer import syncbn_cpu
from trainer.config import TrainConfig
from trainer.data import TeacherDataset
from trainer.distenv import DistEnv, StepTimer
from trainer.models import D_OUT, IMAGE, conv_bn_net, params_of, unwrap_names
from trainer.report import JobReport, compare, identical


def _grad(t: torch.Tensor) -> torch.Tensor:
    """The gradient the backward pass just wrote (every tensor here requires one)."""
    assert t.grad is not None, "backward left no gradient"
    return t.grad

NAME = "syncbn"
# fp32: measured BN-gradient differences ~6e-6 on values of order 1-10; float64 ~1e-14.
TOLERANCES = {"float32": (1e-4, 1e-5), "float64": (1e-9, 1e-12)}


def sizes(world: int, base: int) -> list[int]:
    return [base + r for r in range(world)]


def run(env: DistEnv, cfg: TrainConfig) -> JobReport | None:
    world = env.world_size
    if world < 2:
        return JobReport(NAME, "SKIP", f"needs >= 2 ranks, have {world}")
    dtype = getattr(torch, cfg.dtype)
    per_rank = sizes(world, cfg.batch_size)
    total = sum(per_rank)
    offset = sum(per_rank[:env.rank])
    # Inputs far from zero mean/unit variance, so normalising with the wrong statistics shows.
    data = TeacherDataset(total * cfg.steps, IMAGE, D_OUT, seed=cfg.seed, dtype=dtype,
                          mean=2.0, std=3.0)

    env.beat(f"{NAME}/setup")
    torch.manual_seed(cfg.seed)
    net: nn.Module = conv_bn_net().to(env.device, dtype)
    initial = copy.deepcopy(net).cpu()
    bn_group = env.new_group()
    ddp_group = env.new_group()
    if cfg.control("local-bn"):
        impl = "nn.BatchNorm2d (per-rank statistics: negative control)"
    elif env.is_cuda:
        net = nn.SyncBatchNorm.convert_sync_batchnorm(net, process_group=bn_group)
        impl = "torch.nn.SyncBatchNorm (NCCL)"
    else:
        net = syncbn_cpu.convert(net, bn_group)
        impl = "trainer.syncbn_cpu.GlooSyncBatchNorm (gloo; nn.SyncBatchNorm cannot train on CPU)"
    ddp = DDP(net, device_ids=[env.device] if env.is_cuda else None, process_group=ddp_group)
    opt = torch.optim.SGD(ddp.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    bn = unwrap_names(dict(ddp.named_parameters()))

    timer = StepTimer(cfg.warmup, env.device)
    first: dict[str, torch.Tensor] = {}
    for step in range(cfg.steps):
        timer.tick()
        if cfg.beats_at(step):
            env.beat(f"{NAME}/step-{step}")
        rows = slice(step * total + offset, step * total + offset + per_rank[env.rank])
        x = data.x[rows].to(env.device).requires_grad_(step == 0)
        y = data.y[rows].to(env.device)
        opt.zero_grad(set_to_none=True)
        out = ddp(x)
        # sum over this rank's elements / global element count x world: see the docstring
        loss = nn.functional.mse_loss(out, y, reduction="sum") * (world / (total * D_OUT))
        loss.backward()
        if step == 0:
            first = {"output": out.detach().cpu(), "input_grad": _grad(x).detach().cpu(),
                     "bn.weight.grad": _grad(bn["1.weight"]).detach().cpu(),
                     "bn.bias.grad": _grad(bn["1.bias"]).detach().cpu()}
        opt.step()
    timer.stop()
    env.beat(f"{NAME}/gather")
    gathered = env.gather({"first": first, "params": unwrap_names(params_of(ddp)),
                           "samples_per_s": timer.samples_per_s(total)})
    del ddp, opt, net, bn
    gc.collect()
    if gathered is None:
        return None

    env.beat(f"{NAME}/reference")
    ref_first, ref_params, ref_rate = _reference(initial, data, cfg, total, env.device)
    rtol, atol = TOLERANCES[cfg.dtype] if cfg.rtol is None else cfg.tolerances()
    starts = [sum(per_rank[:r]) for r in range(world)]
    comparisons = [
        compare("step 0: output slices",
                {f"rank{r}": g["first"]["output"] for r, g in enumerate(gathered)},
                {f"rank{r}": ref_first["output"][s:s + per_rank[r]] for r, s in enumerate(starts)},
                rtol, atol),
        compare("step 0: input-gradient slices (x world)",
                {f"rank{r}": g["first"]["input_grad"] for r, g in enumerate(gathered)},
                {f"rank{r}": world * ref_first["input_grad"][s:s + per_rank[r]]
                 for r, s in enumerate(starts)}, rtol, atol),
        compare("step 0: BN weight/bias gradients",
                {k: v for k, v in gathered[0]["first"].items() if k.startswith("bn.")},
                {k: v for k, v in ref_first.items() if k.startswith("bn.")}, rtol, atol),
        compare(f"after {cfg.steps} steps: parameters and running statistics",
                gathered[0]["params"], ref_params, rtol, atol),
        identical("replicas identical", [g["params"] for g in gathered]),
    ]
    rate = gathered[0]["samples_per_s"]
    figures = {"syncbn_samples_per_s": rate, "syncbn_reference_samples_per_s": ref_rate,
               "syncbn_scaling_efficiency": rate / (world * ref_rate)}
    details: dict[str, Any] = {"syncbn_impl": impl, "per_rank_batch": per_rank,
                               "tolerances": {"rtol": rtol, "atol": atol}, "dtype": cfg.dtype}
    return JobReport.judge(NAME, comparisons,
                           f"{impl.split(' (')[0]} over {world} ranks (batches {per_rank}) equals "
                           "BatchNorm on the concatenated batch", figures=figures,
                           details=details)


def _reference(initial: nn.Module, data: TeacherDataset, cfg: TrainConfig, total: int,
               device: torch.device) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], float]:
    model = copy.deepcopy(initial).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    timer = StepTimer(cfg.warmup, device)
    first: dict[str, torch.Tensor] = {}
    for step in range(cfg.steps):
        timer.tick()
        rows = slice(step * total, (step + 1) * total)
        x = data.x[rows].to(device).requires_grad_(step == 0)
        opt.zero_grad(set_to_none=True)
        out = model(x)
        nn.functional.mse_loss(out, data.y[rows].to(device)).backward()
        if step == 0:
            bn_layer = cast(nn.BatchNorm2d, cast(nn.Sequential, model)[1])
            first = {"output": out.detach().cpu(), "input_grad": _grad(x).detach().cpu(),
                     "bn.weight.grad": _grad(bn_layer.weight).detach().cpu(),
                     "bn.bias.grad": _grad(bn_layer.bias).detach().cpu()}
        opt.step()
    timer.stop()
    return first, params_of(model), timer.samples_per_s(total)
