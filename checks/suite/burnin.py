"""Burn-in: sustained identical GEMMs on every GPU, results compared bit for bit, NVML sampled
under load (clocks, throttle reasons, temperature, power, PCIe link)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

from ..context import Context
from ..model import Result, fail, passed, skip, warn
from ..perdevice import each_gpu
from ..registry import check
from ..workloads import plan
from .health import THROTTLE_BAD

REMEDY_SDC = ("silent data corruption: drain the node, rerun the burn-in to confirm, run "
              "dcgmi diag -r 3; RMA the GPU if it repeats (quote serial and fault code)")


def majority_digest(devices: list[dict[str, Any]], key: str) -> str | None:
    counts = Counter(d[key] for d in devices)
    if not counts:
        return None
    (digest, n), *rest = counts.most_common()
    return digest if not rest or n > rest[0][1] else None


def sample_problems(samples: list[dict[str, Any]], *, pcie_gen_max: int | None,
                    pcie_width_max: int | None, slowdown_c: int | None,
                    margin_c: int) -> tuple[list[str], list[str]]:
    """(failures, warnings) seen in one GPU's samples under load."""
    failures, warnings = [], []
    reasons = 0
    for s in samples:
        reasons |= int(s.get("clock_event_reasons") or 0)
    bad = [name for bit, name in THROTTLE_BAD.items() if reasons & bit]
    if bad:
        failures.append(f"clocks throttled under load: {', '.join(bad)}")
    gens = [int(s["pcie_gen_current"]) for s in samples if s.get("pcie_gen_current")]
    widths = [int(s["pcie_width_current"]) for s in samples if s.get("pcie_width_current")]
    if gens and pcie_gen_max and max(gens) < pcie_gen_max:
        warnings.append(f"PCIe stayed at Gen{max(gens)} under load (max Gen{pcie_gen_max})")
    if widths and pcie_width_max and min(widths) < pcie_width_max:
        failures.append(f"PCIe link x{min(widths)} under load (max x{pcie_width_max})")
    temps = [int(s["temperature_c"]) for s in samples if s.get("temperature_c") is not None]
    if temps and slowdown_c and max(temps) >= slowdown_c - margin_c:
        warnings.append(f"reached {max(temps)} C under load (slowdown at {slowdown_c} C)")
    return failures, warnings


def _summary(samples: list[dict[str, Any]]) -> dict[str, Any]:
    def span(field: str) -> list[float] | None:
        values = [float(s[field]) for s in samples if s.get(field) is not None]
        return [min(values), max(values)] if values else None

    return {f: span(f) for f in ("sm_clock_mhz", "temperature_c", "power_w",
                                 "pcie_gen_current", "pcie_width_current")}


@check("burn-in", code="BRN001",
       title="sustained GEMM on every GPU: bit-identical results, no throttling under load",
       level="burn-in", stage="burn-in", tags=("compute", "gpu", "burn-in"), timeout_s=172800)
def burn_in(ctx: Context) -> Iterator[Result]:
    """--duration of identical GEMMs (burn_in.n_gpu, bf16) on every GPU at once. FAIL when a GPU's
    results differ from its own first result or from the other GPUs' (bit for bit), when NVML
    shows thermal/HW slowdown or a narrowed PCIe link under load; WARN for a PCIe generation
    below max or a temperature near slowdown. Samples are kept in the result. On a CPU host a
    short CPU run (burn_in.cpu_max_s) exercises the same comparison."""
    plat = plan.platform(ctx)
    if plat.kind == "blocked":
        yield skip(plan.BLOCKED)
        return
    duration = float(ctx.options.duration_s)
    if not plat.cuda:
        duration = min(duration, float(ctx.profile.get("burn_in.cpu_max_s", 5)))
    m = ctx.hw.workload(
        "burn_in", device="cuda" if plat.cuda else "cpu", duration_s=duration,
        n=int(plan.setting(ctx, "burn_in.n", plat, 1024)),
        dtype=str(plan.setting(ctx, "burn_in.dtype", plat, "fp32")),
        sample_interval_s=float(ctx.profile.get("burn_in.sample_interval_s", 2)))
    devices = m["devices"]
    if not plat.cuda:
        d = devices[0]
        details = {"run": {k: m[k] for k in ("duration_s", "n", "dtype")}, "devices": devices}
        if d["mismatched_elements"] or d["digest_first"] != d["digest_last"]:
            yield fail(f"CPU GEMM results changed between repetitions "
                       f"({d['mismatched_elements']} element(s))", value=d["mismatched_elements"],
                       details=details, remedy="run memtest86+; suspect RAM or CPU")
            return
        yield passed(f"CPU burn {m['duration_s']:.1f} s: {d['iterations']} GEMMs "
                     f"{m['n']}^3 {m['dtype']}, every result bit-identical (information: no GPU)",
                     value=d["iterations"], unit="GEMMs", details=details)
        return
    first_ref = majority_digest(devices, "digest_first")
    last_ref = majority_digest(devices, "digest_last")
    by_gpu: dict[int, list[dict[str, Any]]] = {}
    for s in m.get("samples", []):
        if "gpu" in s:
            by_gpu.setdefault(int(s["gpu"]), []).append(s)
    margin = int(ctx.profile.get("thermal.slowdown_margin_c", 5))
    run = {k: m[k] for k in ("duration_s", "n", "dtype")}

    def measure(gpu: Any) -> Result:
        d = plan.find_row(devices, gpu)
        if d is None:
            return skip(plan.NOT_MEASURED)
        samples = by_gpu.get(gpu.device.index, [])
        details: dict[str, Any] = {"run": run, "device_result": d, "samples": samples,
                                   "under_load": _summary(samples),
                                   "figures": {"burnin_tflops": d["tflops"]}}
        sdc = []
        if d["mismatched_elements"]:
            sdc.append(f"{d['mismatched_elements']} element(s) differed from its own first "
                       f"result over {d['iterations']} GEMMs")
        if first_ref is None or last_ref is None:
            sdc.append("no majority result among the GPUs to compare with")
        elif d["digest_first"] != first_ref or d["digest_last"] != last_ref:
            sdc.append("result differs bit for bit from the other GPUs' (identical inputs)")
        if sdc:
            return fail("; ".join(sdc), value=d["mismatched_elements"], details=details,
                        expected="bit-identical results", remedy=REMEDY_SDC)
        failures, warnings = sample_problems(
            samples, pcie_gen_max=plan.query_int(gpu, "pcie_gen_max"),
            pcie_width_max=plan.query_int(gpu, "pcie_width_max"),
            slowdown_c=plan.query_int(gpu, "temperature_slowdown_c"), margin_c=margin)
        text = (f"{d['iterations']} GEMMs in {m['duration_s']:.0f} s, {d['tflops']:.0f} TFLOP/s, "
                f"bit-identical across GPUs")
        if failures:
            return fail(f"{text}; but {'; '.join(failures)}", value=d["tflops"], unit="TFLOP/s",
                        details=details,
                        remedy="check cooling and power delivery for this GPU; a link that "
                               "narrows under load needs reseating or an RMA")
        if warnings:
            return warn(f"{text}; {'; '.join(warnings)}", value=d["tflops"], unit="TFLOP/s",
                        details=details, remedy="check cooling and the PCIe slot/riser")
        return passed(text, value=d["tflops"], unit="TFLOP/s", details=details)

    yield from each_gpu(ctx, measure)
