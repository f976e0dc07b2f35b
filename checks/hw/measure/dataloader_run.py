"""Real DataLoader experiments: start methods, throughput scaling, a worker killed mid-epoch.

Samples are exact integers, so "correct" means equal, whatever the worker count or start
method: sample i carries its index, `arange(L) + i * L` (checkable in closed form) and, for the
CPU-heavy variant, `rounds` of a modular recurrence (int64, no floating point, so no
thread-count-dependent rounding).
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from checks.supervise import procs

MODULUS = 2_147_483_629  # prime < 2**31: products stay inside int64
MULTIPLIER = 48_271


class PatternDataset(Dataset[dict[str, Any]]):
    """`length` samples of `width` int64 values; `rounds` > 0 adds CPU work per sample."""

    def __init__(self, length: int, width: int = 256, rounds: int = 0,
                 kill_at: int | None = None) -> None:
        self.length, self.width, self.rounds, self.kill_at = length, width, rounds, kill_at

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> dict[str, Any]:
        if self.kill_at is not None and i == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)  # a worker dying as an OOM kill would
        data = torch.arange(self.width, dtype=torch.int64) + i * self.width
        work = data % MODULUS
        for _ in range(self.rounds):
            work = (work * MULTIPLIER + i) % MODULUS
        return {"index": i, "data": data, "work": work, "pid": os.getpid()}


def expected_data(indices: torch.Tensor, width: int) -> torch.Tensor:
    return torch.arange(width, dtype=torch.int64).unsqueeze(0) + indices.unsqueeze(1) * width


def _loader(ds: PatternDataset, *, workers: int, batch_size: int, method: str | None = None,
            persistent: bool = False, prefetch: int = 2, timeout_s: float = 0.0,
            pin_memory: bool = False) -> DataLoader[dict[str, Any]]:
    extra: dict[str, Any] = {}
    if workers > 0:
        extra = {"multiprocessing_context": method, "persistent_workers": persistent,
                 "prefetch_factor": prefetch, "timeout": timeout_s}
    return DataLoader(ds, batch_size=batch_size, shuffle=False, num_workers=workers,
                      pin_memory=pin_memory, **extra)


def _audit(batches: list[dict[str, Any]], length: int, width: int) -> dict[str, Any]:
    """Union of indices complete and unique, every value what the index says."""
    indices = torch.cat([b["index"] for b in batches]) if batches else torch.empty(0, dtype=torch.int64)
    counts = torch.bincount(indices, minlength=length) if indices.numel() else torch.zeros(length)
    missing = torch.nonzero(counts == 0).flatten().tolist()
    duplicated = torch.nonzero(counts > 1).flatten().tolist()
    wrong = []
    for b in batches:
        bad = (b["data"] != expected_data(b["index"], width)).any(dim=1)
        wrong += b["index"][bad].tolist()
    return {"samples": int(indices.numel()), "missing": missing[:10], "n_missing": len(missing),
            "duplicated": duplicated[:10], "n_duplicated": len(duplicated), "wrong": wrong[:10],
            "n_wrong": len(wrong),
            "ok": not missing and not duplicated and not wrong and indices.numel() == length}


def _one_run(method: str, keep: bool, *, workers: int, length: int, batch_size: int,
             epochs: int, timeout_s: float) -> dict[str, Any]:
    run: dict[str, Any] = {"start_method": method, "persistent_workers": keep, "workers": workers}
    ds = PatternDataset(length)
    loader = _loader(ds, workers=workers, batch_size=batch_size, method=method, persistent=keep,
                     timeout_s=timeout_s)
    epochs_out: list[dict[str, Any]] = []
    pids: list[list[int]] = []
    try:
        for _ in range(epochs if keep else 1):
            t0 = time.perf_counter()
            batches = list(loader)
            audit = _audit(batches, length, ds.width)
            audit["seconds"] = round(time.perf_counter() - t0, 3)
            epochs_out.append(audit)
            pids.append(sorted({int(p) for b in batches for p in b["pid"]}))
        reused = len(pids) < 2 or pids[0] == pids[1]
        run.update(ok=all(e["ok"] for e in epochs_out) and reused, epochs=epochs_out,
                   worker_pids=pids, workers_reused=reused if keep else None,
                   error=None if reused else "persistent workers were restarted between epochs")
    except Exception as exc:  # a start method that cannot run is the finding
        run.update(ok=False, epochs=epochs_out, error=f"{type(exc).__name__}: {exc}")
    finally:
        del loader
    return run


def start_methods(methods: list[str], *, persistent: list[bool], workers: int = 2,
                  spawn_workers: int | None = None, length: int = 64, batch_size: int = 4,
                  epochs: int = 2, timeout_s: float = 60.0) -> dict[str, Any]:
    """Every start method x persistent_workers: `epochs` epochs each (one when not
    persistent), audited. fork runs go first, one at a time (forking a multi-threaded parent is
    unsafe); forkserver and spawn runs overlap, since their cost is each worker importing
    torch (the forkserver imports it once, preloaded)."""
    available = set(multiprocessing.get_all_start_methods())
    if "forkserver" in methods and "forkserver" in available:
        multiprocessing.set_forkserver_preload([__name__])
    kw: dict[str, Any] = {"workers": workers, "length": length, "batch_size": batch_size,
                          "epochs": epochs, "timeout_s": timeout_s}
    plan = [(m, keep) for m in methods for keep in persistent]
    results: dict[tuple[str, bool], dict[str, Any]] = {}
    spawn_kw = {**kw, "workers": spawn_workers or workers}
    for m, keep in plan:
        if m not in available:
            results[(m, keep)] = {"start_method": m, "persistent_workers": keep,
                                  "workers": workers, "ok": None,
                                  "error": f"start method {m} is not available here"}
        elif m == "fork":
            results[(m, keep)] = _one_run(m, keep, **kw)
    rest = [key for key in plan if key not in results]
    if rest:
        with ThreadPoolExecutor(max_workers=len(rest), thread_name_prefix="dl-start") as pool:
            futures = {key: pool.submit(_one_run, *key, **(spawn_kw if key[0] == "spawn" else kw))
                       for key in rest}
            results.update({key: f.result() for key, f in futures.items()})
    return {"runs": [results[key] for key in plan], "length": length, "batch_size": batch_size}


def _digest(batches: Iterator[dict[str, Any]]) -> tuple[str, int]:
    h = hashlib.sha256()
    n = 0
    for b in batches:
        h.update(b["index"].numpy().tobytes())
        h.update(b["data"].numpy().tobytes())
        h.update(b["work"].numpy().tobytes())
        n += int(b["index"].numel())
    return h.hexdigest(), n


def scaling(worker_counts: list[int], *, length: int = 48, rounds: int = 200, width: int = 4096,
            batch_size: int = 4, method: str = "fork", timeout_s: float = 60.0,
            pin_memory: bool = False) -> dict[str, Any]:
    """samples/s for each worker count over the same CPU-heavy dataset, plus a data digest."""
    points = []
    for workers in worker_counts:
        ds = PatternDataset(length, width=width, rounds=rounds)
        loader = _loader(ds, workers=workers, batch_size=batch_size, method=method,
                         timeout_s=timeout_s if workers else 0.0)
        t0 = time.perf_counter()
        digest, n = _digest(iter(loader))
        seconds = time.perf_counter() - t0
        points.append({"workers": workers, "samples_per_s": round(n / seconds, 2),
                       "seconds": round(seconds, 3), "digest": digest, "samples": n})
        del loader
    result: dict[str, Any] = {"points": points, "length": length, "rounds": rounds,
                              "start_method": method}
    if pin_memory:
        result["pin_memory"] = _pinned(length, batch_size, method, timeout_s)
    return result


def _pinned(length: int, batch_size: int, method: str, timeout_s: float) -> dict[str, Any]:
    """GPU hosts: batches come back in page-locked memory and copy to the GPU asynchronously."""
    ds = PatternDataset(length, width=1 << 16)
    loader = _loader(ds, workers=2, batch_size=batch_size, method=method, timeout_s=timeout_s,
                     pin_memory=True)
    pinned, copied, t0 = [], 0, time.perf_counter()
    for b in loader:
        pinned.append(bool(b["data"].is_pinned()))
        on_gpu = b["data"].to("cuda", non_blocking=True)
        copied += on_gpu.numel() * on_gpu.element_size()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    return {"all_pinned": all(pinned), "batches": len(pinned),
            "h2d_gbs": round(copied / seconds / 1e9, 3)}


def worker_death(*, length: int = 64, kill_at: int = 17, workers: int = 2, batch_size: int = 2,
                 method: str = "fork", timeout_s: float = 2.0,
                 deadline_s: float = 30.0) -> dict[str, Any]:
    """One worker SIGKILLs itself mid-epoch: the loader must raise, not hang.

    `timeout_s` is the DataLoader's own `timeout=`: when no batch arrives for that long it checks
    its workers and names the dead one. `deadline_s` bounds the whole attempt from outside.
    """
    ds = PatternDataset(length, kill_at=kill_at)
    loader = _loader(ds, workers=workers, batch_size=batch_size, method=method,
                     timeout_s=timeout_s)
    box: dict[str, Any] = {"batches": 0, "pids": set()}

    def consume() -> None:
        try:
            for b in loader:
                box["batches"] += 1
                box["pids"].update(int(p) for p in b["pid"])
        except Exception as exc:
            box["error"] = f"{type(exc).__name__}: {exc}"
        box["seconds"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    thread = threading.Thread(target=consume, name="dataloader-worker-death", daemon=True)
    thread.start()
    thread.join(deadline_s)
    hung = thread.is_alive()
    # After the error the loader shuts its other workers down; whatever is still there after a
    # grace period (or everything, on a hang) is killed and reported.
    grace = time.monotonic() + (0 if hung else 5)
    while time.monotonic() < grace and any(procs.alive(p) for p in box["pids"]):
        time.sleep(0.05)
    leftover = [p for p in sorted(box["pids"]) if procs.alive(p)]
    procs.kill_all(leftover)
    error = box.get("error")
    return {"detected": bool(error) and not hung, "hung": hung, "error": error,
            "seconds": round(box.get("seconds", deadline_s), 3),
            "batches_before": box["batches"], "expected_batches": -(-length // batch_size),
            "timeout_s": timeout_s, "deadline_s": deadline_s, "leftover_pids": leftover,
            "start_method": method}
