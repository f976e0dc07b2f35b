"""Clocks, temperature and power from NVML, one result per GPU: what slows a GPU without an error."""

from __future__ import annotations

from collections.abc import Iterator

from checks.hw.base import NotSupported
from checks.model import Result, fail, passed, warn
from checks.node.context import Context, Gpu
from checks.node.perdevice import each_gpu
from checks.node.registry import Budget, Cost, check

DRIVER = ("driver-loaded",)


# NVML clock event reason bits (nvmlClocksEventReason*).
THROTTLE_BAD = {0x8: "HW slowdown", 0x20: "SW thermal slowdown", 0x40: "HW thermal slowdown",
                0x80: "HW power brake"}
THROTTLE_INFO = {0x1: "idle", 0x2: "application clocks", 0x4: "SW power cap", 0x10: "sync boost",
                 0x100: "display clock"}


@check("clock-throttle", code="GPU007", title="no thermal or hardware clock slowdown",
       needs=DRIVER, scope="gpu", nvml=("clock_event_reasons",),
       budget=Budget(value=8, cost=Cost(cpu=1, gpu=1), source="measured cpu"))
def clock_throttle(ctx: Context) -> Iterator[Result]:
    """Clock event reasons: thermal, HW slowdown and power brake fail; idle and the software
    power cap are normal."""

    def measure(gpu: Gpu) -> Result:
        reasons = int(gpu.handle.query("clock_event_reasons"))
        bad = [name for bit, name in THROTTLE_BAD.items() if reasons & bit]
        info = [name for bit, name in THROTTLE_INFO.items() if reasons & bit]
        if bad:
            return fail(f"clocks throttled: {', '.join(bad)} (reasons 0x{reasons:x})",
                        value=f"0x{reasons:x}", expected="no thermal/HW slowdown",
                        remedy="check cooling (fans, airflow, inlet temperature) and power "
                               "supply; HW slowdown with normal temperature points at the board")
        return passed(f"no slowdown ({', '.join(info) or 'running at full clocks'})",
                      value=f"0x{reasons:x}")

    yield from each_gpu(ctx, measure)


@check("gpu-temperature", code="GPU008", title="GPU temperature below the slowdown threshold",
       needs=DRIVER, scope="gpu", nvml=("temperature_c", "temperature_slowdown_c"),
       budget=Budget(value=7, cost=Cost(cpu=1, gpu=1), source="measured cpu"))
def gpu_temperature(ctx: Context) -> Iterator[Result]:
    """At or above NVML's slowdown threshold fails; within thermal.slowdown_margin_c warns."""
    margin = int(ctx.profile.require("thermal.slowdown_margin_c"))

    def measure(gpu: Gpu) -> Result:
        temp, slowdown = int(gpu.handle.query("temperature_c")), int(
            gpu.handle.query("temperature_slowdown_c"))
        expected = f"< {slowdown - margin} C (slowdown {slowdown} C)"
        if temp >= slowdown:
            return fail(f"{temp} C, at or above the slowdown threshold {slowdown} C", value=temp,
                        unit="C", expected=expected,
                        remedy="check fans, airflow and inlet temperature; drain until cooled")
        if temp >= slowdown - margin:
            return warn(f"{temp} C, within {margin} C of slowdown", value=temp, unit="C",
                        expected=expected, remedy="check cooling")
        return passed(f"{temp} C", value=temp, unit="C", expected=expected)

    yield from each_gpu(ctx, measure)


@check("gpu-power", code="GPU009", title="power limit not capped", needs=DRIVER,
       scope="gpu", nvml=("power_w", "power_limit_w", "power_default_limit_w"),
       budget=Budget(value=6, cost=Cost(cpu=1, gpu=1), source="measured cpu"))
def gpu_power(ctx: Context) -> Iterator[Result]:
    """An enforced power limit below power.min_limit_fraction of the default (or of the
    profile's power.default_limit_w) slows training without any error."""
    fraction = float(ctx.profile.require("power.min_limit_fraction"))
    profile_default = ctx.profile.get("power.default_limit_w")

    def measure(gpu: Gpu) -> Result:
        q = gpu.handle.query
        limit, draw = float(q("power_limit_w")), float(q("power_w"))
        try:
            default = float(q("power_default_limit_w"))
        except NotSupported:
            if profile_default is None:
                raise
            default = float(profile_default)
        expected = f">= {fraction * default:.0f} W (default {default:.0f} W)"
        if limit < fraction * default:
            return warn(f"power limit {limit:.0f} W is below the default {default:.0f} W",
                        value=limit, unit="W", expected=expected,
                        remedy="nvidia-smi -pl <default> (or remove the cap set by a script)")
        return passed(f"limit {limit:.0f} W, drawing {draw:.0f} W", value=limit, unit="W",
                      expected=expected)

    yield from each_gpu(ctx, measure)
