"""The reference computation behind `reference-digest`: the same bits on every healthy GPU.

A chain of fp32 matmuls with a bounded non-linearity, from inputs made on the CPU with a fixed
seed (so every device starts from identical bytes whatever its own RNG), under
`torch.use_deterministic_algorithms(True)` with TF32 off and cuBLAS in its deterministic
workspace mode. The result's bytes are hashed with SHA-256. The computation runs `repeats`
times per device: a device that cannot reproduce its own digest is faulty or not deterministic.

Its definition (seed, sizes, steps) is fixed and versioned by REFERENCE: change any of it and
bump the version, because the fleet compares digests only between equal definitions.

By hand, on the CPU:
    echo '{"device": "cpu"}' | python -m checks.hw.measure.isolate_child digest -
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
from collections.abc import Iterator
from typing import Any

# The definition. n and steps are fixed fleet-wide: the digest is a comparison, not a benchmark.
REFERENCE = {"version": 1, "seed": 20261201, "n": 1024, "steps": 16, "dtype": "fp32"}
# A host without GPUs computes a smaller one (information only; 2 x the full one took 97 s on a
# loaded 2-core VM): its own id, so it is never compared with GPU digests.
REFERENCE_CPU = {**REFERENCE, "n": 256, "steps": 8}


def reference_id(ref: dict[str, Any] = REFERENCE) -> str:
    return f"v{ref['version']} seed={ref['seed']} n={ref['n']} steps={ref['steps']} {ref['dtype']}"


def set_deterministic(torch: Any, mode: bool) -> None:
    """ATen's deterministic-algorithms switch. torch.use_deterministic_algorithms sets it and
    inductor's own flag, and for that imports inductor, dynamo and sympy (torch 2.13: 3-8 s of
    CPU on the 2-core host, more than the CPU reference itself); this computation runs eager and
    never compiles, so ATen's switch is the one that applies. The public call where that
    private one is gone, or where inductor is already loaded."""
    aten = getattr(torch._C, "_set_deterministic_algorithms", None)
    if aten is None or "torch._inductor.config" in sys.modules:
        torch.use_deterministic_algorithms(mode)
    else:
        aten(mode)


@contextlib.contextmanager
def _deterministic(torch: Any) -> Iterator[None]:
    """Deterministic kernels, no TF32, for the computation only: the settings are process-wide,
    and on the CPU path the checks that follow run in this same process."""
    # cuBLAS is deterministic only with a fixed workspace configuration (PyTorch "Reproducibility"
    # notes); it is read when the CUDA context is created, so it is set before any CUDA call.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    saved = (torch.are_deterministic_algorithms_enabled(), torch.backends.cuda.matmul.allow_tf32,
             torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark)
    set_deterministic(torch, True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = False
    try:
        yield
    finally:
        set_deterministic(torch, saved[0])
        (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
         torch.backends.cudnn.benchmark) = saved[1:]


def compute(device: Any, ref: dict[str, Any] = REFERENCE) -> str:
    """SHA-256 (hex) of the reference chain's result on `device`."""
    import torch

    with _deterministic(torch):
        gen = torch.Generator(device="cpu").manual_seed(int(ref["seed"]))
        n, steps = int(ref["n"]), int(ref["steps"])
        x = torch.randn(n, n, generator=gen, dtype=torch.float32)
        weights = [torch.randn(n, n, generator=gen, dtype=torch.float32) / n ** 0.5
                   for _ in range(min(steps, 4))]
        x = x.to(device)
        weights = [w.to(device) for w in weights]
        for k in range(steps):
            x = torch.tanh(x @ weights[k % len(weights)])
        out = x.cpu().contiguous()
    if not bool(torch.isfinite(out).all()):
        return "non-finite"
    return hashlib.sha256(out.numpy().tobytes()).hexdigest()


def run(devices: list[Any], repeats: int = 2) -> list[dict[str, Any]]:
    """One row per device: its digests over `repeats` runs of the reference (the CPU's own)."""
    rows = []
    for dev in devices:
        ref = REFERENCE if dev.type == "cuda" else REFERENCE_CPU
        digests = [compute(dev, ref) for _ in range(max(1, repeats))]
        rows.append({"device": str(dev), "index": dev.index if dev.type == "cuda" else None,
                     "digests": digests, "digest": digests[0], "reference": reference_id(ref)})
    return rows
