"""How big the jobs train: `small` (the CPU default and the tests) or `large` (the GPU default).

`small` is the size every equivalence tolerance was calibrated at: the 3-block MLP of width 64 and
the 2-layer GPT of width 64. It proves the parallel modes compute right, not that a node moves
real training's message sizes.

`large` is sized from the GPU's memory so that the collectives carry what real training carries:
- the MLP jobs widen the MLP to MLP_LARGE_HIDDEN (a hidden x hidden block: 67 M parameters,
  269 MB of fp32 gradients per step: DDP fills ~11 of its 25 MB buckets, FSDP all-gathers and
  reduce-scatters 90 MB blocks, NCCL runs its large-message protocols);
- `throughput` trains a GPT block stack of width 2048 whose layer count fills about half of the GPU
  memory: 1 B+ parameters and GBs of gradients per step on 80 GB GPUs.
Memory and time below are estimates from parameter counts, FLOPs and the profile's bf16 peak.
trainer.jobs.throughput.traced_memory_bytes checks the memory estimate against the job's own
model: it runs the throughput job's training steps on fake tensors (no storage) under torch's
memory tracker, which a CPU host can do at any size (benchmarks/large_memory.py prints it for
every profile's shape).
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

SIZES = ("auto", "small", "large")
# Jobs that judge each device's arithmetic against float64 with a derived rounding bound
# (calibrated over widths 16-256): they stay small at every size; message sizes are not theirs.
ALWAYS_SMALL = ("single", "localize")
MLP_SMALL_HIDDEN = 64
MLP_LARGE_HIDDEN = 8192

# Large GPT: GPT-3 XL's width and heads (Brown et al. 2020, table 2.1), GPT-2's vocabulary.
LARGE_WIDTH, LARGE_HEADS, LARGE_CONTEXT, LARGE_VOCAB = 2048, 16, 2048, 50304
MAX_LAYERS = 48
MEMORY_FRACTION = 0.5  # of the GPU's memory the estimate may fill (allocator, NCCL, peers' leftovers)
# Bytes per parameter under DDP with AdamW and autocast: fp32 weight 4, gradient 4, DDP's bucket
# copy of the gradient 4, AdamW's two moments 8.
BYTES_PER_PARAM = 20
# Activations kept for the backward per layer and token, bf16, flash attention, no
# recomputation: 34 x width bytes (Korthikanti et al. 2022, "Reducing Activation Recomputation
# in Large Transformer Models", eq. 1 without the attention-score term that flash removes).
ACT_BYTES_PER_TOKEN_WIDTH = 34
# Logits per token: bf16 output, its fp32 copy for the loss, the fp32 gradient.
LOGIT_BYTES = 10
ASSUMED_MFU = 0.35  # for the time estimate only
LARGE_STEPS_PER_RUN = 13  # the throughput job's warm-up + timed steps at large (3 + 10)


def resolve(size: str, is_cuda: bool) -> str:
    """`auto` is `large` on a GPU and `small` elsewhere."""
    if size not in SIZES:
        raise ValueError(f"size must be one of {', '.join(SIZES)}, not {size!r}")
    if size == "auto":
        return "large" if is_cuda else "small"
    return size


def mlp_hidden(size: str) -> int:
    return MLP_LARGE_HIDDEN if size == "large" else MLP_SMALL_HIDDEN


def mlp_gradient_bytes(hidden: int, d_in: int = 16, d_out: int = 4) -> int:
    """fp32 gradient bytes of the 3-block MLP per step (weights and biases)."""
    return 4 * (d_in * hidden + hidden + hidden * hidden + hidden + hidden * d_out + d_out)


@dataclass(frozen=True)
class GptShape:
    vocab: int
    context: int
    width: int
    layers: int
    heads: int
    batch: int

    def params(self) -> int:
        per_layer = 12 * self.width ** 2 + 13 * self.width  # qkv, proj, 4x MLP, 2 norms, biases
        return (self.layers * per_layer + (self.vocab + self.context) * self.width
                + 2 * self.width + self.width * self.vocab)

    def flops_per_token(self) -> float:
        """6 per matmul weight plus attention (12 x layers x width x context), as the job."""
        matmul = self.layers * 12 * self.width ** 2 + self.width * self.vocab
        return 6.0 * matmul + 12.0 * self.layers * self.width * self.context

    def memory_bytes(self) -> float:
        tokens = self.batch * self.context
        return (BYTES_PER_PARAM * self.params()
                + ACT_BYTES_PER_TOKEN_WIDTH * tokens * self.width * self.layers
                + LOGIT_BYTES * tokens * self.vocab)


def rank_shares(free_by_rank: list[tuple[Hashable, int]]) -> list[float]:
    """Each rank's share of its GPU's free memory, from every rank's (which GPU, free bytes):
    ranks sharing a GPU (`--share-gpu`: several ranks per GPU over gloo) split its free memory
    between them, so that each sizes its model from its share instead of the whole GPU (each
    would fill MEMORY_FRACTION of it, together more than the GPU has: out of memory). The
    ranks of one GPU read it at slightly different moments: the smallest reading counts."""
    by_gpu: dict[Hashable, list[int]] = {}
    for gpu, free in free_by_rank:
        by_gpu.setdefault(gpu, []).append(free)
    return [min(by_gpu[gpu]) / len(by_gpu[gpu]) for gpu, _ in free_by_rank]


def large_gpt(memory_bytes: float) -> GptShape:
    """The GPT block stack whose estimated memory fills MEMORY_FRACTION of the GPU."""
    batch = 4 if memory_bytes >= 40 * 2 ** 30 else 2
    base = GptShape(LARGE_VOCAB, LARGE_CONTEXT, LARGE_WIDTH, 0, LARGE_HEADS, batch)
    one = GptShape(LARGE_VOCAB, LARGE_CONTEXT, LARGE_WIDTH, 1, LARGE_HEADS, batch)
    per_layer = one.memory_bytes() - base.memory_bytes()
    room = MEMORY_FRACTION * memory_bytes - base.memory_bytes()
    layers = max(1, min(MAX_LAYERS, math.floor(room / per_layer)))
    return GptShape(LARGE_VOCAB, LARGE_CONTEXT, LARGE_WIDTH, layers, LARGE_HEADS, batch)


def estimate(memory_gib: float, bf16_tflops: float | None, gpus: int, steps: int) -> dict[str, Any]:
    """What `large` costs on one GPU model: the throughput job's shape, its memory, gradients
    per step and time (steps per run x the weak-scaling runs 1, 2, 4 ... gpus), at ASSUMED_MFU of
    the bf16 peak. An estimate, not a measurement."""
    shape = large_gpt(memory_gib * 2 ** 30)
    runs = len({1 << i for i in range(gpus.bit_length()) if 1 << i <= gpus} | {gpus})
    step_s = (shape.flops_per_token() * shape.batch * shape.context
              / (ASSUMED_MFU * bf16_tflops * 1e12)) if bf16_tflops else None
    return {"layers": shape.layers, "batch": shape.batch, "params": shape.params(),
            "gradient_bytes": 4 * shape.params(), "memory_bytes": shape.memory_bytes(),
            "step_s": step_s, "job_s": step_s * steps * runs if step_s else None,
            "mlp_gradient_bytes": mlp_gradient_bytes(MLP_LARGE_HIDDEN)}


def profile_table() -> str:
    """docs/trainer.md's table: what `--size large` costs on each profile's GPU (estimates)."""
    from checks import profiles

    rows = ["| profile | GPU memory | GPUs | throughput model (layers × width 2048, batch) | "
            "parameters | fp32 gradients per step | memory per GPU (est.) | time per step at "
            f"{ASSUMED_MFU:.0%} MFU (est.) | throughput job (est.) | floor |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for name in profiles.available():
        p = profiles.load(name)
        memory, gpus = p.get("memory_gib"), p.get("gpus_per_node") or 1
        if not memory:
            continue
        peak = p.get("peaks.bf16_tflops") or p.get("peaks.fp16_tflops")
        e = estimate(float(memory), float(peak) if peak else None, int(gpus),
                     LARGE_STEPS_PER_RUN)
        floor = p.get("thresholds.train_mfu")
        rows.append(
            f"| {name} | {memory:g} GiB | {gpus} | {e['layers']} × 2048, {e['batch']} | "
            f"{e['params'] / 1e9:.2f} B | {e['gradient_bytes'] / 1e9:.1f} GB | "
            f"{e['memory_bytes'] / 2 ** 30:.0f} GiB | "
            + (f"{e['step_s']:.2f} s | {e['job_s']:.0f} s" if e["step_s"] else "n/a | n/a")
            + f" | {f'MFU ≥ {float(floor):g}' if floor is not None else '—'} |")
    return "\n".join(rows)
