"""Synthetic fleets for the tests, the benchmark and the documentation screenshot.

Each host starts from a real report of `python -m checks --simulate <scenario>` and gains the
workload checks' results the way they publish them (figures.py): per-GPU matmul and memory
bandwidth figures, the host's all-reduce bus bandwidth curve and its DataLoader scaling curve, each
jittered by at most ±2 % so that only planted faults stand out.
"""

from __future__ import annotations

import json
import random
import tempfile
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from checks.model import Status

JITTER = 0.02
MATMUL_BF16_TFLOPS = 780.0
MEM_BW_GBS = 3000.0
ALLREDUCE_PEAK_BUSBW_GBS = 480.0
ALLREDUCE_LATENCY_US = 25.0
DATALOADER_SAMPLES_PER_WORKER = 1800.0
DATALOADER_WORKERS = (0, 1, 2, 4, 8, 12, 16, 24, 32)


@dataclass(frozen=True)
class Slow:
    """Plant a straggler: multiply `figure` on `host` (on one GPU, or host-level) by `factor`."""

    host: str
    figure: str
    factor: float
    gpu: int | None = None


@dataclass(frozen=True)
class Broken:
    """Plant a failed check result on `host` (one GPU's result, or the first result)."""

    host: str
    check: str
    gpu: int | None = None
    message: str = "planted failure"


def host_name(i: int) -> str:
    return f"node{i:04d}"


def base_report(scenario: str = "h100-sxm-8x-healthy", level: str = "quick") -> dict[str, Any]:
    """A real report from the check suite run on a shipped scenario (in-process, ~0.1 s)."""
    from checks.node import node_cli as cli

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "report.json"
        code = cli.main(["--simulate", scenario, "--level", level, "--json", str(path), "-q"])
        if code == 2:
            raise RuntimeError(f"python -m checks --simulate {scenario} failed")
        return json.loads(path.read_text())


def _result(status: str, message: str, device: dict[str, Any] | None,
            details: dict[str, Any], fault_code: str | None = None) -> dict[str, Any]:
    return {"status": status, "message": message, "value": None, "unit": None, "expected": None,
            "remedy": None, "device": device, "fault_code": fault_code, "details": details}


def _check(check_id: str, code: str, title: str, results: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": check_id, "code": code, "title": title, "level": "standard",
            "tags": ["workload"], "status": "PASS", "duration_s": 1.0, "results": results}


def _allreduce_curve(peak_busbw: float, ranks: int) -> list[dict[str, float]]:
    factor = 2 * (ranks - 1) / ranks  # all-reduce bus bandwidth factor (nccl-tests)
    points = []
    for k in range(26):  # 8 B .. 256 MiB
        size = 8 << k
        time_us = ALLREDUCE_LATENCY_US + size / (peak_busbw / factor * 1e3)
        algbw = size / time_us / 1e3
        points.append({"bytes": size, "time_us": round(time_us, 2), "algbw_gbs": round(algbw, 3),
                       "busbw_gbs": round(algbw * factor, 3)})
    return points


def _dataloader_curve(per_worker: float, saturation: int) -> list[dict[str, float]]:
    return [{"workers": w, "samples_per_s": round(per_worker * min(max(w, 0.8), saturation), 1)}
            for w in DATALOADER_WORKERS]


def _devices(report: dict[str, Any]) -> list[dict[str, Any]]:
    seen: dict[int, dict[str, Any]] = {}
    for chk in report["checks"]:
        for r in chk["results"]:
            dev = r.get("device")
            if dev and dev.get("index") is not None:
                seen.setdefault(dev["index"], dev)
    return [seen[i] for i in sorted(seen)]


def set_uuid(report: dict[str, Any], gpu: int, uuid: str) -> None:
    """Give GPU `gpu` of this report another UUID (as if a GPU moved between hosts)."""
    for chk in report["checks"]:
        for r in chk["results"]:
            if r.get("device") and r["device"].get("index") == gpu:
                r["device"] = {**r["device"], "uuid": uuid}


def refresh(report: dict[str, Any]) -> None:
    """Recompute check statuses, summary and verdict after results were changed."""
    for chk in report["checks"]:
        chk["status"] = str(max((Status(r["status"]) for r in chk["results"]), key=lambda s: s.severity))
    counts = Counter(chk["status"] for chk in report["checks"])
    report["summary"] = {s.value: counts.get(s.value, 0) for s in Status}
    failed = bool(counts["FAIL"] or counts["ERROR"])
    report["verdict"], report["exit_code"] = ("FAIL", 1) if failed else ("PASS", 0)


def add_digests(report: dict[str, Any], digests: dict[int, str], *, default: str) -> dict[str, Any]:
    """Append the reference-digest check the way checks/node/suite/digest.py publishes it: GPU i
    computed `digests.get(i, default)`, twice. The summary and verdict are recomputed, as the
    report loader requires."""
    from checks.hw.measure import reference  # the reference id only; imports no torch

    results = []
    for dev in _devices(report):
        digest = digests.get(dev["index"], default)
        results.append(_result("PASS", f"digest {digest[:16]}", dev, {
            "digest": digest, "digests": [digest, digest], "reference": reference.reference_id(),
            "model": dev.get("name")}))
    report["checks"].append(_check("reference-digest", "SDC001", "reference digest", results))
    refresh(report)
    return report


