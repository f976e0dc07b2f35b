"""`tp`: tensor parallel (DTensor column/row layers) and 2D (data x tensor) equal one device.

Tensor parallel over all ranks: the MLP's first Linear is ColwiseParallel and its second
RowwiseParallel (Megatron-style pair: one all-reduce per forward), the last Linear replicated;
every rank reads the same global batch. 2D on >= 4 ranks (even count): a (data, tensor) device
mesh of (N/2, 2), the same tensor-parallel plan on the "tp" dimension and `fully_shard` over the
"dp" dimension (torchtitan's layout); each data-parallel replica reads its slice of the batch.
Rank 0 compares the gathered parameters with the single-device reference; the replicated pieces
must be bit-identical on every rank. Negative control `tp-rank-data`: each rank reads its own
slice instead of its tensor-parallel group's batch (silently wrong: DTensor trusts that inputs
marked Replicate are equal).

    torchrun --standalone --nproc-per-node=4 -m trainer tp
Supervised: python -m trainer tp --nproc 4
"""

from __future__ import annotations

import copy
import gc
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from trainer.config import TrainConfig
from trainer.distenv import DistEnv
from trainer.jobs import common
from trainer.models import mlp
from trainer.report import JobReport, compare, identical

NAME = "tp"
PLAN = {"0.0": ColwiseParallel(), "1.0": RowwiseParallel()}  # mlp(): block.Linear names


def replicated(module: nn.Module) -> dict[str, torch.Tensor]:
    """Parameters every tensor-parallel rank holds whole and updates on its own."""
    out = {}
    for key, value in module.state_dict().items():
        if isinstance(value, DTensor):
            if not all(isinstance(p, Replicate) for p in value.placements):
                continue
            value = value.to_local()
        out[key] = value.detach().to("cpu", copy=True)
    return out


def train(env: DistEnv, model: nn.Module, data: Any, cfg: TrainConfig, phase: str,
          rows_of: Any) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    dtype = common.model_dtype(model)
    for step in range(cfg.steps):
        if cfg.beats_at(step):
            env.beat(f"{NAME}/{phase}-step-{step}")
        r = rows_of(step)
        opt.zero_grad(set_to_none=True)
        nn.functional.mse_loss(model(data.x[r].to(env.device, dtype)),
                               data.y[r].to(env.device, dtype)).backward()
        opt.step()
    del opt


def mesh_2d(env: DistEnv, dp: int, tp: int) -> DeviceMesh:
    """A (dp, tp) mesh whose groups come from env.new_group, so they carry the job's timeout
    (init_device_mesh would create its sub-groups with c10d's 30-minute default). Every rank
    creates every group, in the same order, and keeps the two it belongs to."""
    grid = torch.arange(dp * tp).reshape(dp, tp)
    tp_groups = [env.new_group(grid[i].tolist()) for i in range(dp)]
    dp_groups = [env.new_group(grid[:, j].tolist()) for j in range(tp)]
    row, col = divmod(env.rank, tp)
    return DeviceMesh.from_group([dp_groups[col], tp_groups[row]], env.device.type, mesh=grid,
                                 mesh_dim_names=("dp", "tp"))


