"""Each GPU's PCIe link from NVML: width, generation, replays."""

from __future__ import annotations

from collections.abc import Iterator

from checks.hw.base import NotSupported
from checks.model import Result, fail, passed, warn
from checks.node.context import Context, Gpu
from checks.node.perdevice import each_gpu
from checks.node.registry import Budget, Cost, check

DRIVER = ("driver-loaded",)


@check("pcie-link", code="GPU006", title="PCIe link at full width and generation", needs=DRIVER,
       scope="gpu",
       nvml=("pcie_gen_current", "pcie_gen_max", "pcie_width_current", "pcie_width_max",
             "pcie_replay_counter", "utilization_gpu"),
       budget=Budget(value=9, cost=Cost(cpu=1, gpu=1), source="measured cpu"))
def pcie_link(ctx: Context) -> Iterator[Result]:
    """Width below the maximum fails (a x8 link halves host bandwidth). Idle GPUs downclock the
    link generation, so generation is judged by the maximum and only warned under load."""
    p = ctx.profile
    min_gen = int(p.require("pcie.min_gen"))
    replay_warn = int(p.require("pcie.replay_warn"))
    profile_gen = p.get("pcie.max_gen")

    def measure(gpu: Gpu) -> Result:
        q = gpu.handle.query
        gen, gen_max = int(q("pcie_gen_current")), int(q("pcie_gen_max"))
        width, width_max = int(q("pcie_width_current")), int(q("pcie_width_max"))
        shown = f"Gen{gen} x{width} (max Gen{gen_max} x{width_max})"
        link = {"gen": gen, "gen_max": gen_max, "width": width, "width_max": width_max}
        if width < width_max:
            return fail(f"PCIe link trained at x{width}, device supports x{width_max}: {shown}",
                        value=width, unit="lanes", expected=f"x{width_max}", details=link,
                        remedy="reseat the GPU / riser, check the slot and BIOS bifurcation "
                               "settings; persistent narrow links are a hardware fault")
        if gen_max < min_gen or (profile_gen and gen_max < int(profile_gen)):
            want = max(min_gen, int(profile_gen or 0))
            virt = ctx.hw.virtualization()
            if virt:
                # Passed through to a VM, the generation NVML reports is the virtual root port's,
                # not the physical link's (real-nodes notes): it says nothing about the GPU.
                # Width still comes from the device's own link status and is judged above.
                return passed(f"{shown}: Gen{gen_max} as this {virt} VM's virtual root port "
                              f"reports it (Gen{want} on bare metal; not judged inside a VM)",
                              value=width, unit="lanes", expected=f"x{width_max}", details=link)
            return fail(f"PCIe max generation Gen{gen_max}, expected Gen{want}: {shown}",
                        value=gen_max, expected=f"Gen{want}", details=link,
                        remedy="check BIOS PCIe speed settings and the riser/retimer")
        try:
            replays = int(q("pcie_replay_counter"))
        except NotSupported:
            replays = 0
        if replays > replay_warn:
            return warn(f"{replays} PCIe replays (link errors): {shown}", value=replays,
                        expected=f"<= {replay_warn}", details=link,
                        remedy="reseat the GPU; replays that keep rising mean a marginal link")
        try:
            busy = int(q("utilization_gpu")) > 0
        except NotSupported:
            busy = False
        if busy and gen < gen_max:
            return warn(f"GPU busy but link at Gen{gen}: {shown}", value=gen,
                        expected=f"Gen{gen_max} under load", details=link,
                        remedy="check ASPM/power settings in the BIOS")
        idle = " (idle: generation downclocked)" if gen < gen_max else ""
        return passed(f"{shown}{idle}", value=width, unit="lanes", expected=f"x{width_max}",
                      details=link)

    yield from each_gpu(ctx, measure)
