"""`pipeline` (model parallel): torch.distributed.pipelining equals the unsplit model on one device.

The MLP has one block per rank; rank i holds stage i. Every step the global batch is cut into
2 x stages micro-batches and run through the pipe with the GPipe and then the 1F1B schedule (each
from the same initial weights); the mean-reduced loss per micro-batch with scale_grads=True equals
the mean over the global batch. Rank 0 trains the unsplit model on the same batches and compares
every stage's parameters. Stage shapes are given to PipelineStage up front (static metadata), so
no shape-inference pass runs outside the schedule.

On hosts with >= 2 GPUs rank 0 also runs the seeds' single-process split (first half of the
layers on cuda:0, second half on cuda:1, activations copied between them) against cuda:0 alone.

One node, 2 stages (gloo on CPU, NCCL with one GPU per stage):
    torchrun --standalone --nproc-per-node=2 -m trainer pipeline
Several nodes (stages across hosts; HOST = the first node's address):
    torchrun --nnodes=2 --nproc-per-node=4 --rdzv-backend=c10d --rdzv-endpoint=HOST:29400 \
        --rdzv-id=nodecert-pipe -m trainer pipeline
Supervised: python -m trainer pipeline --nproc 2
"""

from __future__ import annotations

import copy
import gc
from typing import Any

import torch
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from trainer.config import TrainConfig
from trainer.data import TeacherDataset
from trainer.distenv import DistEnv, StepTimer
from trainer.gpumode import REASON, exclusive_process
from trainer.models import D_IN, D_OUT, mlp_blocks, params_of
from trainer.report import Comparison, JobReport, compare

NAME = "pipeline"
# torch's backend table: gloo moves CUDA tensors in broadcast/all-reduce/all-gather, not in
# send/recv (ProcessGroupGloo::send hands the raw device pointer to a CPU transport).
NO_P2P = ("ranks share a GPU over gloo, which cannot send/recv CUDA tensors between pipeline "
          "stages; needs one GPU per rank (NCCL) or --device cpu")
SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


def static_stage(module: nn.Module, index: int, stages: int, micro: int, width_in: int,
                 width_out: int, device: torch.device, dtype: torch.dtype, group: Any,
                 ) -> PipelineStage:
    """A PipelineStage with its activation and gradient shapes given up front."""
    first, last = index == 0, index == stages - 1

    def example(width: int, grad: bool) -> torch.Tensor:
        return torch.empty(micro, width, device=device, dtype=dtype).requires_grad_(grad)

    return PipelineStage(
        module, index, stages, device, group=group,
        input_args=(example(width_in, not first),), output_args=(example(width_out, True),),
        input_grads=(None,) if first else (example(width_in, False),),
        output_grads=(None,) if last else (example(width_out, False),))


def stage_widths(index: int, stages: int, hidden: int) -> tuple[int, int]:
    return (D_IN if index == 0 else hidden, D_OUT if index == stages - 1 else hidden)


