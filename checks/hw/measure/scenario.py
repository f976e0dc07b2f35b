"""Scenario `measurements:` -> the shapes `local.run` returns, so the checks cannot tell.

Per-GPU entries are mappings: `default` applies to every GPU, an integer key (the GPU's index in
the scenario's `gpus:` list, as in `gpu_overrides`) patches one; `extends` merges mappings, so a
derived scenario can slow down a single GPU. Format reference: docs/workload-checks.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from checks.hw.base import NotSupported
from checks.hw.measure import busbw

HEALTHY_DIGEST = "scenario-digest-0"


def measurement(name: str, measurements: Mapping[str, Any], gpus: list[tuple[int, str]],
                **params: Any) -> Any:
    """`gpus`: (scenario index, PCI address) of every NVML-visible GPU, in NVML order."""
    if measurements.get(name) is None:  # absent, or `null` to drop what a base scenario had
        raise NotSupported(f"the scenario has no measurements.{name}")
    raw = measurements[name]
    excluded = {str(p).lower() for p in params.get("exclude_pci") or ()}
    # Excluded GPUs keep their place (indices stay) but get no entry: never touched.
    gpus = [(i, "" if pci.lower() in excluded else pci) for i, pci in gpus]
    build = BUILDERS.get(name)
    if build is None:
        raise NotSupported(f"unknown workload {name!r}")
    return build(raw, gpus, params)


def per_gpu(raw: Any, gpus: list[tuple[int, str]]) -> list[tuple[int, str, Any]]:
    """(NVML index, PCI address, merged entry) for every visible GPU that has an entry."""
    if not isinstance(raw, Mapping):
        raise ValueError("per-GPU measurements must be a mapping (default / GPU index -> value)")
    default = raw.get("default")
    rows = []
    for nvml_index, (scenario_index, pci) in enumerate(gpus):
        if not pci:
            continue  # excluded from the measurement (compute mode PROHIBITED)
        entry = raw.get(scenario_index, raw.get(str(scenario_index)))
        if isinstance(default, Mapping) and isinstance(entry, Mapping):
            entry = {**default, **entry}
        elif entry is None:
            entry = default
        if entry is not None:
            rows.append((nvml_index, pci, entry))
    return rows


def _cpu_or(raw: Mapping[str, Any], params: Mapping[str, Any]) -> Any | None:
    return raw.get("cpu") if params.get("device") == "cpu" else None


def _matmul(raw: Any, gpus: list[tuple[int, str]], params: Mapping[str, Any]) -> Any:
    cpu = _cpu_or(raw, params)
    if params.get("device") == "cpu":
        if cpu is None:
            raise NotSupported("the scenario has no measurements.matmul.cpu")
        return [{"index": None, "pci": None, "device": "cpu", "tflops": dict(cpu)}]
    return [{"index": i, "pci": pci, "device": f"cuda:{i}", **_named(entry),
             "tflops": {k: v for k, v in dict(entry).items() if k != "device_name"}}
            for i, pci, entry in per_gpu({k: v for k, v in raw.items() if k != "cpu"}, gpus)]


def _named(entry: Any) -> dict[str, str]:
    """`device_name` of a per-GPU entry: the name CUDA gives the device (a MIG slice's names
    its profile), as the real measurement reports it."""
    name = entry.get("device_name") if isinstance(entry, Mapping) else None
    return {"device_name": str(name)} if name else {}


def _membw(raw: Any, gpus: list[tuple[int, str]], params: Mapping[str, Any]) -> Any:
    def gbs(entry: Any) -> float:
        return float(entry["copy_gbs"] if isinstance(entry, Mapping) else entry)

    if params.get("device") == "cpu":
        cpu = _cpu_or(raw, params)
        if cpu is None:
            raise NotSupported("the scenario has no measurements.membw.cpu")
        return [{"index": None, "pci": None, "device": "cpu", "copy_gbs": gbs(cpu)}]
    return [{"index": i, "pci": pci, "device": f"cuda:{i}", **_named(entry), "copy_gbs": gbs(entry)}
            for i, pci, entry in per_gpu({k: v for k, v in raw.items() if k != "cpu"}, gpus)]


def _pair(text: str) -> tuple[int, int]:
    a, b = str(text).split("-")
    return int(a), int(b)


def _p2p(raw: Any, gpus: list[tuple[int, str]], params: Mapping[str, Any]) -> Any:
    """{default_gbs: 365, pairs: {"0-3": 120}, no_access: ["1-2"]}; pairs name NVML indices."""
    n = len(gpus)
    access = [[True] * n for _ in range(n)]
    bandwidth: list[list[float | None]] = [
        [None if i == j else float(raw.get("default_gbs", 0.0)) for j in range(n)]
        for i in range(n)]
    for key, value in (raw.get("pairs") or {}).items():
        i, j = _pair(key)
        bandwidth[i][j] = float(value)
    for key in raw.get("no_access") or []:
        i, j = _pair(key)
        access[i][j] = False
        bandwidth[i][j] = None
    return {"count": n, "pci": [pci for _, pci in gpus], "access": access,
            "bandwidth_gbs": bandwidth, "bytes": int(raw.get("bytes", 256 << 20))}


def _burn_in(raw: Any, gpus: list[tuple[int, str]], params: Mapping[str, Any]) -> Any:
    duration = float(params.get("duration_s", raw.get("duration_s", 600)))
    defaults = {"iterations": 1000, "mismatched_elements": 0, "digest": HEALTHY_DIGEST,
                "tflops": 0.0}
    devices = []
    entries: list[tuple[int | None, str | None, Any]]
    if params.get("device") == "cpu":
        entries = [(None, None, raw.get("cpu") or {})]
    else:
        entries = list(per_gpu(raw.get("devices") or {"default": {}}, gpus))
    for i, pci, entry in entries:
        e = {**defaults, **entry}
        devices.append({"device": "cpu" if i is None else f"cuda:{i}", "index": i, "pci": pci,
                        "iterations": int(e["iterations"]),
                        "mismatched_elements": int(e["mismatched_elements"]),
                        "digest_first": str(e.get("digest_first", e["digest"])),
                        "digest_last": str(e.get("digest_last", e["digest"])),
                        "tflops": float(e["tflops"])})
    samples = [{"t": 0.0, "gpu": i, **entry}
               for i, _pci, entry in per_gpu(raw.get("samples") or {}, gpus)]
    return {"devices": devices, "samples": samples, "duration_s": duration,
            "n": int(params.get("n", 8192)), "dtype": str(params.get("dtype", "bf16"))}


def _digest(raw: Any, gpus: list[tuple[int, str]], params: Mapping[str, Any]) -> Any:
    """{default: {digest: ...}, 3: {digest: other}, cpu: {digest: ...}}; an entry may give
    `digests` (one per repeat) to describe a GPU that cannot reproduce its own result."""
    from checks.hw.measure.reference import reference_id

    def row(i: int | None, pci: str | None, entry: Any) -> dict[str, Any]:
        e = dict(entry) if isinstance(entry, Mapping) else {"digest": entry}
        digests = [str(d) for d in e.get("digests") or [e.get("digest", HEALTHY_DIGEST)]
                   * int(params.get("repeats", 2))]
        return {"index": i, "pci": pci, "device": "cpu" if i is None else f"cuda:{i}",
                "digest": digests[0], "digests": digests,
                "reference": str(e.get("reference", reference_id()))}

    if params.get("device") == "cpu":
        cpu = _cpu_or(raw, params)
        if cpu is None:
            raise NotSupported("the scenario has no measurements.digest.cpu")
        return [row(None, None, cpu)]
    return [row(i, pci, entry)
            for i, pci, entry in per_gpu({k: v for k, v in raw.items() if k != "cpu"}, gpus)]


def _collectives(raw: Any, gpus: list[tuple[int, str]], params: Mapping[str, Any]) -> Any:
    """ops: {op: [[bytes, busbw_gbs], ...] or [{bytes, time_us|algbw_gbs|busbw_gbs}]}.

    As the rank program would: rows past the sizes the sweep asks for (max_bytes; all-reduce
    floor_bytes) are not measured, nor those a verified op does not fit in `free_bytes` (the
    least GPU memory any rank had free); `cut` (a recording's) is kept."""
    n = int(raw.get("world_size", params.get("nproc", len(gpus))))
    backend = str(raw.get("backend", "nccl"))
    sweep = params.get("sweep") or {}
    free = raw.get("free_bytes")
    ops, cut, asked = {}, dict(raw.get("cut") or {}), {}
    for op, rows in (raw.get("ops") or {}).items():
        full = [busbw.complete_row(op, {"bytes": r[0], "busbw_gbs": r[1]} if isinstance(r, list)
                                   else r, n) for r in rows]
        for r in full:
            r.setdefault("count", int(r["bytes"]) // 4)
        if sweep.get("max_bytes"):
            floor = sweep.get("floor_bytes") if op == "all_reduce" else None
            asked[op] = max(int(sweep["max_bytes"]), int(floor or 0))
            full = [r for r in full if int(r["bytes"]) <= asked[op]]
            _, why = busbw.memory_cut(op, [asked[op]], None if free is None else int(free))
            if why:
                full = [r for r in full if int(r["bytes"]) <= busbw.max_verified_bytes(int(free), op)]
                cut.setdefault(op, why)
        ops[op] = full
    table = "\n\n".join(busbw.format_table(op, rows, nranks=n, backend=backend)
                        for op, rows in ops.items())
    failure = raw.get("failure") or {}
    return {"backend": backend, "world_size": n, "ok": not failure,
            "summary": failure.get("summary", f"{n} rank(s) finished"),
            "culprits": list(failure.get("culprits", [])), "hung": bool(failure.get("hung")),
            "duration_s": float(raw.get("duration_s", 30.0)), "returncode": 0 if not failure else 1,
            "leftover_pids": [], "orphans_killed": [], "ranks": {},
            "errors": list(raw.get("errors") or []), "ops": ops if not failure else {},
            "table": table if not failure else "", "check_iters": 20, "check_elems": 1 << 20,
            "env": dict(raw.get("env") or {}), "command": "(scenario)", "log_tail": "",
            "free_bytes": free, "asked_bytes": asked, "cut": cut,
            "nccl_log": raw.get("nccl_log")}  # NCCL INFO text, read by nccl-transport


def _dataloader_workers(raw: Any, gpus: list[tuple[int, str]], params: Mapping[str, Any]) -> Any:
    """{failing: {start_method: error text}} on top of healthy runs for every method asked."""
    if "runs" in raw:
        return dict(raw)
    failing = raw.get("failing") or {}
    runs = []
    for method in params.get("methods", ["fork", "forkserver", "spawn"]):
        for keep in params.get("persistent", [True, False]):
            error = failing.get(method)
            runs.append({"start_method": method, "persistent_workers": keep,
                         "workers": int(params.get("workers", 2)), "ok": error is None,
                         "error": error, "epochs": [], "workers_reused": keep or None})
    return {"runs": runs, "length": int(params.get("length", 64)),
            "batch_size": int(params.get("batch_size", 4))}


def _dataloader_scaling(raw: Any, gpus: list[tuple[int, str]], params: Mapping[str, Any]) -> Any:
    """{points: [[workers, samples_per_s], ...], digests: {workers: other digest}}."""
    digests = raw.get("digests") or {}
    points = [{"workers": int(w), "samples_per_s": float(s),
               "digest": str(digests.get(int(w), HEALTHY_DIGEST)), "samples": 48}
              for w, s in raw.get("points", [])]
    out: dict[str, Any] = {"points": points, "length": 48, "rounds": 0, "start_method": "fork"}
    if "pin_memory" in raw:
        out["pin_memory"] = dict(raw["pin_memory"])
    return out


def _dataloader_worker_death(raw: Any, gpus: list[tuple[int, str]],
                             params: Mapping[str, Any]) -> Any:
    return {"detected": True, "hung": False, "seconds": 2.1, "batches_before": 8,
            "expected_batches": 32, "timeout_s": params.get("timeout_s", 2.0),
            "deadline_s": params.get("deadline_s", 30.0), "leftover_pids": [],
            "error": "RuntimeError: DataLoader worker (pid(s) 4242) exited unexpectedly",
            "start_method": "fork", **dict(raw)}


def _ib_write_bw(raw: Any, gpus: list[tuple[int, str]], params: Mapping[str, Any]) -> Any:
    """Recorded ib_write_bw output per NIC: {nic or "default": {output, returncode}} or the
    output text alone; replayed in the shape hw.perftest.run_loopback returns."""
    if not isinstance(raw, Mapping):
        raise ValueError("measurements.ib_write_bw must map NIC names to recorded output")
    entry = raw.get(params.get("nic"), raw.get("default"))
    if entry is None:
        raise NotSupported(f"the scenario records no ib_write_bw output for {params.get('nic')}")
    if isinstance(entry, str):
        entry = {"output": entry}
    return {"argv": ["ib_write_bw", "-d", str(params.get("nic"))], "returncode":
            int(entry.get("returncode", 0)), "output": str(entry.get("output", "")),
            "server_output": "", "timed_out": bool(entry.get("timed_out", False))}


BUILDERS = {
    "ib_write_bw": _ib_write_bw,
    "collectives": _collectives,
    "matmul": _matmul,
    "membw": _membw,
    "p2p": _p2p,
    "burn_in": _burn_in,
    "digest": _digest,
    "dataloader_workers": _dataloader_workers,
    "dataloader_scaling": _dataloader_scaling,
    "dataloader_worker_death": _dataloader_worker_death,
}
