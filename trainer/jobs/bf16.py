"""`bf16`: DDP under bf16 autocast keeps the loss curve within a calibrated band of fp32.

bf16 cannot equal fp32, so this is a band, reported apart from the exact fp32 equivalence of the
`ddp` job: DDP (fp32 master weights) with the forward under `torch.autocast(bfloat16)` trains
common.BAND_STEPS steps at common.BAND_LR; every step's global loss (mean of the ranks' losses)
must lie within common.BF16_BAND (relative) of the fp32 single-device curve on the same batches,
and the replicas must stay bit-identical. The job also observes what it names: every Linear's
output under autocast must have been bfloat16 on every rank while its weights stayed fp32 (a
forward hook records the dtypes), so a run where autocast never took effect FAILs even though
its fp32 loss curve sits inside the band. Negative controls: `bf16-weights`, the model cast to
bfloat16 with no fp32 master copy (small updates round away), which must leave the band;
`bf16-no-autocast`, autocast left off, which the dtype observation must catch.

    torchrun --standalone --nproc-per-node=2 -m trainer bf16
"""

from __future__ import annotations

import copy
import gc

import torch

from trainer.config import TrainConfig
from trainer.distenv import DistEnv
from trainer.jobs import common
from trainer.models import mlp, params_of, unwrap_names
from trainer.report import JobReport, identical

NAME = "bf16"


def run(env: DistEnv, cfg: TrainConfig) -> JobReport | None:
    world = env.world_size
    if world < 2:
        return JobReport(NAME, "SKIP", f"needs >= 2 ranks, have {world}")
    b = cfg.batch_size
    torch.manual_seed(cfg.seed)
    initial = mlp(common.band_hidden(cfg))  # the calibrated width at every size
    data = common.dataset(env, common.BAND_STEPS, b, torch.float32, cfg.seed)
    env.beat(f"{NAME}/setup")
    weights_bf16 = cfg.control("bf16-weights")
    autocast = not weights_bf16 and not cfg.control("bf16-no-autocast")
    model = common.ddp(copy.deepcopy(initial).to(env.device, torch.bfloat16 if weights_bf16
                                                  else torch.float32), env)
    probe = common.DtypeProbe(model)
    losses = common.ddp_train(env, model, data, common.BAND_STEPS, b, common.BAND_LR,
                              cfg.momentum, NAME, cfg.beats_at, autocast=autocast)
    seen = probe.remove()
    final = unwrap_names(params_of(model))
    del model
    gc.collect()
    env.beat(f"{NAME}/gather")
    gathered = env.gather({"losses": losses, "params": final, "dtypes": seen})
    if gathered is None:
        return None
    env.beat(f"{NAME}/reference")
    _, baseline = common.reference(initial, data, common.BAND_STEPS, b * world, common.BAND_LR,
                                   cfg.momentum, env.device, torch.float32)
    curve = common.mean_curve([g["losses"] for g in gathered])
    dtypes = [g["dtypes"] for g in gathered]
    comparisons = [
        common.loss_band("bf16 autocast: loss curve vs fp32 single-device", curve, baseline,
                         common.BF16_BAND),
        common.saw_only("autocast ran: activations were bfloat16 on every rank", dtypes,
                        "outputs", "bfloat16"),
        common.saw_only("master weights stayed float32 on every rank", dtypes, "weights",
                        "float32"),
        identical("replicas identical", [g["params"] for g in gathered]),
    ]
    details = {"world_size": world, "global_batch": b * world, "loss_first": curve[0],
               "loss_last": curve[-1], "fp32_loss_last": baseline[-1],
               "observed_dtypes_per_rank": dtypes,
               "precision": "bf16 weights, no master copy (negative control)" if weights_bf16
               else "fp32, autocast off (negative control)" if not autocast
               else "autocast bf16 forward, fp32 master weights and loss",
               **common.describe_band(common.BF16_BAND)}
    return JobReport.judge(NAME, comparisons,
                           f"bf16 autocast DDP on {world} ranks: loss within "
                           f"{common.BF16_BAND:g} of fp32 over {common.BAND_STEPS} steps (max rel "
                           f"{comparisons[0].max_rel:.2g}); activations bfloat16, master weights float32 "
                           "(observed on every rank); replicas identical", details=details)
