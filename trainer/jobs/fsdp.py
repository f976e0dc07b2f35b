"""`fsdp`: FSDP2 (`fully_shard`) equals single-device training; bf16 mixed precision stays in band.

Each MLP block and then the root are `fully_shard`ed over all ranks (1-D device mesh); every rank
trains on its slice of each global batch. Rank 0 trains the same initial weights on the whole
batches and compares the gathered parameters (no mixed precision: exact to the dtype's
tolerance). Each rank must hold only its own shard (1/N of every parameter) and every rank must
gather the same full parameters. Then a second run with MixedPrecisionPolicy(param_dtype=bf16,
reduce_dtype=bf16) (fp32 master weights) must keep the loss curve within the calibrated bf16 band
of the fp32 single-device curve (the job's own step count, at most the band's 40: the band holds
at every step, so a prefix judges as well), and the job observes that the policy took effect: every Linear
computed with bfloat16 weights and outputs (forward hooks), and every gradient reduce-scatter
carried bfloat16 (FSDP2's `set_custom_reduce_scatter` with a recording copy of its default).
Negative controls: `fsdp-early-optimizer`, the optimizer built before `fully_shard`, which replaces
the parameters, so it steps tensors no longer in the model; `fsdp-no-mp`, the policy left out
(fp32 stays inside the band: only the observation catches it).

    torchrun --standalone --nproc-per-node=2 -m trainer fsdp
Supervised: python -m trainer fsdp --nproc 4
"""

from __future__ import annotations

import copy
import gc
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from trainer.config import TrainConfig
from trainer.distenv import DistEnv
from trainer.jobs import common
from trainer.models import mlp
from trainer.report import Comparison, JobReport, compare, identical

NAME = "fsdp"


def _recording_reduce_scatter() -> Any:
    """FSDP2's default reduce-scatter, recording the dtype of every gradient buffer it reduces."""
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultReduceScatter

    class Recording(DefaultReduceScatter):
        def __init__(self) -> None:
            super().__init__()
            self.dtypes: set[str] = set()

        def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                     *args: Any, **kw: Any) -> Any:
            self.dtypes.add(str(input_tensor.dtype).removeprefix("torch."))
            return super().__call__(output_tensor, input_tensor, *args, **kw)

    return Recording()


def observe_reduce_scatter(model: nn.Sequential) -> Any:
    """Install one recording reduce-scatter on every block that holds parameters."""
    comm = _recording_reduce_scatter()
    for block in model:
        if any(True for _ in block.parameters()):
            block.set_custom_reduce_scatter(comm)  # type: ignore[operator]
    return comm


def shard(model: nn.Sequential, mesh: DeviceMesh, mp: MixedPrecisionPolicy | None = None,
          ) -> nn.Sequential:
    """fully_shard each block, then the root (the layout the FSDP2 tutorial and torchtitan use)."""
    kw: dict[str, Any] = {"mesh": mesh}
    if mp is not None:
        kw["mp_policy"] = mp
    for block in model:
        fully_shard(block, **kw)
    fully_shard(model, **kw)
    return model