def add_workload(report: dict[str, Any], rng: random.Random,
                 slow: dict[tuple[str, int | None], float]) -> None:
    """Append the workload checks' figures and curves; `slow` maps (figure, gpu) to a factor."""

    def jitter(name: str, value: float, gpu: int | None = None) -> float:
        return round(value * (1 + rng.uniform(-JITTER, JITTER)) * slow.get((name, gpu), 1.0), 2)

    devices = _devices(report)
    matmul, membw = [], []
    for dev in devices:
        i = dev["index"]
        matmul.append(_result("PASS", "bf16 matmul throughput", dev,
                              {"figures": {"matmul_bf16_tflops": jitter("matmul_bf16_tflops",
                                                                        MATMUL_BF16_TFLOPS, i)}}))
        membw.append(_result("PASS", "device memory copy bandwidth", dev,
                             {"figures": {"membw_copy_gbs": jitter("membw_copy_gbs", MEM_BW_GBS, i)}}))
    ranks = max(len(devices), 2)
    busbw = jitter("allreduce_busbw_gbs", ALLREDUCE_PEAK_BUSBW_GBS)
    curve = _allreduce_curve(busbw, ranks)
    loader = _dataloader_curve(jitter("dataloader_max_samples_per_s", DATALOADER_SAMPLES_PER_WORKER), 12)
    checks = [
        _check("nccl-allreduce", "COL001", "All-reduce correctness and bus bandwidth", [_result(
            "PASS", f"all-reduce peak bus bandwidth over {ranks} ranks", None,
            {"figures": {"allreduce_busbw_gbs": max(p["busbw_gbs"] for p in curve)}, "curve": curve})]),
        _check("dataloader-scaling", "DAT003", "DataLoader throughput vs workers", [_result(
            "PASS", "DataLoader throughput saturates at 12 workers", None,
            {"figures": {"dataloader_max_samples_per_s": max(p["samples_per_s"] for p in loader)},
             "curve": loader})]),
    ]
    if devices:
        checks[:0] = [_check("gpu-matmul", "CMP001", "Dense matmul throughput per GPU", matmul),
                      _check("gpu-membw", "CMP002", "Device memory bandwidth per GPU", membw)]
    report["checks"].extend(checks)
    report["level"] = "standard"


def plant_failure(report: dict[str, Any], broken: Broken) -> None:
    chk = next(c for c in report["checks"] if c["id"] == broken.check)
    candidates = [r for r in chk["results"]
                  if broken.gpu is None or (r.get("device") or {}).get("index") == broken.gpu]
    result = candidates[0]
    result.update(status="FAIL", message=broken.message, fault_code=chk["code"])


def build(n_hosts: int, *, base: dict[str, Any], run_id: str = "run-1", slow: Iterable[Slow] = (),
          broken: Iterable[Broken] = (), seed: int = 0) -> list[dict[str, Any]]:
    """`n_hosts` reports named node0000..; each with its own GPU UUIDs and the workload figures."""
    return list(iter_build(n_hosts, base=base, run_id=run_id, slow=slow, broken=broken, seed=seed))


def iter_build(n_hosts: int, *, base: dict[str, Any], run_id: str = "run-1", slow: Iterable[Slow] = (),
               broken: Iterable[Broken] = (), seed: int = 0) -> Iterator[dict[str, Any]]:
    """build's reports one at a time (10 000 of them held at once take 2 GB)."""
    base_text = json.dumps(base)
    slow_by_host: dict[str, dict[tuple[str, int | None], float]] = {}
    for s in slow:
        slow_by_host.setdefault(s.host, {})[(s.figure, s.gpu)] = s.factor
    broken_by_host: dict[str, list[Broken]] = {}
    for b in broken:
        broken_by_host.setdefault(b.host, []).append(b)
    rng = random.Random(seed)
    for i in range(n_hosts):
        name = host_name(i)
        report = json.loads(base_text)
        report.update(host=name, run_id=run_id)
        tag = zlib.crc32(name.encode())
        for dev in _devices(report):
            set_uuid(report, dev["index"], f"GPU-{tag:08x}-0000-4000-8000-{dev['index']:012x}")
        add_workload(report, rng, slow_by_host.get(name, {}))
        for b in broken_by_host.get(name, []):
            plant_failure(report, b)
        refresh(report)
        yield report


def write(reports: Iterable[dict[str, Any]], directory: str | Path) -> Path:
    """reports/<run-id>/<host>.json, the layout the verify playbook fetches into."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for report in reports:
        (directory / f"{report['host']}.json").write_text(json.dumps(report))
    return directory
