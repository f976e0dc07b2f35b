"""Compute checks: dense matmul throughput and device memory bandwidth per GPU, with the
in-node straggler rule (a GPU far below its peers fails even when within spec)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from checks.model import Result, fail, passed, skip
from checks.node import rules
from checks.node import workload_plan as plan
from checks.node.context import Context
from checks.node.perdevice import each_gpu
from checks.node.registry import Budget, Cost, check

REMEDY_SLOW = ("compare with clock-throttle, gpu-power and gpu-temperature for this GPU (power "
               "cap, thermal slowdown), check `nvidia-smi -q -d PERFORMANCE,CLOCK` under load; "
               "a GPU slow with normal clocks and temperature is an RMA candidate")
LABELS = {"mem_bw_gbs": "copy"}


def _absolute(ctx: Context, metric: str, fraction_key: str) -> rules.Threshold | None:
    """thresholds.<metric> when the profile has one, else peaks.<metric> x the fraction."""
    p = ctx.profile
    explicit = p.get(f"thresholds.{metric}")
    if explicit is not None:
        return rules.Threshold(float(explicit), f"profile {p.name} thresholds.{metric}")
    peak = p.get(f"peaks.{metric}")
    if peak is None:
        return None
    fraction = float(p.get(fraction_key, 0.5))
    return rules.Threshold(float(peak) * fraction,
                           f"{fraction:g} x {peak:g} spec peak (profile {p.name})")


# The MIG profile in the name CUDA gives a slice: "NVIDIA A100-SXM4-80GB MIG 3g.40gb" (the
# device properties Hugging Face's ZeroGPU package, https://pypi.org/project/spaces/, records
# for its slices: 42 of the A100's 108 SMs, 42144366592 bytes, driver 535).
MIG_SLICE = re.compile(r"\bMIG (\d+g\.\d+gb(?:\+\w+)*)\b")


def judge_per_gpu(values: dict[int, dict[str, float]], metrics: list[str],
                  thresholds: dict[str, rules.Threshold | None], peaks: dict[str, float | None],
                  straggler_pct: float, unit: str) -> dict[int, tuple[list[str], list[str]]]:
    """Per GPU index: (problems, readings). Absolute threshold and straggler rule per metric."""
    out: dict[int, tuple[list[str], list[str]]] = {i: ([], []) for i in values}
    for metric in metrics:
        column = {i: v[metric] for i, v in values.items() if metric in v}
        slow = rules.stragglers(column, straggler_pct)
        limit = thresholds.get(metric)
        for i, value in column.items():
            problems, readings = out[i]
            peak = peaks.get(metric)
            pct = f" ({value / peak * 100:.0f} % of {peak:g})" if peak else ""
            label = LABELS.get(metric, metric.split("_")[0])
            readings.append(f"{label} {value:.1f}{pct}")
            if limit is not None and rules.below(value, limit.value):
                problems.append(f"{label} {value:.1f} {unit} below {limit.value:.0f} "
                                f"({limit.source})")
            if i in slow:
                s = slow[i]
                problems.append(f"straggler: {label} {value:.1f} {unit} is "
                                f"{s.shortfall_pct:.0f} % below the median of its peers "
                                f"({s.peers_median:.1f}; limit {straggler_pct:g} %)")
    return out


def _gpu_results(ctx: Context, rows: list[dict[str, Any]], metrics: list[str], key: str,
                 names: dict[str, str], thresholds: dict[str, rules.Threshold | None],
                 peaks: dict[str, float | None], unit: str,
                 untouched: dict[str, str]) -> Iterator[Result]:
    straggler_pct = float(ctx.profile.get("straggler_pct", 10))
    by_index: dict[int, dict[str, float]] = {}
    for gpu in ctx.gpus:
        row = plan.find_row(rows, gpu)
        if row is None:
            continue
        values = row[key] if isinstance(row[key], dict) else {metrics[0]: row[key]}
        by_index[int(gpu.device.index or 0)] = {m: float(v) for m, v in values.items() if m in metrics}
    # A MIG slice has a share of the GPU's SMs and memory: the profile's peaks are the whole
    # GPU's, so a slice is judged only against the other slices of its profile (straggler rule).
    slices: dict[int, str] = {}
    for gpu in ctx.gpus:
        row = plan.find_row(rows, gpu)
        found = MIG_SLICE.search(str(row.get("device_name") or "")) if row else None
        if found and int(gpu.device.index or 0) in by_index:
            slices[int(gpu.device.index or 0)] = found.group(1)
    verdicts: dict[int, tuple[list[str], list[str]]] = {}
    for group in {slices.get(i) for i in by_index}:
        members = {i: v for i, v in by_index.items() if slices.get(i) == group}
        verdicts.update(judge_per_gpu(
            members, metrics, thresholds if group is None else dict.fromkeys(metrics),
            peaks if group is None else dict.fromkeys(metrics), straggler_pct, unit))
    expected = "; ".join(f"{LABELS.get(m, m.split('_')[0])} >= {t.value:.0f}"
                         for m, t in thresholds.items() if t) or None

    def measure(gpu: Any) -> Result:
        index = int(gpu.device.index or 0)
        if index not in by_index:
            return skip(untouched.get((gpu.device.pci or "").lower(), plan.NOT_MEASURED))
        problems, readings = verdicts[index]
        figures = {names[m]: round(v, 3) for m, v in by_index[index].items()}
        first = metrics[0]
        details = {"figures": figures, "straggler_pct": straggler_pct}
        text = f"{', '.join(readings)} {unit}"
        if index in slices:
            details["mig_slice"] = slices[index]
            text += (f" (MIG {slices[index]} slice: the spec peaks are the whole GPU's; judged "
                     "only against the other slices of its profile)")
        if problems:
            details["rule"] = "straggler" if all(p.startswith("straggler") for p in problems) \
                else "threshold"
            return fail("; ".join(problems), value=figures.get(names[first]), unit=unit,
                        expected=expected, details=details, remedy=REMEDY_SLOW)
        return passed(text, value=figures.get(names[first]), unit=unit, expected=expected,
                      details=details)

    yield from each_gpu(ctx, measure)


@check("gpu-matmul", code="CMP001", title="dense matmul TFLOP/s per GPU (bf16, fp16, tf32, fp32)",
       level="standard", stage="workload", tags=("compute", "gpu"), timeout_s=1800,
       gated_by=("gpu-occupied",), scope="gpu", nvml=("compute_capability", "compute_mode"),
       # 4 dtypes x 8192^3, >= 0.2 s per timed repeat; cpu 9.3 s. Smaller: bf16 only, the dtype
       # training runs in.
       budget=Budget(value=7, cost=Cost(cpu=10, gpu=12, per_gpu=6), source="measured cpu",
                     smaller_cost=Cost(cpu=10, gpu=12, per_gpu=2),
                     smaller_profile={"compute": {"matmul_dtypes_gpu": ["bf16"]}}))
def gpu_matmul(ctx: Context) -> Iterator[Result]:
    """n x n x n matmul (compute.matmul_n, 8192) per dtype on every GPU, as TFLOP/s and % of the
    profile's spec peak. FAIL below compute.matmul_min_fraction x peak (or
    thresholds.matmul_<dtype>_tflops), or more than straggler_pct below the median of the other
    GPUs. SKIP on a host without a GPU, with the CPU's fp32 GFLOP/s as information
    (figure cpu_matmul_fp32_gflops): what ran there was the CPU, not a GPU."""
    plat = plan.platform(ctx)
    if plat.kind == "blocked":
        yield skip(plan.BLOCKED)
        return
    dtypes = list(plan.setting(ctx, "compute.matmul_dtypes", plat, ["fp32"]))
    n = int(plan.setting(ctx, "compute.matmul_n", plat, 1024))
    min_time = float(plan.setting(ctx, "compute.min_time_s", plat, 0.1))
    untouched = plan.prohibited(ctx) if plat.cuda else {}
    rows = ctx.hw.workload("matmul", device="cuda" if plat.cuda else "cpu", dtypes=dtypes, n=n,
                           min_time_s=min_time, exclude_pci=sorted(untouched))
    if not plat.cuda:
        tflops = rows[0]["tflops"]
        figures = {f"cpu_matmul_{d}_gflops": round(v * 1e3, 2) for d, v in tflops.items()}
        text = ", ".join(f"{d} {v * 1e3:.1f}" for d, v in tflops.items())
        yield skip(f"no GPU on this host; measured the CPU instead: matmul {n}^3 {text} GFLOP/s "
                   f"(information, not a GPU verdict)",
                   value=figures.get(f"cpu_matmul_{dtypes[0]}_gflops"), unit="GFLOP/s",
                   details={"figures": figures, "n": n, "measured_on": "cpu"})
        return
    metrics = [f"{d}_tflops" for d in dtypes]
    renamed = [{**r, "tflops": {f"{d}_tflops": v for d, v in r["tflops"].items()}} for r in rows]
    thresholds = {m: _absolute(ctx, m, "compute.matmul_min_fraction") for m in metrics}
    peaks = {m: ctx.profile.get(f"peaks.{m}") for m in metrics}
    names = {m: f"matmul_{m}" for m in metrics}
    yield from _gpu_results(ctx, renamed, metrics, "tflops", names, thresholds, peaks,
                            "TFLOP/s", untouched)


@check("gpu-membw", code="CMP002", title="device memory copy bandwidth per GPU",
       level="standard", stage="workload", tags=("compute", "gpu"), timeout_s=900,
       gated_by=("gpu-occupied",), scope="gpu", nvml=("compute_capability", "compute_mode"),
       budget=Budget(value=6, cost=Cost(cpu=1, gpu=12, per_gpu=2), source="measured cpu"))  # cpu 0.45 s
def gpu_membw(ctx: Context) -> Iterator[Result]:
    """Device-to-device copy of compute.membw_bytes (2 GiB), counted read + write, per GPU.
    FAIL below thresholds.mem_bw_gbs (DCGM-style floor) or compute.membw_min_fraction x
    peaks.mem_bw_gbs, or more than straggler_pct below the other GPUs. SKIP on a host without a
    GPU, with the CPU's copy GB/s as information (figure cpu_membw_copy_gbs)."""
    plat = plan.platform(ctx)
    if plat.kind == "blocked":
        yield skip(plan.BLOCKED)
        return
    nbytes = int(plan.setting(ctx, "compute.membw_bytes", plat, 1 << 28))
    min_time = float(plan.setting(ctx, "compute.min_time_s", plat, 0.1))
    untouched = plan.prohibited(ctx) if plat.cuda else {}
    rows = ctx.hw.workload("membw", device="cuda" if plat.cuda else "cpu", nbytes=nbytes,
                           min_time_s=min_time, exclude_pci=sorted(untouched))
    if not plat.cuda:
        gbs = float(rows[0]["copy_gbs"])
        yield skip(f"no GPU on this host; measured the CPU instead: memory copy {gbs:.1f} GB/s "
                   f"(read + write; information, not a GPU verdict)", value=round(gbs, 2),
                   unit="GB/s", details={"figures": {"cpu_membw_copy_gbs": round(gbs, 2)},
                                         "bytes": nbytes, "measured_on": "cpu"})
        return
    metric = "mem_bw_gbs"
    yield from _gpu_results(ctx, rows, [metric], "copy_gbs", {metric: "membw_copy_gbs"},
                            {metric: _absolute(ctx, metric, "compute.membw_min_fraction")},
                            {metric: ctx.profile.get(f"peaks.{metric}")}, "GB/s", untouched)
