"""How the driver keeps each GPU between jobs: persistence mode (NVML, one result per GPU)."""

from __future__ import annotations

from collections.abc import Iterator

from checks.model import Result, passed, warn
from checks.node.context import Context, Gpu
from checks.node.perdevice import each_gpu
from checks.node.registry import Budget, Cost, check

DRIVER = ("driver-loaded",)


@check("persistence-mode", code="GPU001", title="persistence mode on", needs=DRIVER,
       scope="gpu", nvml=("persistence_mode",),
       budget=Budget(value=6, cost=Cost(cpu=1, gpu=1), source="measured cpu"))
def persistence_mode(ctx: Context) -> Iterator[Result]:
    """Without persistence the driver tears down and re-initialises GPUs between jobs (slow
    starts, lost state). Profile: persistence.required."""
    required = bool(ctx.profile.get("persistence.required"))

    def measure(gpu: Gpu) -> Result:
        on = gpu.handle.query("persistence_mode")
        if not on and required:
            return warn("persistence mode is off", value=False, expected="on",
                        remedy="systemctl enable --now nvidia-persistenced (make provision)")
        return passed(f"persistence mode {'on' if on else 'off'}", value=bool(on))

    yield from each_gpu(ctx, measure)
