"""`throughput`: a small GPT-style model's training speed, as information (floors per profile).

A decoder-only transformer (token + position embeddings, pre-norm blocks of causal
scaled-dot-product attention and a 4x GELU MLP, untied head) trains with AdamW under DDP on a
learnable synthetic language (each token fixes the next through a seeded permutation), bf16
autocast on GPUs, fp32 on CPU. Reported: tokens/s (whole world and per rank), model FLOPs per
token (6 x matmul parameters + 12 x layers x width x context, Kaplan et al. 2020 / PaLM app. B),
peak memory (CUDA max allocated; on CPU the process's max RSS), and weak scaling: the same
per-rank batch on 1, 2, 4, ... N ranks, efficiency = tokens/s(n) / (n x tokens/s(1)). MFU
against the profile's bf16 peak and the profile's floors are applied by the acceptance check.
The job FAILs when the model did not learn: the loss on the first training batch, evaluated
again after the last step, must be finite and at least LEARN_MIN_DROP below its value before
training (one fixed batch: the step-to-step noise of fresh batches cannot fake a fall, which it
did for "last loss < first loss": a model at learning rate 0 went 5.709 -> 5.691). It reports
ERROR when a figure could not be measured. Negative control `throughput-frozen`: learning rate 0.

    torchrun --standalone --nproc-per-node=8 -m trainer throughput
"""

from __future__ import annotations

import gc
import math
import resource
import socket
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from trainer.config import TrainConfig
from trainer.distenv import DistEnv
from trainer.report import ERROR, FAIL, JobReport

if TYPE_CHECKING:
    from trainer.sizes import GptShape

NAME = "throughput"
# Relative fall of the first batch's loss required after training. Measured on the CPU size
# (8 AdamW steps at 1e-3, seeds 1, 2, 1234): 8.3-9.6 %; at learning rate 0: exactly 0.
LEARN_MIN_DROP = 0.02
LR = 1e-3


@dataclass(frozen=True)
class GptSize:
    vocab: int
    context: int
    width: int
    layers: int
    heads: int
    batch: int   # sequences per rank per step
    warmup: int
    steps: int   # timed steps after the warm-up


GPU_SIZE = GptSize(vocab=50304, context=1024, width=768, layers=12, heads=12, batch=8,
                   warmup=5, steps=20)  # GPT-2 small's shape
LARGE_WARMUP, LARGE_STEPS = 3, 10
CPU_SIZE = GptSize(vocab=256, context=64, width=64, layers=2, heads=4, batch=4, warmup=2, steps=6)


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln2(x))


