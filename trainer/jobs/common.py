"""Pieces the modern-parallelism jobs share: sliced global batches, the single-device reference,
loss-curve bands, full parameters out of DTensors, a scratch directory every rank sees.

The jobs here feed each rank a fixed slice of a seeded global batch (rank r of G ranks takes rows
[r*b, (r+1)*b) of step k's batch), so the reference is plain full-batch training and the data
path cannot hide a parallelism bug; the `loader` job is the one that tests DistributedSampler and
DataLoader workers.
"""

from __future__ import annotations

import copy
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from trainer.data import TeacherDataset
from trainer.distenv import DistEnv
from trainer.models import D_IN, D_OUT
from trainer.report import Comparison, compare

# Loss-curve comparisons for bf16 (autocast, FSDP mixed precision) run this many steps at this
# learning rate: the band below was calibrated there (docs/trainer.md, "Calibrated bands").
BAND_STEPS, BAND_LR = 40, 0.01
# |loss_bf16 - loss_fp32| <= BF16_BAND x loss_fp32 at every step. Measured on this project's MLP
# (30 seeds, torch 2.13 CPU): autocast bf16 deviates at most 0.0025 (median 0.0013); a model cast
# to bf16 without fp32 master weights (the `bf16-weights` control) at least 0.023.
BF16_BAND = 0.01
# The width the band was calibrated at: at --size large the band comparisons (bf16 autocast, FSDP
# mixed precision) keep it; the exact fp32 comparisons carry the large width.
BAND_HIDDEN = 64


def band_hidden(cfg: Any) -> int:
    return BAND_HIDDEN if cfg.size == "large" else cfg.hidden


def dataset(env: DistEnv, steps: int, per_rank: int, dtype: torch.dtype,
            seed: int, replicas: int | None = None) -> TeacherDataset:
    """Enough seeded teacher data for `steps` global batches of `per_rank` x replicas rows."""
    replicas = replicas or env.world_size
    return TeacherDataset(steps * per_rank * replicas, (D_IN,), D_OUT, seed=seed, dtype=dtype)


def rows(step: int, per_rank: int, replicas: int, replica: int | None = None) -> slice:
    """Rows of step `step`'s global batch: all of them, or those of one replica."""
    start = step * per_rank * replicas
    if replica is None:
        return slice(start, start + per_rank * replicas)
    return slice(start + replica * per_rank, start + (replica + 1) * per_rank)


def reference(initial: nn.Module, data: TeacherDataset, steps: int, global_batch: int, lr: float,
              momentum: float, device: torch.device,
              dtype: torch.dtype | None = None) -> tuple[nn.Module, list[float]]:
    """The single-device run: the same initial weights trained on each whole global batch."""
    model = copy.deepcopy(initial).to(device)
    if dtype is not None:
        model = model.to(dtype)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    losses = []
    for step in range(steps):
        r = rows(step, global_batch, 1)
        x, y = data.x[r].to(device, model_dtype(model)), data.y[r].to(device, model_dtype(model))
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    return model, losses


def model_dtype(model: nn.Module) -> torch.dtype:
    return next(model.parameters()).dtype


def loss_band(name: str, curve: list[float], baseline: list[float], band: float) -> Comparison:
    """Every step's loss within `band` (relative) of the baseline's; non-finite losses fail."""
    return compare(name, {"loss": torch.tensor(curve, dtype=torch.float64)},
                   {"loss": torch.tensor(baseline, dtype=torch.float64)}, band, 0.0)


def mean_curve(per_rank: list[list[float]]) -> list[float]:
    """The global batch's loss from each rank's mean loss over an equal share of it."""
    return [sum(v) / len(v) for v in zip(*per_rank, strict=True)]


def full_params(module: nn.Module) -> dict[str, torch.Tensor]:
    """Parameters and buffers by name as whole tensors on the CPU. DTensors (FSDP shards, tensor
    parallel pieces) are gathered: a collective, so every rank of their mesh must call this."""
    out: dict[str, torch.Tensor] = {}
    for key, value in module.state_dict().items():
        if isinstance(value, DTensor):
            value = value.full_tensor()
        out[key] = value.detach().to("cpu", copy=True)
    return out