def train(env: DistEnv, model: nn.Module, opt: torch.optim.Optimizer, data: Any, steps: int,
          per_rank: int, cfg: TrainConfig, phase: str, first_step: int = 0) -> list[float]:
    """This rank's slice of steps first_step..steps-1; returns its local losses."""
    losses = []
    dtype = common.model_dtype(model)
    for step in range(first_step, steps):
        if cfg.beats_at(step):
            env.beat(f"{NAME}/{phase}-step-{step}")
        r = common.rows(step, per_rank, env.world_size, env.rank)
        x, y = data.x[r].to(env.device, dtype), data.y[r].to(env.device, dtype)
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(model(x).to(y.dtype), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return [float(v) for v in losses]


def run(env: DistEnv, cfg: TrainConfig) -> JobReport | None:
    world = env.world_size
    if world < 2:
        return JobReport(NAME, "SKIP", f"needs >= 2 ranks to shard over, have {world}")
    dtype = getattr(torch, cfg.dtype)
    b = cfg.batch_size
    mesh = init_device_mesh(env.device.type, (world,))
    torch.manual_seed(cfg.seed)
    initial = mlp(cfg.hidden)

    env.beat(f"{NAME}/setup")
    model = copy.deepcopy(initial).to(env.device, dtype)
    if cfg.control("fsdp-early-optimizer"):
        opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
        shard(model, mesh)
    else:
        shard(model, mesh)
        opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    data = common.dataset(env, cfg.steps, b, dtype, cfg.seed)
    losses = train(env, model, opt, data, cfg.steps, b, cfg, "fp32")
    env.beat(f"{NAME}/gather")
    full = common.full_params(model)
    shards = common.local_shards(model)
    del opt, model
    gc.collect()

    env.beat(f"{NAME}/bf16-setup")
    # The band holds at every step of the calibrated curve, so a prefix of it judges as well:
    # the job's own step count (each FSDP step is ~9 collectives per rank).
    mp_steps = min(common.BAND_STEPS, cfg.steps)
    band_data = common.dataset(env, mp_steps, b, torch.float32, cfg.seed + 1)
    policy = None if cfg.control("fsdp-no-mp") else MixedPrecisionPolicy(
        param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
    torch.manual_seed(cfg.seed)
    band_initial = initial if common.band_hidden(cfg) == cfg.hidden else mlp(common.band_hidden(cfg))
    mp_model = shard(copy.deepcopy(band_initial).to(env.device, torch.float32), mesh, policy)
    probe = common.DtypeProbe(mp_model)
    reduce_scatter = observe_reduce_scatter(mp_model)
    mp_opt = torch.optim.SGD(mp_model.parameters(), lr=common.BAND_LR, momentum=cfg.momentum)
    mp_losses = train(env, mp_model, mp_opt, band_data, mp_steps, b, cfg, "bf16")
    seen = {**probe.remove(), "reduce": sorted(reduce_scatter.dtypes)}
    del mp_opt, mp_model
    gc.collect()
    gathered = env.gather({"full": full, "shards": shards, "losses": losses,
                           "mp_losses": mp_losses, "mp_dtypes": seen})
    if gathered is None:
        return None

    env.beat(f"{NAME}/reference")
    mp_seen = [g["mp_dtypes"] for g in gathered]
    rtol, atol = cfg.tolerances()
    ref, _ = common.reference(initial, data, cfg.steps, b * world, cfg.lr, cfg.momentum,
                              env.device, dtype)
    _, band_ref = common.reference(band_initial, band_data, mp_steps, b * world,
                                   common.BAND_LR, cfg.momentum, env.device, torch.float32)
    expected = {k: v.detach().cpu() for k, v in ref.state_dict().items()}
    comparisons = [
        compare("fp32: parameters vs single-device reference", full, expected, rtol, atol),
        identical("every rank gathers the same parameters", [g["full"] for g in gathered]),
        shards_partition([g["shards"] for g in gathered], full),
        common.loss_band("bf16 mixed precision: loss curve vs fp32 single-device",
                         common.mean_curve([g["mp_losses"] for g in gathered]), band_ref,
                         common.BF16_BAND),
        common.saw_only("bf16 mixed precision: FSDP computed with bfloat16 parameters",
                        mp_seen, "weights", "bfloat16"),
        common.saw_only("bf16 mixed precision: FSDP reduce-scattered bfloat16 gradients",
                        [{**d, "calls": len(d["reduce"])} for d in mp_seen], "reduce",
                        "bfloat16"),
    ]
    curve = common.mean_curve([g["losses"] for g in gathered])
    details: dict[str, Any] = {
        "world_size": world, "global_batch": b * world, "dtype": cfg.dtype,
        "tolerances": {"rtol": rtol, "atol": atol}, "loss_first": curve[0], "loss_last": curve[-1],
        "mixed_precision": "param_dtype=bfloat16, reduce_dtype=bfloat16, fp32 master weights"
        if policy is not None else "none (negative control)",
        "mixed_precision_observed_per_rank": mp_seen,
        **common.describe_band(common.BF16_BAND, mp_steps)}
    return JobReport.judge(NAME, comparisons,
                           f"fully_shard over {world} ranks equals the single-device reference "
                           f"(max abs diff {comparisons[0].max_abs:.2g}); each rank holds 1/{world}; "
                           f"bf16 loss curve within {common.BF16_BAND:g} "
                           f"(max rel {comparisons[3].max_rel:.2g}); bfloat16 compute and "
                           "reduce-scatter observed on every rank", details=details)


def shards_partition(per_rank: list[dict[str, torch.Tensor]],
                     full: dict[str, torch.Tensor]) -> Comparison:
    """Rank r's shard of each parameter must be chunk r of the whole along dim 0 (FSDP2's Shard(0))
    and strictly smaller than the whole: an unsharded model fails here."""
    name = "each rank holds only its own dim-0 shard"
    if not per_rank[0]:
        return Comparison(name, float("inf"), float("inf"), 0.0, 0.0, False, "no sharded parameters")
    for key, whole in full.items():
        chunks = torch.chunk(whole, len(per_rank), dim=0)
        for rank, shards in enumerate(per_rank):
            mine = shards.get(key)
            want = chunks[rank] if rank < len(chunks) else whole[:0]
            if mine is None or mine.shape != want.shape or not torch.equal(mine, want) \
                    or (whole.numel() > 1 and mine.numel() >= whole.numel()):
                return Comparison(name, float("inf"), float("inf"), 0.0, 0.0, False,
                                  f"rank {rank}: {key} holds {None if mine is None else tuple(mine.shape)}"
                                  f" of {tuple(whole.shape)}")
    return Comparison(name, 0.0, 0.0, 0.0, 0.0, True)
