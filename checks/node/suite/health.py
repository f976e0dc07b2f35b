"""Per-GPU health from NVML and the kernel log (what DCGM r1 and the cloud health checks read)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from checks.hw.base import NotSupported
from checks.model import Result, fail, passed, skip, warn
from checks.node.context import Context, Gpu
from checks.node.perdevice import each_gpu
from checks.node.registry import check

DRIVER = ("driver-loaded",)
REMEDY_RMA = "drain the node and open an RMA for this GPU (quote serial and the fault code)"


@check("persistence-mode", code="GPU001", title="persistence mode on", needs=DRIVER)
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


@check("ecc-errors", code="GPU002", title="ECC enabled, no uncorrectable errors", needs=DRIVER)
def ecc_errors(ctx: Context) -> Iterator[Result]:
    """Volatile (since boot) uncorrectable ECC errors fail. Where NVML splits counts by location
    (Ampere+), correctable counts are judged per location (SRAM ecc.sram_corrected_warn, DRAM
    ecc.dram_corrected_warn) and aggregate SRAM uncorrectable errors warn (they cannot be
    remapped); otherwise volatile/aggregate totals are judged. The lifetime (aggregate)
    uncorrectable count is always reported."""
    p = ctx.profile

    def measure(gpu: Gpu) -> Result:
        q = gpu.handle.query
        if not q("ecc_mode"):
            if p.get("ecc.required"):
                return warn("ECC is disabled", value=False, expected="enabled",
                            remedy="nvidia-smi -e 1 and reboot (datacenter GPUs train with ECC on)")
            return passed("ECC disabled (not required by the profile)", value=False)
        vol_unc = int(q("ecc_volatile_uncorrected"))
        vol_cor = int(q("ecc_volatile_corrected"))
        agg_cor = int(q("ecc_aggregate_corrected"))
        counts: dict[str, Any] = {"volatile_uncorrected": vol_unc, "volatile_corrected": vol_cor,
                                  "aggregate_corrected": agg_cor}
        try:
            agg_unc: int | None = int(q("ecc_aggregate_uncorrected"))
            counts["aggregate_uncorrected"] = agg_unc
        except NotSupported:
            agg_unc = None
        try:
            by_location = dict(q("ecc_by_location"))
            counts["by_location"] = by_location
        except NotSupported:
            by_location = {}
        lifetime = "" if agg_unc is None else f", {agg_unc} uncorrectable lifetime"
        limit = int(p.require("ecc.volatile_uncorrected_max"))
        if vol_unc > limit:
            where = ", ".join(f"{loc.upper()} {c.get('volatile_uncorrected', 0)}"
                              for loc, c in sorted(by_location.items())
                              if c.get("volatile_uncorrected"))
            return fail(f"{vol_unc} uncorrectable ECC error(s) since boot"
                        + (f" ({where})" if where else "") + lifetime, value=vol_unc,
                        expected=f"<= {limit}", details=counts,
                        remedy="drain the node; reset the GPU (nvidia-smi -r) to trigger row "
                               "remapping, re-run; if errors return, " + REMEDY_RMA)
        if by_location:
            sram, dram = by_location.get("sram", {}), by_location.get("dram", {})
            sram_warn = int(p.require("ecc.sram_corrected_warn"))
            dram_warn = int(p.require("ecc.dram_corrected_warn"))
            sram_cor = int(sram.get("aggregate_corrected", sram.get("volatile_corrected", 0)))
            dram_cor = int(dram.get("aggregate_corrected", dram.get("volatile_corrected", 0)))
            sram_unc = int(sram.get("aggregate_uncorrected", 0))
            shown = f"SRAM {sram_cor} / DRAM {dram_cor} correctable{lifetime}"
            if sram_unc > int(p.require("ecc.sram_uncorrected_warn")):
                return warn(f"{sram_unc} uncorrectable SRAM error(s) over the GPU's life; "
                            f"{shown}", value=sram_unc, details=counts,
                            expected=f"SRAM uncorrectable <= {p.require('ecc.sram_uncorrected_warn')}",
                            remedy="SRAM errors cannot be remapped: watch the count; " + REMEDY_RMA)
            if sram_cor > sram_warn or dram_cor > dram_warn:
                return warn(f"high correctable ECC counts: {shown}", value=max(sram_cor, dram_cor),
                            expected=f"SRAM <= {sram_warn}, DRAM <= {dram_warn}", details=counts,
                            remedy="watch the trend; plan an RMA if it keeps rising")
            return passed(f"ECC on, 0 uncorrectable since boot; {shown}", value=vol_unc,
                          expected=f"<= {limit} uncorrectable", details=counts)
        vol_warn, agg_warn = int(p.require("ecc.volatile_corrected_warn")), int(
            p.require("ecc.aggregate_corrected_warn"))
        if vol_cor > vol_warn or agg_cor > agg_warn:
            return warn(f"high correctable ECC counts (volatile {vol_cor}, aggregate {agg_cor})"
                        + lifetime, value=vol_cor,
                        expected=f"volatile <= {vol_warn}, aggregate <= {agg_warn}",
                        details=counts, remedy="watch the trend; plan an RMA if it keeps rising")
        return passed(f"ECC on, 0 uncorrectable, {vol_cor} correctable since boot{lifetime}",
                      value=vol_unc, expected=f"<= {limit} uncorrectable", details=counts)

    yield from each_gpu(ctx, measure)


@check("retired-pages", code="GPU003", title="retired memory pages (pre-Ampere GPUs)",
       needs=DRIVER)
def retired_pages(ctx: Context) -> Iterator[Result]:
    """Pages retired for ECC errors; pending retirement or more than retired_pages.max fails.
    Ampere and newer remap rows instead (see row-remap) and report SKIP here."""
    limit = int(ctx.profile.require("retired_pages.max"))

    def measure(gpu: Gpu) -> Result:
        q = gpu.handle.query
        sbe, dbe, pending = int(q("retired_pages_sbe")), int(q("retired_pages_dbe")), bool(
            q("retired_pages_pending"))
        total = sbe + dbe
        if pending:
            return fail(f"page retirement pending ({total} retired)", value=total,
                        remedy="reset the GPU or reboot to apply the retirement, then re-verify")
        if total > limit:
            return fail(f"{total} retired pages ({dbe} double-bit)", value=total,
                        expected=f"<= {limit}", remedy=REMEDY_RMA)
        return passed(f"{total} retired pages", value=total, expected=f"<= {limit}")

    yield from each_gpu(ctx, measure)


@check("row-remap", code="GPU004", title="row remapping: nothing pending or failed", needs=DRIVER)
def row_remap(ctx: Context) -> Iterator[Result]:
    """Ampere+ remap HBM rows after memory errors. NVIDIA's GPU memory error management guide: a
    remap takes effect at the next GPU reset, and while it is pending unaffected workloads go on
    and new ones can start (error containment keeps the bad row out of use); a remapping failure
    is an RMA condition. So: a failure fails with RMA; a pending remap with uncorrectable remaps
    counted fails (reset the GPU); one pending for correctable errors only warns (reset at the next
    idle window); without anything pending, uncorrectable remaps from row_remap.uncorrectable_warn
    on warn."""
    warn_at = int(ctx.profile.require("row_remap.uncorrectable_warn"))

    def measure(gpu: Gpu) -> Result:
        rows = gpu.handle.query("remapped_rows")
        corr, unc = int(rows.get("correctable", 0)), int(rows.get("uncorrectable", 0))
        counted = f"{unc} uncorrectable, {corr} correctable rows remapped"
        if rows.get("failed"):
            return fail(f"row remapping failed ({counted}): a bank ran out of spare rows, the "
                        "memory can no longer be repaired", value=rows,
                        expected="no remapping failure", remedy=REMEDY_RMA)
        if rows.get("pending") and unc:
            return fail(f"row remap pending after uncorrectable errors ({counted}); it takes "
                        "effect at the next GPU reset", value=rows, expected="no remap pending",
                        remedy="stop the jobs on this GPU and reset it (nvidia-smi -r -i N) or "
                               "reboot, then re-verify that nothing is pending")
        if rows.get("pending"):
            return warn(f"row remap pending for correctable errors only ({counted}); it takes "
                        "effect at the next GPU reset, workloads go on meanwhile", value=rows,
                        expected="no remap pending",
                        remedy="reset the GPU at its next idle window (nvidia-smi -r -i N), then "
                               "re-verify that nothing is pending")
        if unc >= warn_at:
            return warn(f"{unc} rows remapped for uncorrectable errors", value=rows,
                        expected=f"< {warn_at}",
                        remedy="watch the trend; RMA if remaps keep growing")
        return passed(f"no remap pending ({corr} correctable, {unc} uncorrectable remapped)",
                      value=rows)

    yield from each_gpu(ctx, measure)


@check("pcie-link", code="GPU006", title="PCIe link at full width and generation", needs=DRIVER)
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


# NVML clock event reason bits (nvmlClocksEventReason*).
THROTTLE_BAD = {0x8: "HW slowdown", 0x20: "SW thermal slowdown", 0x40: "HW thermal slowdown",
                0x80: "HW power brake"}
THROTTLE_INFO = {0x1: "idle", 0x2: "application clocks", 0x4: "SW power cap", 0x10: "sync boost",
                 0x100: "display clock"}


@check("clock-throttle", code="GPU007", title="no thermal or hardware clock slowdown",
       needs=DRIVER)
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
       needs=DRIVER)
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


@check("gpu-power", code="GPU009", title="power limit not capped", needs=DRIVER)
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


@dataclass(frozen=True)
class _LinkExpectation:
    """What one GPU's NVLinks must show: `links` up (a number, with why), nothing (skip, why),
    or one of two warnings: SXM GPUs with no fabric at all, or some links up and no profile
    figure to judge them by."""

    links: int | None
    why: str
    warning: str | None = None  # "no-fabric" or "unknown-count"


@dataclass(frozen=True)
class _NvlinkSetting:
    expected_links: int | None
    bridge_links: int | None
    stated: int | None
    switches: int
    peers: int

    def expect(self, links: list[dict[str, Any]]) -> _LinkExpectation:
        if self.stated is not None:
            return _LinkExpectation(self.stated or None, f"--expect-nvlink {self.stated}")
        active = sum(1 for lk in links if lk["active"])
        if self.bridge_links:
            if active == 0:
                return _LinkExpectation(None, "no NVLink bridge fitted (PCIe card, all links inactive)")
            return _LinkExpectation(int(self.bridge_links),
                                    f"NVLink bridge: {self.bridge_links} links per card")
        if self.expected_links:
            if self.switches or active:
                return _LinkExpectation(int(self.expected_links),
                                        f"{self.switches} NVSwitch(es) on the bus" if self.switches
                                        else "links in use")
            if self.peers <= 1:
                return _LinkExpectation(None, "one GPU and no NVSwitch on the PCI bus (a GPU passed "
                                              "through alone, e.g. a VM slice): NVLink has no peer")
            return _LinkExpectation(None, "", warning="no-fabric")
        if active and active < len(links):
            return _LinkExpectation(None, "", warning="unknown-count")
        return _LinkExpectation(active or None, "links in use" if active else "no link in use")


def _judge_links(gpu: Gpu, setting: _NvlinkSetting, profile: str, error_warn: int) -> Result:
    try:
        links = gpu.handle.query("nvlink")
    except NotSupported:
        links = []
    want = setting.expect(links)
    active = [lk["link"] for lk in links if lk["active"]]
    if want.warning == "no-fabric":
        return warn(f"{setting.peers} SXM GPUs, no NVSwitch on the PCI bus and no NVLink active: "
                    "GPU-to-GPU traffic goes over PCIe", value=0,
                    expected=f"{setting.expected_links} links",
                    remedy="on bare metal: Fabric Manager, NVSwitch baseboard and driver; in "
                           "a VM: the instance type may not include NVLink")
    if want.warning == "unknown-count":
        return warn(f"{len(active)} of {len(links)} NVLink links active and profile "
                    f"{profile} does not say how many to expect", value=len(active),
                    remedy="pass --profile for this model, or add one")
    if want.links is None:
        return skip(want.why, value=len(active))
    if not links:
        return fail(f"NVLink not supported/reported, {want.links} links expected ({want.why})",
                    value=0, expected=str(want.links),
                    remedy="check the driver and Fabric Manager; reboot")
    if len(active) < want.links:
        down = [lk["link"] for lk in links if not lk["active"]][: want.links - len(active)]
        return fail(f"{len(active)} of {want.links} NVLink links up ({want.why}; down: "
                    f"{', '.join(map(str, down)) or 'missing'})", value=len(active),
                    expected=str(want.links), details={"down": down},
                    remedy="reset the GPU or reboot; a link that stays down is a baseboard, "
                           "bridge or GPU fault: " + REMEDY_RMA)
    noisy = {lk["link"]: lk["errors"] for lk in links
             if any(v > error_warn for v in lk["errors"].values())}
    if noisy:
        return warn(f"NVLink error counters above {error_warn} on links "
                    f"{', '.join(map(str, noisy))}", value=len(active), details=noisy,
                    remedy="watch the trend; rising replay/CRC counts mean a marginal link")
    return passed(f"{len(active)}/{want.links} links up ({want.why}), counters low",
                  value=len(active), expected=str(want.links))


@check("nvlink", code="GPU010", title="NVLink links up and error counters low", needs=DRIVER)
def nvlink(ctx: Context) -> Iterator[Result]:
    """How many links must be up comes from what the node is: SXM parts (profile nvlink.links)
    on a baseboard whose NVSwitches are on the bus, or whose links are in use, need all of
    them; a lone SXM GPU passed through to a VM (no NVSwitch, no active link) has no NVLink
    peer; a PCIe card with an NVLink bridge (profile nvlink.bridge_links) needs every bridge
    link once any is up, and an unbridged card needs none. Replay/recovery/CRC counters above
    nvlink.error_warn warn."""
    p = ctx.profile
    setting = _NvlinkSetting(expected_links=p.get("nvlink.links"), bridge_links=p.get("nvlink.bridge_links"),
                             stated=ctx.options.expect_nvlink, switches=len(ctx.nvswitches),
                             peers=len([g for g in ctx.gpus if not g.lost]))
    error_warn = int(p.require("nvlink.error_warn"))
    if setting.expected_links == 0 and not setting.bridge_links and not setting.stated:
        yield skip(f"profile {p.name} has no NVLink")
        return
    yield from each_gpu(ctx, lambda gpu: _judge_links(gpu, setting, p.name, error_warn))


FABRIC_DONE = ("completed", "success")


def _fabric(gpu: Gpu) -> dict[str, Any] | None:
    try:
        return dict(gpu.handle.query("fabric_info"))
    except NotSupported:
        return None


@check("fabric-manager", code="GPU011", title="NVSwitch fabric: Fabric Manager and GPU registration",
       needs=DRIVER)
def fabric_manager(ctx: Context) -> Iterator[Result]:
    """On NVSwitch systems every GPU must have completed fabric registration (NVML
    GpuFabricInfo), nvidia-fabricmanager must be active and of the driver's exact version, or
    CUDA fails with error 802. Without NVSwitch on the bus it SKIPs, unless the driver reports a
    fabric registration in progress (shared-NVSwitch VMs). A unit that cannot be asked (no
    systemd in a container) is judged by the registration state alone."""
    switches = ctx.nvswitches
    gpus = [g for g in ctx.gpus if not g.lost]
    fabric = {g.device.index: _fabric(g) for g in gpus}
    registering = {i: f for i, f in fabric.items() if f and f.get("state") != "not_supported"}
    if not switches and not registering:
        yield skip("no NVSwitch on the PCI bus and no GPU in an NVLink fabric")
        return
    problems = False
    for gpu in gpus:
        info = fabric.get(gpu.device.index)
        if info is None or info.get("state") == "not_supported":
            continue
        state, status = info.get("state"), info.get("status")
        if (state, status) != FABRIC_DONE:
            problems = True
            yield fail(f"GPU fabric registration {state} (status {status})", value=state,
                       expected="completed, success", device=gpu.device, details=info,
                       remedy="check nvidia-fabricmanager (journalctl -u nvidia-fabricmanager); "
                              "restart it, or reboot; CUDA fails with error 802 until it completes")
    driver = ctx.hw.nvml().driver_version()
    state = ctx.hw.service_state("nvidia-fabricmanager")
    version = ctx.hw.fabric_manager_version()
    where = f"{len(switches)} NVSwitch(es)" if switches else "a fabric-registered GPU"
    if state == "unknown":
        if not registering:
            problems = True
            yield warn(f"cannot ask systemd about nvidia-fabricmanager (container: "
                       f"{ctx.hw.container() or 'no systemd'}) and the driver reports no fabric "
                       f"state, with {where}", value=state,
                       remedy="run the quick checks on the host itself to judge Fabric Manager")
    elif state != "active" and switches:
        problems = True
        yield fail(f"nvidia-fabricmanager is {state} with {where}", value=state,
                   expected="active",
                   remedy="install nvidia-fabricmanager of the driver's exact version and "
                          "systemctl enable --now nvidia-fabricmanager (make provision)")
    if version is not None and version != driver:
        problems = True
        yield fail(f"Fabric Manager {version} != driver {driver}", value=version, expected=driver,
                   remedy="install the Fabric Manager package of the driver's exact version and "
                          "hold both (make provision); a mismatch stops FM from starting")
    if problems:
        return
    registered = f"{len(registering)}/{len(gpus)} GPUs registered" if registering else \
        "registration state not reported"
    unit = "unit not visible here" if state == "unknown" else f"nvidia-fabricmanager {state}"
    ver = f", version {version}" if version else ""
    yield passed(f"{unit}{ver} with {where}; {registered}", value=state,
                 expected=f"active, version {driver}")


@check("compute-mode", code="GPU020", title="compute mode lets training processes in",
       needs=DRIVER)
def compute_mode(ctx: Context) -> Iterator[Result]:
    """PROHIBITED admits no CUDA context (nothing can train) and fails. EXCLUSIVE_PROCESS
    admits one process per GPU: training with one rank per GPU works, tools that open a second
    context on a GPU do not, so it is reported (WARN) and the workload checks keep to one
    process per GPU. DEFAULT passes."""

    def measure(gpu: Gpu) -> Result:
        mode = str(gpu.handle.query("compute_mode"))
        if mode == "prohibited":
            return fail("compute mode PROHIBITED: no process can use this GPU", value=mode,
                        expected="default",
                        remedy="nvidia-smi -i N -c DEFAULT (and find what set it: a scheduler "
                               "prolog, or an administrator taking the GPU out of service)")
        if mode == "exclusive_process":
            return warn("compute mode EXCLUSIVE_PROCESS: one process per GPU", value=mode,
                        expected="default",
                        remedy="fine for one rank per GPU; set DEFAULT (nvidia-smi -c 0) for "
                               "jobs that share a GPU or run monitoring tools with a context")
        return passed(f"compute mode {mode.upper()}", value=mode, expected="default")

    yield from each_gpu(ctx, measure)


# What to do for each action NVML names (nvml.h, nvmlGpuRecoveryAction_t; NVIDIA's XID catalog
# gives the same remedies per XID). Anything but "none" means the GPU is not fit for work now.
RECOVERY_REMEDIES = {
    "gpu_reset": "stop the GPU's processes, then reset it: sudo nvidia-smi -r -i N",
    "bus_reset": "stop the GPU's processes, then reset it (a bus reset): sudo nvidia-smi -r -i N",
    "node_reboot": "drain the node and reboot it",
    "system_reboot": "drain the node and power-cycle it (a warm reboot is not enough)",
    "drain_p2p": "stop the jobs that use peer-to-peer/NVLink traffic on this GPU (drain), then "
                 "check again; reset the GPU if the action stays",
    "drain_and_reset": "drain the node's jobs, then reset the GPU: sudo nvidia-smi -r -i N",
    "recover_imex_domain": "recover the NVLink domain: restart nvidia-imex on the domain's nodes",
}


@check("gpu-recovery-action", code="GPU015", title="the driver asks for no GPU reset or reboot",
       needs=DRIVER)
def gpu_recovery_action(ctx: Context) -> Iterator[Result]:
    """NVML's recovery action for each GPU (nvmlDeviceGetFieldValues,
    NVML_FI_DEV_GET_GPU_RECOVERY_ACTION): NONE passes; GPU_RESET, BUS_RESET, NODE_REBOOT,
    SYSTEM_REBOOT, DRAIN_P2P, DRAIN_AND_RESET and RECOVER_IMEX_DOMAIN FAIL with that remedy,
    whether or not an XID line reached the kernel log; a value this tool does not know WARNs.
    A driver before the field answers through the two fields it replaced (reset required,
    drain and reset recommended: GPU_RESET / DRAIN_AND_RESET); one with none of them SKIPs."""

    def measure(gpu: Gpu) -> Result:
        action = str(gpu.handle.query("recovery_action"))
        if action == "none":
            return passed("the driver asks for no recovery action", value=action,
                          expected="none")
        remedy = RECOVERY_REMEDIES.get(action)
        if remedy is None:
            return warn(f"the driver reports recovery action {action}, which this tool does "
                        "not know", value=action, expected="none",
                        remedy="see nvidia-smi -q and NVIDIA's XID catalog for the action")
        return fail(f"the driver says this GPU needs {action.upper()}", value=action,
                    expected="none", remedy=remedy)

    yield from each_gpu(ctx, measure)


@check("mig-mode", code="GPU012", title="MIG mode as expected", needs=DRIVER)
def mig_mode(ctx: Context) -> Iterator[Result]:
    """Training nodes normally run with MIG off (profile mig.expected)."""
    expected = bool(ctx.profile.get("mig.expected"))

    def measure(gpu: Gpu) -> Result:
        enabled = bool(gpu.handle.query("mig_mode"))
        shown = "enabled" if enabled else "disabled"
        if enabled != expected:
            return warn(f"MIG {shown}, expected {'enabled' if expected else 'disabled'}",
                        value=enabled, remedy="nvidia-smi -mig 0 (or 1) and reset the GPU")
        return passed(f"MIG {shown}", value=enabled)

    yield from each_gpu(ctx, measure)
