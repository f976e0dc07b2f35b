"""Dense matmul throughput, device memory copy bandwidth and GPU peer-to-peer copies (torch).

GPU timing uses CUDA events on the measuring stream after a warm-up; each figure is the best of
a few timed repeats (the MAMF-finder convention: the achievable peak, not a noisy mean).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import torch

from checks.hw.measure import cudatime

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "tf32": torch.float32,
          "fp32": torch.float32}


def pci_of(index: int) -> str | None:
    """sysfs-style PCI address of CUDA device `index` (0000:18:00.0), None if torch cannot say."""
    props = torch.cuda.get_device_properties(index)
    bus = getattr(props, "pci_bus_id", None)
    if bus is None:
        return None
    return (f"{getattr(props, 'pci_domain_id', 0):04x}:{bus:02x}:"
            f"{getattr(props, 'pci_device_id', 0):02x}.0")


def _best_seconds(fn: Callable[[], Any], device: torch.device, *, warmup: int, repeats: int,
                  min_time_s: float) -> float:
    """Best time of one call of `fn`, each repeat long enough (>= min_time_s) to time reliably."""
    for _ in range(warmup):
        fn()
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    once = max(time.perf_counter() - t0, 1e-6)
    calls = max(1, int(min_time_s / once))
    best = float("inf")
    for _ in range(repeats):
        if device.type == "cuda":
            with cudatime.span(device) as pair:  # on `device`'s stream, whichever is current
                for _ in range(calls):
                    fn()
            pair[1].synchronize()
            seconds = cudatime.elapsed_s([pair], device)
        else:
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            seconds = time.perf_counter() - t0
        best = min(best, seconds / calls)
    return best


def matmul(device: torch.device, dtypes: list[str], n: int, *, warmup: int = 3,
           repeats: int = 3, min_time_s: float = 0.1) -> dict[str, float]:
    """TFLOP/s of an n x n x n matmul per dtype name (bf16, fp16, tf32, fp32)."""
    out = {}
    tf32 = torch.backends.cuda.matmul.allow_tf32
    try:
        for name in dtypes:
            dtype = DTYPES[name]
            torch.backends.cuda.matmul.allow_tf32 = name == "tf32"
            gen = torch.Generator(device="cpu").manual_seed(0)
            a = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)
            b = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)
            c = torch.empty(n, n, device=device, dtype=dtype)
            seconds = _best_seconds(functools.partial(torch.mm, a, b, out=c), device,
                                    warmup=warmup, repeats=repeats, min_time_s=min_time_s)
            out[name] = 2 * n**3 / seconds / 1e12
            del a, b, c
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    return out


def copy_bandwidth(device: torch.device, nbytes: int, *, warmup: int = 2, repeats: int = 3,
                   min_time_s: float = 0.1) -> float:
    """GB/s of a device-to-device copy, counting read + write (2 x bytes), like DCGM and the
    published H100/H200 figures."""
    src = torch.empty(nbytes // 4, device=device, dtype=torch.float32).fill_(1.0)
    dst = torch.empty_like(src)
    seconds = _best_seconds(lambda: dst.copy_(src), device, warmup=warmup, repeats=repeats,
                            min_time_s=min_time_s)
    return 2 * src.numel() * 4 / seconds / 1e9


def per_gpu(measure: Callable[[torch.device], dict[str, Any]], *,
            exclude_pci: tuple[str, ...] | list[str] = ()) -> list[dict[str, Any]]:
    """`measure` on every CUDA device but those at the PCI addresses in `exclude_pci`."""
    rows = []
    skip = {p.lower() for p in exclude_pci}
    for i in range(torch.cuda.device_count()):
        if (pci_of(i) or "").lower() in skip:
            continue
        device = torch.device("cuda", i)
        with torch.cuda.device(device):
            # the CUDA device's own name: "NVIDIA A100-SXM4-80GB MIG 3g.40gb" on a MIG slice
            rows.append({"index": i, "pci": pci_of(i), "device_name": torch.cuda.get_device_name(i),
                         **measure(device)})
        torch.cuda.empty_cache()
    return rows


def p2p_pattern(count: int, src: int, device: torch.device) -> torch.Tensor:
    """float32 data that is never zero and differs from element to element and between source
    GPUs, so a copy that delivered nothing (fresh memory reads as zeros), a shifted copy or
    another GPU's buffer is told apart. Values stay below 2**24, exact in float32."""
    idx = torch.arange(count, device=device, dtype=torch.int64)
    return ((idx * 40503 + src * 7919) % ((1 << 24) - 1) + 1).to(torch.float32)


def p2p_copy_ok(dst: torch.Tensor, src: int) -> bool:
    """Every element of `dst` equals source GPU `src`'s pattern (compared on dst's device)."""
    return torch.equal(dst, p2p_pattern(dst.numel(), src, dst.device))


def p2p(nbytes: int, *, repeats: int = 3, min_time_s: float = 0.05) -> dict[str, Any]:
    """Peer access matrix and one-way copy GB/s for every ordered pair of GPUs."""
    count = torch.cuda.device_count()
    access = [[i == j or torch.cuda.can_device_access_peer(i, j) for j in range(count)]
              for i in range(count)]
    bandwidth: list[list[float | None]] = [[None] * count for _ in range(count)]
    buffers = [p2p_pattern(nbytes // 4, i, torch.device("cuda", i)) for i in range(count)]
    for i in range(count):
        for j in range(count):
            if i == j:
                continue
            dst = torch.empty_like(buffers[i], device=f"cuda:{j}")
            with torch.cuda.device(j):
                seconds = _best_seconds(functools.partial(dst.copy_, buffers[i], non_blocking=True),
                                        torch.device("cuda", j), warmup=2, repeats=repeats,
                                        min_time_s=min_time_s)
            if not p2p_copy_ok(dst, i):
                raise RuntimeError(f"copy GPU{i} -> GPU{j} delivered wrong data")
            bandwidth[i][j] = nbytes / seconds / 1e9
            del dst
    return {"count": count, "pci": [pci_of(i) for i in range(count)], "access": access,
            "bandwidth_gbs": bandwidth, "bytes": nbytes}