def run(env: DistEnv, cfg: TrainConfig) -> JobReport | None:
    stages = env.world_size
    if stages < 2:
        return JobReport(NAME, "SKIP", f"needs >= 2 ranks (one per stage), have {stages}")
    if not env.p2p:
        return JobReport(NAME, "SKIP", NO_P2P)
    dtype = getattr(torch, cfg.dtype)
    micro_batches = 2 * stages  # 1F1B needs at least as many micro-batches as stages
    batch = micro_batches * cfg.batch_size
    data = TeacherDataset(batch * cfg.steps, (D_IN,), D_OUT, seed=cfg.seed, dtype=dtype)
    torch.manual_seed(cfg.seed)  # same blocks on every rank: rank i keeps block i
    blocks = mlp_blocks(stages, cfg.hidden)

    details: dict[str, Any] = {}
    split = None
    if env.rank == 0 and env.is_cuda and torch.cuda.device_count() >= 2 and not (
            env.world_size > 1 and exclusive_process()):
        env.beat(f"{NAME}/split-cuda0-cuda1")
        split = split_check(copy.deepcopy(blocks), data, cfg, batch)
    elif env.rank == 0:
        details["split"] = (
            "skipped: the single-process cuda:0/cuda:1 split needs >= 2 CUDA devices"
            if not (env.is_cuda and torch.cuda.device_count() >= 2) else
            f"skipped: it opens cuda:1, which rank 1 holds, and the GPUs are {REASON}")

    index = env.rank
    width_in, width_out = stage_widths(index, stages, cfg.hidden)
    gathered: dict[str, list[dict[str, Any]] | None] = {}
    for name, schedule_cls in SCHEDULES.items():
        env.beat(f"{NAME}/{name}-setup")
        module = copy.deepcopy(blocks[index]).to(env.device, dtype)
        group = env.new_group()
        stage = static_stage(module, index, stages, cfg.batch_size, width_in, width_out,
                             env.device, dtype, group)
        schedule = schedule_cls(stage, micro_batches, loss_fn=nn.MSELoss(),
                                scale_grads=not cfg.control("no-scale-grads"))
        opt = torch.optim.SGD(module.parameters(), lr=cfg.lr, momentum=cfg.momentum)
        timer = StepTimer(cfg.warmup, env.device)
        for step in range(cfg.steps):
            timer.tick()
            if cfg.beats_at(step):
                env.beat(f"{NAME}/{name}-step-{step}")
            rows = slice(step * batch, (step + 1) * batch)
            opt.zero_grad(set_to_none=True)
            if index == 0:
                schedule.step(data.x[rows].to(env.device))
            elif index == stages - 1:
                schedule.step(target=data.y[rows].to(env.device))
            else:
                schedule.step()
            opt.step()
        timer.stop()
        env.beat(f"{NAME}/{name}-gather")
        gathered[name] = env.gather({"params": params_of(module),
                                     "samples_per_s": timer.samples_per_s(batch)})
        del schedule, stage, opt, module
        gc.collect()
    if env.rank != 0:
        return None

    env.beat(f"{NAME}/reference")
    reference, ref_rate = _reference(nn.Sequential(*blocks), data, cfg, batch, env.device, dtype)
    expected = params_of(reference)
    rtol, atol = cfg.tolerances()
    comparisons, figures = [], {}
    for name, per_rank in gathered.items():
        assert per_rank is not None
        actual = {f"{i}.{k}": v for i, g in enumerate(per_rank) for k, v in g["params"].items()}
        comparisons.append(compare(f"{name}: parameters vs unsplit model", actual, expected,
                                   rtol, atol))
        rate = per_rank[-1]["samples_per_s"]  # the last stage finishes each step
        figures[f"pipeline_{name}_samples_per_s"] = rate
    rate = max(figures.values())
    figures.update({"pipeline_samples_per_s": rate, "pipeline_reference_samples_per_s": ref_rate,
                    "pipeline_scaling_efficiency": rate / (stages * ref_rate)})
    if split is not None:
        comparisons.append(split)
    details.update({"stages": stages, "micro_batches": micro_batches, "global_batch": batch,
                    "schedules": list(SCHEDULES), "tolerances": {"rtol": rtol, "atol": atol},
                    "dtype": cfg.dtype})
    return JobReport.judge(NAME, comparisons,
                           f"{stages} stages x {micro_batches} micro-batches, GPipe and 1F1B "
                           f"equal the unsplit model (max abs diff "
                           f"{max(c.max_abs for c in comparisons):.2g})",
                           figures=figures, details=details)


def _reference(model: nn.Module, data: TeacherDataset, cfg: TrainConfig, batch: int,
               device: torch.device, dtype: torch.dtype) -> tuple[nn.Module, float]:
    model = model.to(device, dtype)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    timer = StepTimer(cfg.warmup, device)
    for step in range(cfg.steps):
        timer.tick()
        rows = slice(step * batch, (step + 1) * batch)
        opt.zero_grad(set_to_none=True)
        nn.functional.mse_loss(model(data.x[rows].to(device)), data.y[rows].to(device)).backward()
        opt.step()
    timer.stop()
    return model, timer.samples_per_s(batch)


class TwoDeviceSplit(nn.Module):
    """The seeds' model parallelism done right: layers on two GPUs, activations moved between."""

    def __init__(self, blocks: list[nn.Module], dev0: torch.device, dev1: torch.device) -> None:
        super().__init__()
        half = len(blocks) // 2
        self.dev0, self.dev1 = dev0, dev1
        self.part0 = nn.Sequential(*blocks[:half]).to(dev0)
        self.part1 = nn.Sequential(*blocks[half:]).to(dev1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.part1(self.part0(x.to(self.dev0)).to(self.dev1))


def split_check(blocks: list[nn.Module], data: TeacherDataset, cfg: TrainConfig,
                batch: int) -> Comparison:
    """k steps of the cuda:0/cuda:1 split vs the same model on cuda:0 (single process)."""
    dev0, dev1 = torch.device("cuda", 0), torch.device("cuda", 1)
    dtype = getattr(torch, cfg.dtype)
    whole = nn.Sequential(*copy.deepcopy(blocks)).to(dev0, dtype)
    split = TwoDeviceSplit(blocks, dev0, dev1).to(dtype=dtype)
    for model, out_dev in ((whole, dev0), (split, dev1)):
        opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
        for step in range(cfg.steps):
            rows = slice(step * batch, (step + 1) * batch)
            opt.zero_grad(set_to_none=True)
            out = model(data.x[rows].to(dev0))
            nn.functional.mse_loss(out, data.y[rows].to(out_dev)).backward()
            opt.step()
    half = len(blocks) // 2
    actual = dict(params_of(split.part0))
    for key, value in params_of(split.part1).items():
        i, rest = key.split(".", 1)
        actual[f"{int(i) + half}.{rest}"] = value
    rtol, atol = cfg.tolerances()
    return compare("cuda:0/cuda:1 split vs cuda:0", actual, params_of(whole), rtol, atol)
