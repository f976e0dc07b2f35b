"""`ckpt`: save mid-run, resume, and the result equals an uninterrupted run.

Two ways people checkpoint, each trained cfg.steps steps without interruption and again as
"cfg.steps // 2 steps, save, throw the model and optimizer away, build fresh ones from a
different random init, load, train the remaining steps":
  * DDP, rank 0 writes the full state dict (model + optimizer + step) with torch.save; every rank
    loads it (map_location to its device) after a barrier;
  * FSDP2, every rank writes its shards with torch.distributed.checkpoint (DCP) through
    get_state_dict / set_state_dict (sharded model and optimizer state).
The resumed parameters must equal the uninterrupted ones (the same operations on the same data;
the dtype's tolerance) and the replicas agree. Negative control `ckpt-no-optim`: the optimizer
state is not restored, so momentum restarts at zero.

    torchrun --standalone --nproc-per-node=2 -m trainer ckpt
"""

from __future__ import annotations

import copy
import gc
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_model_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh

from trainer.config import TrainConfig
from trainer.distenv import DistEnv
from trainer.jobs import common, fsdp
from trainer.models import mlp, params_of, unwrap_names
from trainer.report import JobReport, compare, identical

NAME = "ckpt"


def _steps(env: DistEnv, model: nn.Module, opt: torch.optim.Optimizer, data: Any, first: int,
           last: int, cfg: TrainConfig, phase: str) -> None:
    dtype = common.model_dtype(model)
    for step in range(first, last):
        if cfg.beats_at(step):
            env.beat(f"{NAME}/{phase}-step-{step}")
        r = common.rows(step, cfg.batch_size, env.world_size, env.rank)
        opt.zero_grad(set_to_none=True)
        nn.functional.mse_loss(model(data.x[r].to(env.device, dtype)),
                               data.y[r].to(env.device, dtype)).backward()
        opt.step()


def _fresh(cfg: TrainConfig, env: DistEnv, dtype: torch.dtype, seed: int) -> nn.Sequential:
    torch.manual_seed(seed)
    return mlp(cfg.hidden).to(env.device, dtype)


def ddp_rank0(env: DistEnv, cfg: TrainConfig, initial: nn.Module, data: Any, dtype: torch.dtype,
              where: Path) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(uninterrupted, resumed) parameters of the DDP run with a rank-0 full checkpoint. The run
    saves half-way and carries on (the uninterrupted run); fresh objects then resume."""
    half, path = cfg.steps // 2, where / "ddp-full.pt"
    model = common.ddp(copy.deepcopy(initial).to(env.device, dtype), env)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    _steps(env, model, opt, data, 0, half, cfg, "ddp")
    env.beat(f"{NAME}/ddp-save")
    if env.rank == 0:
        torch.save({"model": model.module.state_dict(), "optim": opt.state_dict(), "step": half},
                   path)
    env.barrier()
    _steps(env, model, opt, data, half, cfg.steps, cfg, "ddp")
    whole = unwrap_names(params_of(model))
    del model, opt
    gc.collect()
    model = common.ddp(_fresh(cfg, env, dtype, cfg.seed + 99), env)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    state = torch.load(path, map_location=env.device, weights_only=True)
    model.module.load_state_dict(state["model"])
    if not cfg.control("ckpt-no-optim"):
        opt.load_state_dict(state["optim"])
    _steps(env, model, opt, data, state["step"], cfg.steps, cfg, "ddp-resumed")
    resumed = unwrap_names(params_of(model))
    del model, opt
    gc.collect()
    return whole, resumed


def fsdp_dcp(env: DistEnv, cfg: TrainConfig, initial: nn.Module, data: Any, dtype: torch.dtype,
             where: Path) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(uninterrupted, resumed) full parameters of the FSDP2 run with a DCP checkpoint."""
    half, path = cfg.steps // 2, where / "fsdp-dcp"
    mesh = init_device_mesh(env.device.type, (env.world_size,))
    model = fsdp.shard(cast(nn.Sequential, copy.deepcopy(initial).to(env.device, dtype)), mesh)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    _steps(env, model, opt, data, 0, half, cfg, "fsdp")
    env.beat(f"{NAME}/dcp-save")
    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(path))
    del msd, osd
    _steps(env, model, opt, data, half, cfg.steps, cfg, "fsdp")
    whole = common.full_params(model)
    del model, opt
    gc.collect()
    model = fsdp.shard(_fresh(cfg, env, dtype, cfg.seed + 99), mesh)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    env.beat(f"{NAME}/dcp-load")
    msd, osd = get_state_dict(model, opt)
    state: dict[str, Any] = {"model": msd} if cfg.control("ckpt-no-optim") else {"model": msd,
                                                                                "optim": osd}
    dcp.load(state, checkpoint_id=str(path))
    if "optim" in state:
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    else:
        set_model_state_dict(model, state["model"])
    _steps(env, model, opt, data, half, cfg.steps, cfg, "fsdp-resumed")
    resumed = common.full_params(model)
    del model, opt
    gc.collect()
    return whole, resumed


def run(env: DistEnv, cfg: TrainConfig) -> JobReport | None:
    world = env.world_size
    if world < 2:
        return JobReport(NAME, "SKIP", f"needs >= 2 ranks, have {world}")
    if cfg.steps < 2:
        return JobReport(NAME, "SKIP", f"needs >= 2 steps to stop half-way, have {cfg.steps}")
    dtype = getattr(torch, cfg.dtype)
    torch.manual_seed(cfg.seed)
    initial = mlp(cfg.hidden)
    data = common.dataset(env, cfg.steps, cfg.batch_size, dtype, cfg.seed)
    where = common.scratch_dir(env, NAME)
    try:
        ddp_whole, ddp_resumed = ddp_rank0(env, cfg, initial, data, dtype, where)
        fsdp_whole, fsdp_resumed = fsdp_dcp(env, cfg, initial, data, dtype, where)
    finally:
        common.remove_dir(env, where)
    env.beat(f"{NAME}/gather")
    gathered = env.gather({"ddp": ddp_resumed, "fsdp": fsdp_resumed})
    if gathered is None:
        return None
    rtol, atol = cfg.tolerances()
    comparisons = [
        compare("DDP, rank-0 full state dict: resumed vs uninterrupted", ddp_resumed, ddp_whole,
                rtol, atol),
        identical("DDP resumed: replicas identical", [g["ddp"] for g in gathered]),
        compare("FSDP2, distributed checkpoint: resumed vs uninterrupted", fsdp_resumed,
                fsdp_whole, rtol, atol),
        identical("FSDP2 resumed: every rank gathers the same parameters",
                  [g["fsdp"] for g in gathered]),
    ]
    details = {"world_size": world, "saved_at_step": cfg.steps // 2, "steps": cfg.steps,
               "optimizer_state": "not restored (negative control)"
               if cfg.control("ckpt-no-optim") else "restored",
               "dtype": cfg.dtype, "tolerances": {"rtol": rtol, "atol": atol}}
    return JobReport.judge(NAME, comparisons,
                           f"saved at step {cfg.steps // 2} of {cfg.steps} (rank-0 torch.save "
                           f"under DDP, DCP under FSDP2), resumed on {world} ranks: equal to "
                           f"uninterrupted runs (max abs diff "
                           f"{max(comparisons[0].max_abs, comparisons[2].max_abs):.2g})",
                           details=details)
