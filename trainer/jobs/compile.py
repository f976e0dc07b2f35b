"""`compile`: DDP over a `torch.compile`d model trains like the eager model, and really compiles.

DDP(torch.compile(model)) (the layout that compiles on torch 2.13; DDP's graph splitting at
bucket boundaries runs inside dynamo) trains cfg.steps steps on each rank's slice of the global
batches; rank 0 trains the eager model on the whole batches. Compiled kernels fuse and reorder
floating-point work, so parameters are compared within COMPILE_TOL (measured, see
docs/trainer.md), the loss curve within COMPILE_BAND, replicas exactly; and dynamo must have
produced at least one graph on every rank, and the compiled code must have run at least once per
training step on every rank (the backend is wrapped to count calls of what it compiled), so a
model that silently runs eager FAILs.
Inductor on CPU needs a C++ compiler and on GPU Triton: without them the job SKIPs with the
reason. Negative controls: `compile-outer`, torch.compile(DDP(model)), which on torch 2.13 breaks
the graph at DDP's forward and runs everything eagerly; `compile-eager`, the compiled module is
built and compiled once but DDP trains the eager one (graphs exist, the compiled code does not
run in training).

    torchrun --standalone --nproc-per-node=2 -m trainer compile
"""

from __future__ import annotations

import copy
import gc
import shutil
from typing import Any, cast

import torch
from torch import nn

from trainer.config import TrainConfig
from trainer.distenv import DistEnv
from trainer.jobs import common
from trainer.models import mlp, params_of, unwrap_names
from trainer.report import JobReport, compare, identical

NAME = "compile"
# Compiled vs eager fp32 after 20 steps: measured max abs 6e-8 on CPU (inductor and aot_eager,
# 2 and 4 ranks); these leave room for GPU kernels' different fusion.
COMPILE_TOL = (1e-4, 1e-5)  # rtol, atol
COMPILE_BAND = 1e-4
CXX = ("g++", "c++", "clang++")


def unavailable(env: DistEnv, backend: str) -> str | None:
    """Why this backend cannot compile here, or None."""
    if backend != "inductor":
        return None
    if env.is_cuda:
        from torch.utils._triton import has_triton

        return None if has_triton() else "inductor on CUDA needs Triton, which is not installed"
    if not any(shutil.which(c) for c in CXX):
        return f"inductor on CPU needs a C++ compiler; none of {', '.join(CXX)} is on PATH"
    return None


class CountingBackend:
    """A torch.compile backend that compiles with `name` and counts calls of the compiled code."""

    def __init__(self, name: str) -> None:
        from torch._dynamo import lookup_backend

        self.inner = lookup_backend(name)
        self.calls = 0

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Any:
        compiled = self.inner(gm, example_inputs)
        boxed = getattr(compiled, "_boxed_call", False)

        def run(*args: Any) -> Any:
            self.calls += 1
            return compiled(*args)

        run._boxed_call = boxed  # type: ignore[attr-defined]  # keep dynamo's calling convention
        return run


def run(env: DistEnv, cfg: TrainConfig) -> JobReport | None:
    world = env.world_size
    if world < 2:
        return JobReport(NAME, "SKIP", f"needs >= 2 ranks, have {world}")
    why = env.broadcast(unavailable(env, cfg.compile_backend))
    if why:
        return JobReport(NAME, "SKIP", f"torch.compile cannot run here: {why}")
    from torch._dynamo.utils import counters

    b, dtype = cfg.batch_size, getattr(torch, cfg.dtype)
    torch.manual_seed(cfg.seed)
    initial = mlp(cfg.hidden)
    data = common.dataset(env, cfg.steps, b, dtype, cfg.seed)
    env.beat(f"{NAME}/setup")
    graphs_before = counters["stats"]["unique_graphs"]
    module = copy.deepcopy(initial).to(env.device, dtype)
    backend = CountingBackend(cfg.compile_backend)
    if cfg.control("compile-outer"):
        model = cast(nn.Module, torch.compile(common.ddp(module, env), backend=backend))
    elif cfg.control("compile-eager"):
        compiled = torch.compile(module, backend=backend)
        compiled(data.x[:b].to(env.device, dtype))  # compiles once, then is left aside
        model = common.ddp(module, env)
    else:
        model = common.ddp(cast(nn.Module, torch.compile(module, backend=backend)), env)
    env.beat(f"{NAME}/compile-and-train")  # the first step compiles (seconds, per rank)
    losses = common.ddp_train(env, model, data, cfg.steps, b, cfg.lr, cfg.momentum, NAME,
                              cfg.beats_at)
    graphs = counters["stats"]["unique_graphs"] - graphs_before
    breaks = sum(counters["graph_break"].values())
    final = {k.replace("_orig_mod.", ""): v for k, v in unwrap_names(params_of(model)).items()}
    final = {k.removeprefix("module."): v for k, v in final.items()}
    del model, module
    gc.collect()
    env.beat(f"{NAME}/gather")
    calls = backend.calls - (1 if cfg.control("compile-eager") else 0)
    gathered = env.gather({"losses": losses, "params": final, "graphs": graphs, "breaks": breaks,
                           "calls": calls})
    if gathered is None:
        return None
    env.beat(f"{NAME}/reference")
    ref, baseline = common.reference(initial, data, cfg.steps, b * world, cfg.lr, cfg.momentum,
                                     env.device, dtype)
    curve = common.mean_curve([g["losses"] for g in gathered])
    no_graph = [r for r, g in enumerate(gathered) if g["graphs"] < 1]
    comparisons = [
        common.holds("dynamo compiled the model on every rank", not no_graph,
                     f"no graph on rank(s) {no_graph}: the model ran eagerly "
                     f"({gathered[no_graph[0]]['breaks'] if no_graph else 0} graph breaks)"),
        common.holds("the compiled code ran every training step on every rank",
                     all(g["calls"] >= cfg.steps for g in gathered),
                     "compiled code called " + ", ".join(
                         f"rank {r}: {g['calls']}" for r, g in enumerate(gathered))
                     + f" time(s) in {cfg.steps} steps: training ran eagerly"),
        compare("compiled: parameters vs eager single-device", final, params_of(ref),
                *COMPILE_TOL),
        common.loss_band("compiled: loss curve vs eager single-device", curve, baseline,
                         COMPILE_BAND),
        identical("replicas identical", [g["params"] for g in gathered]),
    ]
    details = {"world_size": world, "backend": cfg.compile_backend, "dtype": cfg.dtype,
               "graphs_per_rank": [g["graphs"] for g in gathered],
               "graph_breaks_per_rank": [g["breaks"] for g in gathered],
               "compiled_calls_per_rank": [g["calls"] for g in gathered],
               "layout": "torch.compile(DDP(model)) (negative control)"
               if cfg.control("compile-outer") else "DDP(torch.compile(model))",
               "tolerances": {"rtol": COMPILE_TOL[0], "atol": COMPILE_TOL[1]},
               "band_rel": COMPILE_BAND}
    fewest_graphs = min(cast(list[int], details['graphs_per_rank']))
    return JobReport.judge(NAME, comparisons,
                           f"DDP over torch.compile ({cfg.compile_backend}) on {world} ranks "
                           f"equals eager within rtol {COMPILE_TOL[0]:g} (max abs diff "
                           f"{comparisons[2].max_abs:.2g}); {fewest_graphs}+ "
                           "graph(s) per rank, compiled code ran every step; replicas identical",
                           details=details)
