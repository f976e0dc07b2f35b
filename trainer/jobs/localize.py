"""`localize`: which GPU computes wrong gradients? One step, the same batch on every rank.

Data-parallel training averages the ranks' gradients, so a GPU that computes slightly wrong ones
is hidden: every replica ends up equal, and only the loss curve (maybe) suffers. Here every rank
builds the same model from the same seed and runs one forward/backward on the SAME batch; the local
gradients are gathered BEFORE any all-reduce and each is compared with the float64 gradient rank 0
computes on the CPU, within `single.tolerance(n, 1, max |g|)` (the fp32 rounding bound of the
`single` job, one step). A rank outside it is named with its GPU (index, model, PCI address, UUID).
Then the job all-reduces the gradients over its own group (NCCL on GPUs) and checks the mean
equals the mean of the gathered locals and is identical on every rank: the collective is right,
and the report says how far the average moved because of the bad rank.

Fault injection for tests: NODECERT_INJECT="corrupt:RANK@localize/gradients" flips one mantissa
bit of that rank's largest gradient element.

    torchrun --standalone --nproc-per-node=8 -m trainer localize
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from trainer.config import TrainConfig
from trainer.distenv import DistEnv
from trainer.jobs.single import BATCH_FACTOR, U32, describe, device_identity, flip_bit, longest_sum, tolerance
from trainer.models import D_IN, D_OUT, mlp
from trainer.report import FAIL, PASS, SKIP, Comparison, JobReport, compare, identical

NAME = "localize"
PHASE = f"{NAME}/gradients"


def gradients(cfg: TrainConfig, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """One forward/backward of the seeded model on the seeded batch: the flat gradient."""
    from trainer.data import TeacherDataset

    batch = BATCH_FACTOR * cfg.batch_size
    data = TeacherDataset(batch, (D_IN,), D_OUT, seed=cfg.seed + 1, dtype=torch.float64)
    torch.manual_seed(cfg.seed)
    model = mlp(cfg.hidden).double().to(device, dtype)
    loss = nn.functional.mse_loss(model(data.x.to(device, dtype)), data.y.to(device, dtype))
    loss.backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])


def run(env: DistEnv, cfg: TrainConfig) -> JobReport | None:
    world = env.world_size
    if world < 2:
        return JobReport(NAME, SKIP, f"needs >= 2 ranks to compare, have {world}")
    dtype = getattr(torch, cfg.dtype)
    env.beat(PHASE)
    local = gradients(cfg, env.device, dtype)
    if env.reporter.should_corrupt(PHASE):
        flip_bit(local)
    env.beat(f"{NAME}/gather")
    mine = {"grad": local.detach().to("cpu", copy=True), "identity": device_identity(env.device),
            "rank": env.rank}
    gathered = env.gather(mine)  # before the all-reduce: what each GPU computed on its own
    env.beat(f"{NAME}/all-reduce")
    group = env.new_group()
    reduced = local.detach().clone()
    dist.all_reduce(reduced, group=group)
    reduced /= world
    env.sync()
    averages = env.gather({"mean": reduced.to("cpu")})
    if gathered is None or averages is None:
        return None

    env.beat(f"{NAME}/reference")
    expected = gradients(cfg, torch.device("cpu"), torch.float64)
    batch = BATCH_FACTOR * cfg.batch_size
    scale = float(expected.abs().max())
    atol = tolerance(longest_sum(cfg.hidden, batch), 1, scale) if cfg.dtype == "float32" \
        else cfg.tolerances()[1] + cfg.tolerances()[0] * scale
    comparisons: list[Comparison] = []
    bad: list[str] = []
    for g in gathered:
        c = compare(f"rank {g['rank']}: {describe(g['identity'])} local gradient vs float64",
                    {"grad": g["grad"]}, {"grad": expected}, 0.0, atol)
        comparisons.append(c)
        if not c.ok:
            bad.append(f"rank {g['rank']}: {describe(g['identity'])}: max abs diff "
                       f"{c.max_abs:.3g} > {atol:.3g}")
    mean_of_locals = torch.stack([g["grad"].double() for g in gathered]).mean(0)
    # the all-reduce sums `world` fp32 values: its own rounding, world x u of the largest term
    reduce_tol = 2 * world * U32 * float(mean_of_locals.abs().max())
    comparisons.append(compare("all-reduced mean vs mean of the local gradients",
                               {"grad": averages[0]["mean"]}, {"grad": mean_of_locals}, 0.0,
                               reduce_tol))
    comparisons.append(identical("all-reduced mean identical on every rank",
                                 [{"grad": a["mean"]} for a in averages]))
    hidden_shift = float((averages[0]["mean"].double() - expected).abs().max())
    details = {"world_size": world, "batch": batch, "parameters": expected.numel(),
               "tolerances": {"rtol": 0.0, "atol": atol},
               "expected": f"every rank's gradient within {atol:.3g} of float64",
               "mean_shift_from_reference": hidden_shift,
               "devices": [g["identity"] for g in gathered]}
    if bad:
        return JobReport(NAME, FAIL, f"{len(bad)} of {world} rank(s) compute wrong gradients: "
                         + "; ".join(bad) + f" (after the all-reduce every replica would hold "
                         f"the same average, off by {hidden_shift:.3g}: DDP hides this)",
                         comparisons=comparisons, details=details)
    broken = [c for c in comparisons if not c.ok]
    if broken:
        return JobReport(NAME, FAIL, broken[0].describe(), comparisons=comparisons,
                         details=details)
    return JobReport(NAME, PASS, f"{world} ranks' local gradients on the same batch all within "
                     f"{atol:.2g} of float64; the all-reduced mean equals their mean",
                     comparisons=comparisons, details=details)
