"""`accum`: DDP with several gradient buckets and gradient accumulation under `no_sync` equals one
device.

DDP with a tiny `bucket_cap_mb` (each layer's gradients in its own all-reduce, overlapping the
backward, as on a real model with the default 25 MB cap) accumulates ACCUM micro-batches per
optimizer step: the first ACCUM-1 backwards under `no_sync()` (no communication), the last one
synchronising, each micro-batch loss divided by ACCUM. Rank 0 trains the initial weights on the
whole global batch (ACCUM x ranks x batch rows) per step; parameters must match, replicas be
bit-identical, and DDP must report >= 2 buckets reduced. Negative control `accum-no-divide`:
micro-batch losses not divided by ACCUM (gradients ACCUM times too large).

    torchrun --standalone --nproc-per-node=2 -m trainer accum
"""

from __future__ import annotations

import contextlib
import copy
import gc

import torch
from torch import nn

from trainer.config import TrainConfig
from trainer.distenv import DistEnv
from trainer.jobs import common
from trainer.models import mlp, params_of, unwrap_names
from trainer.report import JobReport, compare, identical

NAME = "accum"
ACCUM = 2
BUCKET_CAP_MB = 0.001  # 1 kB: smaller than one layer's gradient, so one bucket per layer


def run(env: DistEnv, cfg: TrainConfig) -> JobReport | None:
    world = env.world_size
    if world < 2:
        return JobReport(NAME, "SKIP", f"needs >= 2 ranks, have {world}")
    b, dtype = cfg.batch_size, getattr(torch, cfg.dtype)
    torch.manual_seed(cfg.seed)
    initial = mlp(cfg.hidden)
    global_batch = ACCUM * world * b
    data = common.dataset(env, cfg.steps, b, dtype, cfg.seed, replicas=ACCUM * world)
    divide = 1 if cfg.control("accum-no-divide") else ACCUM
    env.beat(f"{NAME}/setup")
    model = common.ddp(copy.deepcopy(initial).to(env.device, dtype), env,
                       bucket_cap_mb=BUCKET_CAP_MB)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    for step in range(cfg.steps):
        if cfg.beats_at(step):
            env.beat(f"{NAME}/step-{step}")
        opt.zero_grad(set_to_none=True)
        for micro in range(ACCUM):
            # Micro-batch m of rank r: slot m x ranks + r of the step's global batch.
            r = common.rows(step, b, ACCUM * world, micro * world + env.rank)
            sync = micro == ACCUM - 1
            with contextlib.nullcontext() if sync else model.no_sync():
                loss = nn.functional.mse_loss(model(data.x[r].to(env.device)),
                                              data.y[r].to(env.device))
                (loss / divide).backward()
        opt.step()
    buckets = int(model._get_ddp_logging_data().get("num_buckets_reduced", 0))
    final = unwrap_names(params_of(model))
    del opt, model
    gc.collect()
    env.beat(f"{NAME}/gather")
    gathered = env.gather({"params": final, "buckets": buckets})
    if gathered is None:
        return None
    env.beat(f"{NAME}/reference")
    rtol, atol = cfg.tolerances()
    ref, _ = common.reference(initial, data, cfg.steps, global_batch, cfg.lr, cfg.momentum,
                              env.device, dtype)
    comparisons = [
        compare("parameters vs single-device reference", final, params_of(ref), rtol, atol),
        identical("replicas identical", [g["params"] for g in gathered]),
        common.holds("DDP reduced >= 2 buckets per step", buckets >= 2,
                     f"DDP reports {buckets} bucket(s) reduced"),
    ]
    details = {"world_size": world, "accumulation_steps": ACCUM, "global_batch": global_batch,
               "bucket_cap_mb": BUCKET_CAP_MB, "buckets_reduced": buckets, "dtype": cfg.dtype,
               "tolerances": {"rtol": rtol, "atol": atol}}
    return JobReport.judge(NAME, comparisons,
                           f"{world} ranks x {ACCUM} accumulated micro-batches (no_sync), "
                           f"{buckets} buckets, equal the single-device reference (max abs diff "
                           f"{comparisons[0].max_abs:.2g}); replicas identical", details=details)