def local_shards(module: nn.Module) -> dict[str, torch.Tensor]:
    """This rank's own piece of each DTensor parameter (what it stores and updates)."""
    return {k: v.to_local().detach().to("cpu", copy=True) for k, v in module.state_dict().items()
            if isinstance(v, DTensor)}


def scratch_dir(env: DistEnv, name: str) -> Path:
    """A directory every rank of this node sees (in the launch's workdir when supervised);
    checkpoints need one shared path, so rank 0 chooses it and tells the others."""
    base = env.reporter.workdir
    path = None
    if env.rank == 0:
        path = str(base / f"{name}-scratch" if base else Path(tempfile.mkdtemp(prefix=f"{name}-")))
        Path(path).mkdir(parents=True, exist_ok=True)
    return Path(env.broadcast(path))


def remove_dir(env: DistEnv, path: Path) -> None:
    env.barrier()
    if env.rank == 0:
        shutil.rmtree(path, ignore_errors=True)


def describe_band(band: float, steps: int = BAND_STEPS) -> dict[str, Any]:
    return {"band_rel": band, "band_steps": steps, "band_lr": BAND_LR}


def holds(name: str, ok: bool, why: str) -> Comparison:
    """A yes/no fact as a comparison (e.g. "the model was compiled"), so it joins the verdict."""
    return Comparison(name, 0.0 if ok else float("inf"), 0.0 if ok else float("inf"), 0.0, 0.0,
                      ok, "" if ok else why)


class DtypeProbe:
    """Records the dtypes the Linear layers of a module really saw during forward passes (their
    weight as used and their output), so a job can prove the precision it names was in effect
    (autocast, FSDP's param_dtype) rather than assume it. Forward hooks travel with the module
    into DDP, FSDP and DataParallel replicas."""

    def __init__(self, module: nn.Module) -> None:
        self.outputs: set[str] = set()
        self.weights: set[str] = set()
        self.calls = 0
        self._handles = [m.register_forward_hook(self._hook) for m in module.modules()
                         if isinstance(m, nn.Linear)]

    def _hook(self, module: nn.Module, inputs: Any, output: Any) -> None:
        del inputs
        self.calls += 1
        self.outputs.add(str(output.dtype).removeprefix("torch."))
        self.weights.add(str(module.weight.dtype).removeprefix("torch."))

    def remove(self) -> dict[str, Any]:
        for h in self._handles:
            h.remove()
        return {"outputs": sorted(self.outputs), "weights": sorted(self.weights),
                "calls": self.calls}


def saw_only(name: str, seen: list[dict[str, Any]], key: str, want: str) -> Comparison:
    """Every rank's probe saw only dtype `want` under `key` (and saw something at all)."""
    bad = [(r, s[key]) for r, s in enumerate(seen) if s["calls"] == 0 or s[key] != [want]]
    return holds(name, not bad, "" if not bad else
                 f"rank {bad[0][0]} saw {', '.join(bad[0][1]) or 'no forward'}, not {want}")


def ddp(module: nn.Module, env: DistEnv, **kw: Any) -> DistributedDataParallel:
    """DDP over a group of its own (the job's collectives never mix with the control group)."""
    return DistributedDataParallel(module, device_ids=[env.device] if env.is_cuda else None,
                                   process_group=env.new_group(), **kw)


def ddp_train(env: DistEnv, model: nn.Module, data: TeacherDataset, steps: int, per_rank: int,
              lr: float, momentum: float, phase: str, beats_at: Any,
              autocast: bool = False) -> list[float]:
    """This rank's slice of each global batch, `steps` SGD steps; returns its local losses."""
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    dtype = model_dtype(model)
    losses = []
    for step in range(steps):
        if beats_at(step):
            env.beat(f"{phase}-step-{step}")
        r = rows(step, per_rank, env.world_size, env.rank)
        x, y = data.x[r].to(env.device, dtype), data.y[r].to(env.device)
        opt.zero_grad(set_to_none=True)
        with torch.autocast(env.device.type, dtype=torch.bfloat16, enabled=autocast):
            out = model(x)
        loss = nn.functional.mse_loss(out.to(y.dtype), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    del opt
    return [float(v) for v in losses]