class Gpt(nn.Module):
    def __init__(self, s: GptSize) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(s.vocab, s.width), nn.Embedding(s.context, s.width)
        self.blocks = nn.Sequential(*[Block(s.width, s.heads) for _ in range(s.layers)])
        self.ln, self.head = nn.LayerNorm(s.width), nn.Linear(s.width, s.vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.head(self.ln(self.blocks(self.tok(idx) + self.pos(pos))))


def build_gpt(s: GptSize, device: torch.device, seed: int) -> Gpt:
    """The model built directly on `device` (its parameters allocated and initialised there):
    a large GPT built on the CPU and copied takes a single CPU thread tens of seconds per build.
    On the CPU this is exactly the old `Gpt(s)` under the seed; on a GPU the initial weights come
    from the CUDA generator (DDP broadcasts rank 0's to every rank, so they agree)."""
    torch.manual_seed(seed)
    with torch.device(device):
        return Gpt(s)


def flops_per_token(model: Gpt, s: GptSize) -> float:
    """Training FLOPs per token: 6 per matmul weight (forward 2, backward 4) plus attention's
    scores and weighted sum (12 x layers x width x context)."""
    matmul = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    return 6.0 * matmul + 12.0 * s.layers * s.width * s.context


def sequences(s: GptSize, n: int, seed: int, device: torch.device) -> torch.Tensor:
    """n sequences of context+1 tokens of a language where token t is always followed by
    perm[t] (learnable; the loss must fall from ln(vocab))."""
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(s.vocab, generator=g)
    out = torch.empty(n, s.context + 1, dtype=torch.long)
    out[:, 0] = torch.randint(s.vocab, (n,), generator=g)
    for t in range(1, s.context + 1):
        out[:, t] = perm[out[:, t - 1]]
    return out.to(device)


def measure(env: DistEnv, s: GptSize, ranks: int, group: Any, cfg: TrainConfig,
            ) -> dict[str, Any] | None:
    """DDP on the first `ranks` ranks for warm-up + timed steps; the others wait. Rank 0 returns
    tokens/s, the loss curve and peak memory; other ranks None."""
    result = None
    if env.rank < ranks:
        env.beat(f"{NAME}/{ranks}-ranks-build")
        gpt = build_gpt(s, env.device, cfg.seed)
        model = nn.parallel.DistributedDataParallel(
            gpt, device_ids=[env.device] if env.is_cuda else None, process_group=group)
        opt = torch.optim.AdamW(model.parameters(),
                                lr=0.0 if cfg.control("throughput-frozen") else LR)
        data = sequences(s, s.batch * (s.warmup + s.steps), cfg.seed + env.rank, env.device)
        probe = data[:s.batch]
        loss_before = _loss(gpt, probe, env)
        if env.is_cuda:
            torch.cuda.reset_peak_memory_stats(env.device)
        losses, start = [], 0.0
        for step in range(s.warmup + s.steps):
            if step == s.warmup:
                env.sync()
                start = time.perf_counter()
            if cfg.beats_at(step):
                env.beat(f"{NAME}/{ranks}-ranks-step-{step}")
            batch = data[step * s.batch:(step + 1) * s.batch]
            losses.append(train_step(model, opt, batch, env.device.type, env.is_cuda))
        env.sync()
        elapsed = time.perf_counter() - start
        loss_after = _loss(gpt, probe, env)
        tokens = ranks * s.batch * s.context * s.steps
        peak = (torch.cuda.max_memory_allocated(env.device) if env.is_cuda
                else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
        if env.rank == 0:
            result = {"tokens_per_s": tokens / elapsed if elapsed > 0 else float("nan"),
                      "losses": [float(v) for v in losses], "peak_memory_bytes": peak,
                      "probe_loss_before": loss_before, "probe_loss_after": loss_after,
                      "flops_per_token": flops_per_token(gpt, s),
                      "params": sum(p.numel() for p in gpt.parameters())}
        del model, opt, gpt
        gc.collect()
    env.barrier()
    return result


def next_token_loss(logits: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of each position's logits against the next token, in fp32."""
    return nn.functional.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())


def train_step(model: nn.Module, opt: torch.optim.Optimizer, batch: torch.Tensor,
               device_type: str, bf16: bool) -> torch.Tensor:
    """One training step of the job (bf16 autocast when `bf16`); the loss, detached."""
    opt.zero_grad(set_to_none=True)
    with torch.autocast(device_type, dtype=torch.bfloat16, enabled=bf16):
        logits = model(batch[:, :-1])
    loss = next_token_loss(logits, batch)
    loss.backward()
    opt.step()
    return loss.detach()


def _loss(model: Gpt, batch: torch.Tensor, env: DistEnv) -> float:
    """The model's loss on one batch, no gradient (the learning probe)."""
    with torch.no_grad(), torch.autocast(env.device.type, dtype=torch.bfloat16,
                                         enabled=env.is_cuda):
        logits = model(batch[:, :-1])
    return float(next_token_loss(logits, batch))


def learned(before: float, after: float, min_drop: float = LEARN_MIN_DROP) -> bool:
    """The first batch's loss fell by at least `min_drop` (relative), both finite."""
    return math.isfinite(before) and math.isfinite(after) and after <= (1 - min_drop) * before


def scaling_sizes(world: int) -> list[int]:
    sizes = [1 << i for i in range(world.bit_length()) if 1 << i <= world]
    return sizes if sizes[-1] == world else [*sizes, world]


def size_for(env: DistEnv, cfg: TrainConfig) -> GptSize:
    """small: CPU_SIZE on the CPU, GPT-2 small's shape on a GPU; large (GPU only): the block
    stack trainer.sizes fits into the smallest per-rank free GPU memory (free, not total: a GPU
    other processes hold memory on gets a smaller model and a verdict, not an OOM crash; per
    rank: ranks sharing a GPU split its free memory, sizes.rank_shares)."""
    if cfg.size != "large" or not env.is_cuda:
        return GPU_SIZE if env.is_cuda else CPU_SIZE
    from trainer import sizes

    free, _total = torch.cuda.mem_get_info(env.device)
    # which GPU: this host's device index (the ranks of a host see the same CUDA_VISIBLE_DEVICES)
    memory = env.gather(((socket.gethostname(), env.device.index), int(free)))
    shape = env.broadcast(sizes.large_gpt(min(sizes.rank_shares(memory))) if memory else None)
    return GptSize(vocab=shape.vocab, context=shape.context, width=shape.width,
                   layers=shape.layers, heads=shape.heads, batch=shape.batch,
                   warmup=LARGE_WARMUP, steps=LARGE_STEPS)


def traced_memory_bytes(shape: GptShape, steps: int = 2) -> int:
    """Peak bytes of the throughput job's training step at `shape`, traced rather than estimated:
    the job's Gpt, AdamW and its train_step under bf16 autocast run `steps` steps on fake tensors
    (shapes and dtypes only) under torch's MemTracker, whose peak counts parameters, optimizer
    states, gradients, activations and temporaries as they are allocated and freed. DDP's
    gradient buckets (one fp32 copy of every gradient, allocated once at construction) are added:
    its reducer cannot run on fake tensors. Not in it: the CUDA context, NCCL's buffers, the
    caching allocator's rounding. CPU autocast stands in for CUDA's (both cast per op and keep the
    weights' casts for the forward); scaled_dot_product_attention's CPU kernel keeps, like flash
    attention, the output and its log-sum-exp, not the scores."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    size = GptSize(vocab=shape.vocab, context=shape.context, width=shape.width,
                   layers=shape.layers, heads=shape.heads, batch=shape.batch, warmup=0,
                   steps=steps)
    with FakeTensorMode():
        model = Gpt(size)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        data = torch.randint(size.vocab, (size.batch, size.context + 1))
        tracker = MemTracker()
        tracker.track_external(model, opt)
        with tracker:
            for _ in range(steps):  # the second step has AdamW's states: the peak
                train_step(model, opt, data, "cpu", bf16=True)
                tracker.reset_mod_stats()
        peak = sum(by_kind["Total"] for by_kind in tracker.get_tracker_snapshot("peak").values())
    return int(peak) + 4 * shape.params()


def run(env: DistEnv, cfg: TrainConfig) -> JobReport | None:
    s = size_for(env, cfg)
    world = env.world_size
    sizes = scaling_sizes(world)
    groups = {n: env.new_group(list(range(n))) for n in sizes}  # every rank creates every group
    runs = {n: measure(env, s, n, groups[n], cfg) for n in sizes}
    if env.rank != 0:
        return None
    whole, one = runs[world], runs[1]
    assert whole is not None and one is not None
    rate, rate1 = whole["tokens_per_s"], one["tokens_per_s"]
    figures = {
        "throughput_tokens_per_s": rate, "throughput_tokens_per_s_per_rank": rate / world,
        "throughput_flops_per_token": whole["flops_per_token"],
        "throughput_model_tflops_per_rank": rate / world * whole["flops_per_token"] / 1e12,
        "throughput_peak_memory_bytes": float(whole["peak_memory_bytes"]),
        "throughput_weak_scaling_efficiency": rate / (world * rate1),
        **{f"throughput_tokens_per_s_{n}_ranks": runs[n]["tokens_per_s"] for n in sizes},  # type: ignore[index]
    }
    losses = whole["losses"]
    details: dict[str, Any] = {
        "model": {**asdict(s), "params": whole["params"]}, "world_size": world,
        "gradient_bytes_per_step": 4 * whole["params"],
        "scaling_ranks": sizes, "precision": "bf16 autocast" if env.is_cuda else "fp32",
        "peak_memory": "torch.cuda.max_memory_allocated" if env.is_cuda
        else "process max RSS (includes torch itself)", "loss_first": losses[0],
        "loss_last": losses[-1], "probe_loss_before": whole["probe_loss_before"],
        "probe_loss_after": whole["probe_loss_after"], "learn_min_drop": LEARN_MIN_DROP}
    summary = (f"{rate:,.0f} tokens/s on {world} rank(s) ({rate / world:,.0f} per rank, "
               f"{figures['throughput_model_tflops_per_rank']:.3g} model TFLOP/s per rank), "
               f"weak scaling {figures['throughput_weak_scaling_efficiency']:.2f} at {world}")
    bad = [k for k, v in figures.items() if not math.isfinite(v) or v <= 0]
    if bad:
        return JobReport(NAME, ERROR, f"could not measure {', '.join(bad)}", figures=figures,
                         details=details)
    before, after = whole["probe_loss_before"], whole["probe_loss_after"]
    if not all(math.isfinite(v) for v in losses) or not learned(before, after):
        return JobReport(NAME, FAIL, f"the model did not learn: its loss on the first batch went "
                         f"{before:.4g} -> {after:.4g} after {len(losses)} steps (must fall by "
                         f"{LEARN_MIN_DROP:.0%} or more)", figures=figures, details=details)
    return JobReport(NAME, "PASS", summary, figures=figures, details=details)
