"""Burn-in: the same GEMM on every device for a while, results compared bit for bit.

Each device multiplies identical inputs over and over. Every result is compared on the device
with that device's first result (a GPU that computes differently under heat or power stress:
gpu-burn's test), and the first and last results are hashed so the devices can be compared with
each other (identical hardware and inputs give identical bits: imbue's test). A sampler thread
reads NVML while the load runs (clocks, throttle reasons, temperature, power, PCIe link).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from checks.hw.measure import cudatime
from checks.hw.measure.compute_run import DTYPES

Sampler = Callable[[], list[dict[str, Any]]]
_INT_VIEW = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(_INT_VIEW[t.element_size()])


def _digest(t: torch.Tensor) -> str:
    return hashlib.sha256(_bits(t).cpu().numpy().tobytes()).hexdigest()


def _timed_mm(s: dict[str, Any]) -> None:
    """One GEMM, its time added to s["mm_s"]: only the matmul counts toward TFLOP/s, not the
    bit comparison (on a GPU through CUDA events on the GEMM's own device's stream, which time
    the kernel, collected at each sync; cudatime says why not the current device's)."""
    if s["a"].device.type == "cuda":
        with cudatime.span(s["a"].device) as pair:
            torch.mm(s["a"], s["b"], out=s["out"])
        s["events"].append(pair)
        return
    t = time.perf_counter()
    torch.mm(s["a"], s["b"], out=s["out"])
    s["mm_s"] += time.perf_counter() - t


def _collect_events(s: dict[str, Any]) -> None:
    """Add the finished CUDA event pairs' times to s["mm_s"]; call after synchronizing the
    GEMM's device."""
    if s["events"]:
        s["mm_s"] += cudatime.elapsed_s(s["events"], s["a"].device)
    s["events"].clear()


def _sample_loop(sampler: Sampler, interval_s: float, stop: threading.Event, t0: float,
                 out: list[dict[str, Any]]) -> None:
    while not stop.is_set():
        now = round(time.monotonic() - t0, 2)
        try:
            out.extend({"t": now, **s} for s in sampler())
        except Exception as exc:  # sampling must never stop the load
            out.append({"t": now, "error": f"{type(exc).__name__}: {exc}"})
        stop.wait(interval_s)


def burn(devices: list[torch.device], *, duration_s: float, n: int, dtype: str = "bf16",
         sampler: Sampler | None = None, sample_interval_s: float = 2.0,
         check_every: int = 1) -> dict[str, Any]:
    """Run the GEMM on every device for `duration_s`; see the module docstring."""
    torch_dtype = DTYPES[dtype]
    if dtype in ("tf32", "fp32"):
        torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
    gen = torch.Generator(device="cpu").manual_seed(1234)
    # Scaled so the products stay well inside the dtype's range.
    a_cpu = (torch.randn(n, n, generator=gen) / n**0.5).to(torch_dtype)
    b_cpu = (torch.randn(n, n, generator=gen) / n**0.5).to(torch_dtype)
    state = []
    for dev in devices:
        a, b = a_cpu.to(dev), b_cpu.to(dev)
        first = torch.mm(a, b)
        state.append({"a": a, "b": b, "first": first, "out": first.clone(),
                      "wrong": torch.zeros((), dtype=torch.int64, device=dev), "iterations": 1,
                      "mm_s": 0.0, "events": []})
    first_digests = [_digest(s["first"]) for s in state]
    samples: list[dict[str, Any]] = []
    stop = threading.Event()
    t0 = time.monotonic()
    thread = None
    if sampler is not None:
        thread = threading.Thread(target=_sample_loop, daemon=True, name="burn-sampler",
                                  args=(sampler, sample_interval_s, stop, t0, samples))
        thread.start()
    try:
        while time.monotonic() - t0 < duration_s:
            for s in state:  # kernels queue asynchronously: all devices busy at once
                _timed_mm(s)
                s["iterations"] += 1
                if s["iterations"] % check_every == 0:
                    s["wrong"] += (_bits(s["out"]) != _bits(s["first"])).sum()
            if devices[0].type == "cuda" and state[0]["iterations"] % 16 == 0:
                for dev in devices:  # bound the queue so the clock check above stays honest
                    torch.cuda.synchronize(dev)
                for s in state:
                    _collect_events(s)
        for dev in devices:
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
        for s in state:
            _collect_events(s)
    finally:
        stop.set()
        if thread is not None:
            thread.join(sample_interval_s + 5)
    elapsed = time.monotonic() - t0
    rows = []
    for dev, s, digest in zip(devices, state, first_digests, strict=True):
        rows.append({"device": str(dev), "index": dev.index if dev.type == "cuda" else None,
                     "iterations": s["iterations"], "mismatched_elements": int(s["wrong"].item()),
                     "digest_first": digest, "digest_last": _digest(s["out"]),
                     "matmul_s": round(s["mm_s"], 4),
                     "tflops": round(2 * n**3 * (s["iterations"] - 1) / max(s["mm_s"], 1e-9) / 1e12, 3)})
    return {"devices": rows, "samples": samples, "duration_s": round(elapsed, 2), "n": n,
            "dtype": dtype}
