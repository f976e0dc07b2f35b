"""The scale-up fabric from NVML: each GPU's NVLinks, and on NVSwitch systems Fabric Manager with
every GPU's fabric registration."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from checks.hw.base import NotSupported
from checks.model import Result, fail, passed, skip, warn
from checks.node.context import Context, Gpu
from checks.node.perdevice import each_gpu
from checks.node.registry import Budget, Cost, check
from checks.node.suite.gpu_memory import REMEDY_RMA

DRIVER = ("driver-loaded",)


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


@check("nvlink", code="GPU010", title="NVLink links up and error counters low", needs=DRIVER,
       scope="gpu", nvml=("nvlink",),
       budget=Budget(value=9, cost=Cost(cpu=1, gpu=1), source="measured cpu"))
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
       needs=DRIVER, nvml=("fabric_info",),
       budget=Budget(value=10, cost=Cost(cpu=1, gpu=1), source="measured cpu"))
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