def run(env: DistEnv, cfg: TrainConfig) -> JobReport | None:
    world = env.world_size
    if world < 2:
        return JobReport(NAME, "SKIP", f"needs >= 2 ranks, have {world}")
    dtype = getattr(torch, cfg.dtype)
    b = cfg.batch_size
    wrong_rows = cfg.control("tp-rank-data")
    torch.manual_seed(cfg.seed)
    initial = mlp(cfg.hidden)
    data = common.dataset(env, cfg.steps, b, dtype, cfg.seed)  # global batch b x world

    env.beat(f"{NAME}/tp-setup")
    mesh = init_device_mesh(env.device.type, (world,), mesh_dim_names=("tp",))
    model = parallelize_module(copy.deepcopy(initial).to(env.device, dtype), mesh, PLAN)

    def tp_rows(step: int) -> slice:
        if wrong_rows:
            return common.rows(step, b, world, env.rank)
        return common.rows(step, b * world, 1)

    train(env, model, data, cfg, "tp", tp_rows)
    env.beat(f"{NAME}/tp-gather")
    tp_full, tp_replicated = common.full_params(model), replicated(model)
    del model
    gc.collect()

    two_d = world >= 4 and world % 2 == 0
    d2_full = d2_replicated = None
    if two_d:
        env.beat(f"{NAME}/2d-setup")
        mesh2 = mesh_2d(env, world // 2, 2)
        model2 = copy.deepcopy(initial).to(env.device, dtype)
        parallelize_module(model2, mesh2["tp"], PLAN)
        fully_shard(model2, mesh=mesh2["dp"])
        replica = mesh2["dp"].get_local_rank()

        def dp_rows(step: int) -> slice:
            if wrong_rows:
                return common.rows(step, b, world, env.rank)
            return common.rows(step, 2 * b, world // 2, replica)

        train(env, model2, data, cfg, "2d", dp_rows)
        env.beat(f"{NAME}/2d-gather")
        d2_full = common.full_params(model2)
        d2_replicated = _tp_replicated_pieces(model2)
        del model2
        gc.collect()
    gathered = env.gather({"tp_full": tp_full, "tp_replicated": tp_replicated,
                           "d2_full": d2_full, "d2_replicated": d2_replicated})
    if gathered is None:
        return None

    env.beat(f"{NAME}/reference")
    rtol, atol = cfg.tolerances()
    ref, _ = common.reference(initial, data, cfg.steps, b * world, cfg.lr, cfg.momentum,
                              env.device, dtype)
    expected = {k: v.detach().cpu() for k, v in ref.state_dict().items()}
    comparisons = [
        compare(f"tensor parallel ({world} ranks): parameters vs single-device reference",
                tp_full, expected, rtol, atol),
        identical("tensor parallel: replicated parameters identical on every rank",
                  [g["tp_replicated"] for g in gathered]),
    ]
    details: dict[str, Any] = {"world_size": world, "global_batch": b * world, "dtype": cfg.dtype,
                               "plan": "0.0 ColwiseParallel, 1.0 RowwiseParallel, 2 replicated",
                               "tolerances": {"rtol": rtol, "atol": atol}}
    if two_d:
        comparisons += [
            compare(f"2D ({world // 2} data x 2 tensor): parameters vs single-device reference",
                    gathered[0]["d2_full"], expected, rtol, atol),
            identical("2D: every rank gathers the same parameters",
                      [g["d2_full"] for g in gathered]),
            *[identical(f"2D replica {d}: tensor-parallel peers hold the same replicated pieces",
                        [gathered[2 * d]["d2_replicated"], gathered[2 * d + 1]["d2_replicated"]])
              for d in range(world // 2)],
        ]
        details["mesh_2d"] = {"dp": world // 2, "tp": 2}
    else:
        details["2d"] = f"skipped: 2D (data x tensor) needs an even rank count >= 4, have {world}"
    summary = (f"tensor parallel over {world} ranks" + (f" and 2D ({world // 2}x2)" if two_d else "")
               + " equal the single-device reference (max abs diff "
               f"{max(c.max_abs for c in comparisons):.2g}); replicated parameters identical")
    return JobReport.judge(NAME, comparisons, summary, details=details)


def _tp_replicated_pieces(model: nn.Module) -> dict[str, torch.Tensor]:
    """Local pieces of the 2D parameters that are Replicate on the "tp" mesh dimension: the two
    tensor-parallel peers of a data-parallel replica must hold identical ones."""
    out = {}
    for key, value in model.state_dict().items():
        names = value.device_mesh.mesh_dim_names or () if isinstance(value, DTensor) else ()
        if isinstance(value, DTensor) and ("tp" not in names
                                           or isinstance(value.placements[names.index("tp")],
                                                         Replicate)):
            out[key] = value.to_local().detach().to("cpu", copy=True)
    return out
