"""Burn-in: sustained identical GEMMs on every GPU, results compared bit for bit, throughput
compared across GPUs and with a floor, NVML sampled under load (clocks against the max clock,
throttle reasons, temperature, power, PCIe link)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

from checks.model import Result, error, fail, passed, skip, warn
from checks.node import rules
from checks.node import workload_plan as plan
from checks.node.context import Context
from checks.node.perdevice import each_gpu
from checks.node.registry import Budget, Cost, check
from checks.node.suite.gpu_power_thermal import THROTTLE_BAD

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


def load_samples(samples: list[dict[str, Any]], min_utilization: float) -> list[dict[str, Any]]:
    """The samples NVML answered while the GPU was busy (utilization unknown counts as busy)."""
    usable = [x for x in samples if "error" not in x and (
        x.get("sm_clock_mhz") is not None or x.get("clock_event_reasons") is not None)]
    return [x for x in usable if x.get("utilization_gpu") is None
            or float(x["utilization_gpu"]) >= min_utilization]


def clock_problems(samples: list[dict[str, Any]], *, max_mhz: int | None, warn_fraction: float,
                   fail_fraction: float) -> tuple[list[str], list[str], float | None]:
    """(failures, warnings, median SM clock) from the SM clock under load vs the max clock."""
    clocks = sorted(float(x["sm_clock_mhz"]) for x in samples if x.get("sm_clock_mhz"))
    if not clocks or not max_mhz:
        return [], [], None
    median = clocks[len(clocks) // 2] if len(clocks) % 2 else \
        (clocks[len(clocks) // 2 - 1] + clocks[len(clocks) // 2]) / 2
    text = (f"SM clock under load {median:.0f} MHz = {median / max_mhz * 100:.0f} % of its max "
            f"{max_mhz} MHz")
    if median < fail_fraction * max_mhz:
        return [f"{text} (below {fail_fraction:g} x max)"], [], median
    if median < warn_fraction * max_mhz:
        return [], [f"{text} (below {warn_fraction:g} x max)"], median
    return [], [], median


def _summary(samples: list[dict[str, Any]]) -> dict[str, Any]:
    def span(field: str) -> list[float] | None:
        values = [float(s[field]) for s in samples if s.get(field) is not None]
        return [min(values), max(values)] if values else None

    return {f: span(f) for f in ("sm_clock_mhz", "temperature_c", "power_w",
                                 "pcie_gen_current", "pcie_width_current")}


def throughput_floor(ctx: Context, dtype: str) -> rules.Threshold | None:
    """thresholds.burnin_<dtype>_tflops, else burn_in.min_fraction x peaks.<dtype>_tflops."""
    p = ctx.profile
    explicit = p.get(f"thresholds.burnin_{dtype}_tflops")
    if explicit is not None:
        return rules.Threshold(float(explicit), f"profile {p.name} thresholds.burnin_{dtype}_tflops")
    peak = p.get(f"peaks.{dtype}_tflops")
    if peak is None:
        return None
    fraction = float(p.get("burn_in.min_fraction"))
    return rules.Threshold(float(peak) * fraction,
                           f"{fraction:g} x {peak:g} spec peak (profile {p.name})")


def _cpu_verdict(m: dict[str, Any]) -> Result:
    d = m["devices"][0]
    details = {"run": {k: m[k] for k in ("duration_s", "n", "dtype")}, "devices": m["devices"]}
    if d["mismatched_elements"] or d["digest_first"] != d["digest_last"]:
        return fail(f"CPU GEMM results changed between repetitions "
                    f"({d['mismatched_elements']} element(s))", value=d["mismatched_elements"],
                    details=details, remedy="run memtest86+; suspect RAM or CPU")
    return passed(f"CPU burn {m['duration_s']:.1f} s: {d['iterations']} GEMMs "
                  f"{m['n']}^3 {m['dtype']}, every result bit-identical (no GPU: the CPU ran "
                  f"it; throughput and clocks not judged)",
                  value=d["iterations"], unit="GEMMs", details=details)


class _GpuBurnJudge:
    """One burn-in run's figures, judged GPU by GPU: results first (silent data corruption),
    then throughput, clocks and throttling under load, then whether NVML saw it loaded."""

    def __init__(self, ctx: Context, m: dict[str, Any], untouched: dict[str, str]) -> None:
        p = ctx.profile
        self.m, self.untouched = m, untouched
        devices = m["devices"]
        self.first_ref = majority_digest(devices, "digest_first")
        self.last_ref = majority_digest(devices, "digest_last")
        self.by_gpu: dict[int, list[dict[str, Any]]] = {}
        for x in m.get("samples", []):
            if "gpu" in x:
                self.by_gpu.setdefault(int(x["gpu"]), []).append(x)
        self.margin = int(p.get("thermal.slowdown_margin_c"))
        self.run = {k: m[k] for k in ("duration_s", "n", "dtype")}
        self.straggler_pct = float(p.get("straggler_pct"))
        self.rows = {int(g.device.index or 0): plan.find_row(devices, g) for g in ctx.gpus}
        self.slow = rules.stragglers({i: float(d["tflops"]) for i, d in self.rows.items() if d},
                                     self.straggler_pct)
        self.floor = throughput_floor(ctx, str(m["dtype"]))
        self.min_util = float(p.get("burn_in.load_utilization_min"))
        self.warn_fraction = float(p.get("burn_in.clock_warn_fraction"))
        self.fail_fraction = float(p.get("burn_in.clock_fail_fraction"))
        self.sampler_errors = [str(x["error"]) for x in m.get("samples", []) if "error" in x]

    def corruption(self, d: dict[str, Any]) -> list[str]:
        sdc = []
        if d["mismatched_elements"]:
            sdc.append(f"{d['mismatched_elements']} element(s) differed from its own first "
                       f"result over {d['iterations']} GEMMs")
        if self.first_ref is None or self.last_ref is None:
            sdc.append("no majority result among the GPUs to compare with")
        elif d["digest_first"] != self.first_ref or d["digest_last"] != self.last_ref:
            sdc.append("result differs bit for bit from the other GPUs' (identical inputs)")
        return sdc

    def load_problems(self, gpu: Any, loaded: list[dict[str, Any]],
                      details: dict[str, Any]) -> tuple[list[str], list[str], int | None, float | None]:
        failures, warnings = sample_problems(
            loaded, pcie_gen_max=plan.query_int(gpu, "pcie_gen_max"),
            pcie_width_max=plan.query_int(gpu, "pcie_width_max"),
            slowdown_c=plan.query_int(gpu, "temperature_slowdown_c"), margin_c=self.margin)
        max_mhz = plan.query_int(gpu, "sm_clock_max_mhz")
        f_clk, w_clk, median_mhz = clock_problems(loaded, max_mhz=max_mhz,
                                                  warn_fraction=self.warn_fraction,
                                                  fail_fraction=self.fail_fraction)
        if median_mhz is not None:
            details["figures"]["burnin_sm_clock_mhz"] = median_mhz
            details["sm_clock_max_mhz"] = max_mhz
        return failures + f_clk, warnings + w_clk, max_mhz, median_mhz

    def speed_problems(self, index: int, tflops: float) -> list[str]:
        failures = []
        if self.floor is not None and rules.below(tflops, self.floor.value):
            failures.append(f"throughput {tflops:.0f} TFLOP/s below {self.floor.value:.0f} "
                            f"({self.floor.source})")
        if index in self.slow:
            s = self.slow[index]
            failures.append(f"straggler: {tflops:.0f} TFLOP/s is {s.shortfall_pct:.0f} % below "
                            f"the median of the other GPUs ({s.peers_median:.0f}; limit "
                            f"{self.straggler_pct:g} %)")
        return failures

    def unsampled(self, text: str, samples: list[dict[str, Any]], tflops: float, expected: str,
                  details: dict[str, Any]) -> Result:
        why = ("NVML gave no sample while it ran" if not samples else
               f"none of its {len(samples)} NVML sample(s) saw it under load (utilization "
               f">= {self.min_util:g} %, with a clock or throttle reading)")
        if self.sampler_errors:
            why += f" ({len(self.sampler_errors)} sampling error(s), first: {self.sampler_errors[0]})"
            details["sampler_errors"] = self.sampler_errors[:10]
        return error(f"{text}; clocks and throttling under load not measured: {why}",
                     value=tflops, unit="TFLOP/s", expected=expected, details=details,
                     remedy="check that NVML answers while the GPUs are busy (driver-loaded, "
                            "nvml checks) and rerun; a burn-in without samples proves only "
                            "the results")

    def __call__(self, gpu: Any) -> Result:
        index = int(gpu.device.index or 0)
        d = self.rows.get(index)
        if d is None:
            return skip(self.untouched.get((gpu.device.pci or "").lower(), plan.NOT_MEASURED))
        samples = self.by_gpu.get(index, [])
        loaded = load_samples(samples, self.min_util)
        details: dict[str, Any] = {"run": self.run, "device_result": d, "samples": samples,
                                   "under_load": _summary(loaded),
                                   "samples_under_load": len(loaded),
                                   "figures": {"burnin_tflops": d["tflops"]}}
        sdc = self.corruption(d)
        if sdc:
            return fail("; ".join(sdc), value=d["mismatched_elements"], details=details,
                        expected="bit-identical results", remedy=REMEDY_SDC)
        failures, warnings, max_mhz, median_mhz = self.load_problems(gpu, loaded, details)
        tflops = float(d["tflops"])
        failures += self.speed_problems(index, tflops)
        text = (f"{d['iterations']} GEMMs in {self.m['duration_s']:.0f} s, {tflops:.0f} TFLOP/s, "
                f"bit-identical across GPUs")
        if median_mhz is not None:
            text += f", SM {median_mhz:.0f} of {max_mhz} MHz under load"
        expected = (f"bit-identical; within {self.straggler_pct:g} % of the other GPUs"
                    + (f"; >= {self.floor.value:.0f} TFLOP/s" if self.floor else "")
                    + "; no thermal/HW slowdown under load")
        if failures:
            return fail(f"{text}; but {'; '.join(failures)}", value=tflops, unit="TFLOP/s",
                        expected=expected, details=details,
                        remedy="check cooling, power delivery and clock-throttle for this GPU; a "
                               "GPU slow with normal clocks, or a link that narrows under load, "
                               "needs reseating or an RMA")
        if not loaded:
            return self.unsampled(text, samples, tflops, expected, details)
        if max_mhz is None or median_mhz is None:
            warnings.append("SM clock under load not judged (NVML gives no clock or max clock)")
        if warnings:
            return warn(f"{text}; {'; '.join(warnings)}", value=tflops, unit="TFLOP/s",
                        expected=expected, details=details,
                        remedy="check cooling and the PCIe slot/riser")
        return passed(text, value=tflops, unit="TFLOP/s", expected=expected, details=details)


@check("burn-in", code="BRN001",
       title="sustained GEMM on every GPU: bit-identical results, throughput and clocks under load",
       level="burn-in", stage="burn-in", tags=("compute", "gpu", "burn-in"), timeout_s=172800,
       gated_by=("gpu-occupied",),
       scope="gpu",
       nvml=("compute_capability", "pcie_gen_max", "pcie_width_max", "temperature_slowdown_c",
             "sm_clock_max_mhz", "compute_mode"),
       # start-up around the timed load; load-dependent faults (SBE bursts, clocks, PCIe downtraining) show
       # only under load
       budget=Budget(value=6, cost=Cost(cpu=10, gpu=20), source="estimated", min_duration_s=60))
def burn_in(ctx: Context) -> Iterator[Result]:
    """--duration of identical GEMMs (burn_in.n_gpu, bf16) on every GPU at once, NVML sampled under
    load. FAIL when a GPU's results differ from its own first result or from the other GPUs'
    (bit for bit); when its throughput is more than straggler_pct below the other GPUs' or below
    the floor (burn_in.min_fraction x spec peak); when NVML shows thermal/HW slowdown or power
    brake, an SM clock under load below burn_in.clock_fail_fraction x max, or a narrowed PCIe
    link. WARN for a clock below burn_in.clock_warn_fraction x max, a PCIe generation below max,
    a temperature near slowdown. ERROR when NVML gave no sample under load for a GPU (clocks not
    measured is never a PASS). On a CPU host a short CPU run (burn_in.cpu_max_s) exercises the
    repeat comparison."""
    plat = plan.platform(ctx)
    if plat.kind == "blocked":
        yield skip(plan.BLOCKED)
        return
    duration = float(ctx.options.duration_s)
    if not plat.cuda:
        duration = min(duration, float(ctx.profile.get("burn_in.cpu_max_s")))
    untouched = plan.prohibited(ctx) if plat.cuda else {}
    dtype = str(plan.setting(ctx, "burn_in.dtype", plat, "fp32"))
    m = ctx.hw.workload(
        "burn_in", device="cuda" if plat.cuda else "cpu", duration_s=duration,
        n=int(plan.setting(ctx, "burn_in.n", plat, 1024)), dtype=dtype,
        sample_interval_s=float(ctx.profile.get("burn_in.sample_interval_s")),
        exclude_pci=sorted(untouched))
    if not plat.cuda:
        yield _cpu_verdict(m)
        return
    yield from each_gpu(ctx, _GpuBurnJudge(ctx, m, untouched))
