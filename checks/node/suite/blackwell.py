"""Blackwell nodes (HGX B200/B300, GB200/GB300 NVL72 compute trays): what differs from Hopper.

Which checks apply comes from the profile's `blackwell:` section (profiles b200, b300,
gb200-nvl72, gb300-nvl72; sources in their comments): `platform` hgx or nvl72,
`open_module_required`, `fabric` (HGX: Fabric Manager, NVLSM, the InfiniBand modules FM needs to
reach NVLink5 switches) and `nvl72` (IMEX). On any other profile these checks SKIP.

The tray-level results publish what the fleet needs to compare trays of one NVLink domain
(cluster UUID, clique ID, IMEX node list) in `details`; checks/report/nvl72.py reads them.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from checks.hw.base import HardwareError, NotSupported
from checks.model import Result, Status, error, fail, passed, skip, warn
from checks.node.context import Context
from checks.node.registry import Budget, Cost, check

DRIVER = ("driver-loaded",)
ON_BUS = ("pci-gpus",)  # no GPU on the bus: skip with its reason
ZERO_UUID = re.compile(r"^[0-]*$")
OPEN_FLAVOUR = "Open Kernel Module"
REMEDY_OPEN = ("install the open kernel module flavour of the same driver branch (Ubuntu: "
               "nvidia-driver-<branch>-server-open / linux-modules-nvidia-<branch>-server-open-"
               "<kernel>; NVIDIA repository: nvidia-open) and reboot (make provision)")


def _section(ctx: Context) -> dict[str, Any] | None:
    section = ctx.profile.get("blackwell")
    return section if isinstance(section, dict) else None


def _not_blackwell(ctx: Context) -> Result:
    return skip(f"profile {ctx.profile.name} is not a Blackwell platform")


@check("blackwell-open-module", code="GPU030", title="Blackwell: open GPU kernel module loaded",
       stage="inventory", needs=ON_BUS,
       budget=Budget(value=10, cost=Cost(cpu=1, gpu=1), source="estimated"))
def open_module(ctx: Context) -> Iterator[Result]:
    """Blackwell GPUs run only with NVIDIA's open kernel modules (driver README): the
    proprietary nvidia.ko cannot initialise them (RmInitAdapter fails, NVML lists no GPU). The
    flavour is read from /proc/driver/nvidia/version ("NVIDIA UNIX Open Kernel Module" vs
    "NVIDIA UNIX ... Kernel Module"). Profile: blackwell.open_module_required."""
    section = _section(ctx)
    if section is None:
        yield _not_blackwell(ctx)
        return
    if not section.get("open_module_required"):
        yield skip(f"profile {ctx.profile.name} does not require the open module")
        return
    try:
        text = ctx.hw.proc_driver_version()
    except HardwareError as exc:
        yield error(f"cannot read /proc/driver/nvidia/version: {exc}")
        return
    if text is None:
        yield fail("no NVIDIA kernel module loaded (/proc/driver/nvidia/version absent)",
                   expected="open kernel module", remedy=REMEDY_OPEN)
        return
    first = text.strip().splitlines()[0] if text.strip() else ""
    if not first.startswith("NVRM version:"):
        yield error(f"cannot tell the module flavour from {first[:80]!r}")
        return
    if OPEN_FLAVOUR in first:
        yield passed(f"open kernel module: {first[len('NVRM version:'):].strip()[:90]}",
                     value="open", expected="open")
        return
    yield fail(f"proprietary kernel module loaded on {ctx.profile.description}: "
               f"{first[len('NVRM version:'):].strip()[:90]}", value="proprietary",
               expected="open", remedy=REMEDY_OPEN)


@check("blackwell-platform", code="GPU031", title="Blackwell platform from the PCI bus and DMI",
       stage="inventory", needs=ON_BUS,
       budget=Budget(value=6, cost=Cost(cpu=1, gpu=1), source="estimated"))
def platform(ctx: Context) -> Iterator[Result]:
    """Says which Blackwell platform this node is: the profile chosen from the GPUs' PCI device
    IDs, the number of GPUs on the bus against the platform's (8 on HGX, 4 on an NVL72 tray),
    and the DMI product name, which names the system builder's model. A GPU count other than the
    platform's fails (a GPU missing from the bus)."""
    section = _section(ctx)
    if section is None:
        yield _not_blackwell(ctx)
        return
    kind = str(section.get("platform", "unknown"))
    want = ctx.profile.get("gpus_per_node")
    try:
        dmi = ctx.hw.dmi_product()
    except HardwareError as exc:
        dmi = None
        dmi_note = f"DMI unreadable ({exc})"
    else:
        dmi_note = f"DMI product {dmi!r}" if dmi else "no DMI product name"
    ids = sorted({f"0x{d.device:04x}" for d in ctx.pci_gpus})
    found = len(ctx.pci_gpus)
    details = {"platform": kind, "profile": ctx.profile.name, "dmi_product": dmi,
               "pci_device_ids": ids, "gpus_on_bus": found}
    shown = (f"{ctx.profile.description}: {found} GPU(s) {', '.join(ids) or 'none'} on the PCI "
             f"bus; {dmi_note}")
    if want is not None and found != int(want):
        yield fail(f"{shown}; a {kind} node has {want}", value=found, expected=str(want),
                   details=details,
                   remedy="a GPU is missing from the PCI bus: reseat, check the baseboard/tray "
                          "power and the BMC event log; RMA if it stays missing")
        return
    # a profile without gpus_per_node (a PCIe model's) fixes no count
    expected = f"{want} GPUs" if want is not None else "a Blackwell GPU on the bus (no fixed count)"
    yield passed(shown, value=kind, expected=expected, details=details)


def _fabric_of(ctx: Context) -> tuple[dict[int, dict[str, Any]], list[Result]]:
    """Fabric info per GPU index; ERROR results for GPUs that could not be asked."""
    infos: dict[int, dict[str, Any]] = {}
    problems: list[Result] = []
    for gpu in ctx.gpus:
        if gpu.lost:
            problems.append(skip("not measured: GPU is lost (see gpu-count)", device=gpu.device))
            continue
        try:
            infos[gpu.handle.index] = dict(gpu.handle.query("fabric_info"))
        except NotSupported as exc:
            problems.append(error(f"GPU fabric info not available from this driver: {exc}",
                                  device=gpu.device,
                                  remedy="Blackwell needs driver R550+ with NVML "
                                         "nvmlDeviceGetGpuFabricInfoV; update the driver"))
        except HardwareError as exc:
            problems.append(error(f"could not read GPU fabric info: {exc}", device=gpu.device))
    return infos, problems


def _no_gpu_answers(ctx: Context) -> Result:
    """No GPU answered NVML: registration not measured (ERROR), unless there is no GPU at all."""
    if not ctx.pci_gpus:
        return skip("no NVIDIA GPU on the PCI bus")
    return error(f"{len(ctx.pci_gpus)} GPU(s) on the PCI bus, none answers NVML: fabric "
                 "registration not measured (see gpu-count)")


def _registered(info: dict[str, Any]) -> bool:
    return (info.get("state"), info.get("status")) == ("completed", "success")


@check("nvlink5-fabric", code="GPU032", title="HGX Blackwell: Fabric Manager, NVLSM, GPUs registered",
       needs=DRIVER, nvml=("fabric_info",),
       budget=Budget(value=10, cost=Cost(cpu=1, gpu=1), source="estimated"))
def nvlink5_fabric(ctx: Context) -> Iterator[Result]:
    """HGX B200/B300 NVSwitches are programmed by NVLSM (NVLink subnet manager) with Fabric
    Manager, through ConnectX management functions that need the ib_umad module; until both
    run every GPU's fabric registration stays in progress and CUDA fails with error 802
    (Fabric Manager user guide; NVIDIA/gpu-operator#2781). FAILs: a required module not loaded,
    nvidia-fabricmanager not active, any GPU not registered (state completed, status success).
    NVLSM is reported from its own unit when one is active, otherwise from the registration it
    makes possible (the FM package's start script may run it inside FM's unit)."""
    section = _section(ctx)
    if section is None or section.get("platform") != "hgx":
        yield skip(f"profile {ctx.profile.name} is not an HGX Blackwell baseboard")
        return
    fabric = section.get("fabric") or {}
    modules = [str(m) for m in fabric.get("modules") or []]
    fm_unit = str(fabric.get("unit", "nvidia-fabricmanager"))
    nvlsm_unit = str(fabric.get("nvlsm_unit", "nvlsm"))
    infos, problems = _fabric_of(ctx)
    yield from problems
    bad = any(r.status is Status.ERROR for r in problems)
    if not infos and not problems:
        bad = True
        yield _no_gpu_answers(ctx)
    loaded = ctx.hw.loaded_modules()
    missing = [m for m in modules if m not in loaded]
    if missing:
        bad = True
        yield fail(f"module(s) {', '.join(missing)} not loaded: Fabric Manager cannot reach the "
                   "NVLink5 switches (its NVL5 precheck needs /dev/infiniband/umad*)",
                   value=sorted(loaded & set(modules)), expected=", ".join(modules),
                   remedy=f"modprobe {' '.join(missing)}; list them in /etc/modules-load.d/ "
                          "(package linux-modules-extra-<kernel> on Ubuntu), then restart "
                          f"{fm_unit}")
    fm_state = ctx.hw.service_state(fm_unit)
    nvlsm_state = ctx.hw.service_state(nvlsm_unit)
    if fm_state == "unknown":
        bad = True
        yield error(f"cannot ask systemd about {fm_unit} (container: "
                    f"{ctx.hw.container() or 'no systemd'})",
                    remedy="run the quick checks on the host itself")
    elif fm_state != "active":
        bad = True
        yield fail(f"{fm_unit} is {fm_state} on an NVLink5 baseboard", value=fm_state,
                   expected="active",
                   remedy=f"install nvidia-fabricmanager and nvlsm of the driver's version, "
                          f"systemctl enable --now {fm_unit} (journalctl -u {fm_unit} shows "
                          "the NVL5 precheck)")
    for index, info in sorted(infos.items()):
        if not _registered(info):
            bad = True
            gpu = next(g for g in ctx.gpus if g.handle.index == index)
            why = ("NVLSM not running" if nvlsm_state != "active" else "registration stuck")
            yield fail(f"GPU fabric registration {info.get('state')} (status "
                       f"{info.get('status')}); {why}", value=info.get("state"),
                       expected="completed, success", device=gpu.device, details=info,
                       remedy=f"check {fm_unit} and NVLSM (nvlsm package, /var/log/nvlsm.log); "
                              "CUDA fails with error 802 until every GPU is registered")
    if bad:
        return
    how = (f"{nvlsm_unit} active" if nvlsm_state == "active"
           else f"NVLSM not a unit of its own here ({nvlsm_unit} {nvlsm_state}), run by {fm_unit}")
    yield passed(f"{fm_unit} active, {how}, modules {', '.join(modules) or 'none'} loaded; "
                 f"{len(infos)}/{len(ctx.gpus)} GPUs registered", value=fm_state,
                 expected="active, every GPU registered")


@check("nvl72-fabric", code="GPU033", title="NVL72 tray: GPUs registered in one NVLink domain",
       needs=DRIVER, nvml=("fabric_info",),
       budget=Budget(value=10, cost=Cost(cpu=1, gpu=1), source="estimated"))
def nvl72_fabric(ctx: Context) -> Iterator[Result]:
    """Every GPU of an NVL72 compute tray must have completed fabric registration with a
    non-zero cluster UUID and clique ID, the same on all GPUs of the tray: NCCL uses multi-node
    NVLink only between GPUs whose cluster UUID and clique ID both match (NVIDIA/nccl#1301).
    A GPU reporting state not_supported on an NVL72 tray is not in any NVLink domain (seen on
    GB200 trays, leptonai/gpud PR#1108) and fails. The tray's UUID and clique go into details
    for the fleet comparison across trays (checks/report/nvl72.py)."""
    section = _section(ctx)
    if section is None or section.get("platform") != "nvl72":
        yield skip(f"profile {ctx.profile.name} is not an NVL72 compute tray")
        return
    infos, problems = _fabric_of(ctx)
    yield from problems
    if not infos:
        if not problems:
            yield _no_gpu_answers(ctx)
        return
    by_index = {g.handle.index: g for g in ctx.gpus}
    bad = False
    for index, info in sorted(infos.items()):
        uuid, clique = str(info.get("cluster_uuid") or ""), int(info.get("clique_id") or 0)
        if not _registered(info):
            bad = True
            yield fail(f"GPU fabric registration {info.get('state')} (status "
                       f"{info.get('status')}): not part of the rack's NVLink domain",
                       value=info.get("state"), expected="completed, success",
                       device=by_index[index].device, details=info,
                       remedy="check the NVLink switch trays (NVOS / NMX: fabric and partition "
                              "state) and this tray's cabling; reboot the tray once the switch "
                              "side is healthy")
        elif ZERO_UUID.match(uuid) or clique == 0:
            bad = True
            yield fail(f"registered but cluster UUID {uuid or 'empty'} / clique ID {clique} "
                       "incomplete", value=clique, expected="non-zero cluster UUID and clique",
                       device=by_index[index].device, details=info,
                       remedy="the NVLink partition was not assigned: check the switch trays' "
                              "partition configuration (NMX-M)")
    pairs = {(str(i.get("cluster_uuid")), int(i.get("clique_id") or 0)) for i in infos.values()
             if _registered(i)}
    if len(pairs) > 1:
        bad = True
        yield fail(f"GPUs of one tray report {len(pairs)} different (cluster UUID, clique) pairs: "
                   + "; ".join(f"{u} / {c}" for u, c in sorted(pairs)), value=len(pairs),
                   expected="1", details={"pairs": sorted(pairs)},
                   remedy="the tray's GPUs sit in different NVLink partitions: fix the partition "
                          "on the switch trays, then reset the GPUs")
    if bad:
        return
    ((uuid, clique),) = pairs
    yield passed(f"{len(infos)}/{len(ctx.gpus)} GPUs registered, cluster UUID {uuid}, clique ID "
                 f"{clique}",
                 value=clique, expected="completed, one cluster UUID and clique",
                 details={"cluster_uuid": uuid, "clique_id": clique, "gpus": len(infos)})


@check("imex-service", code="GPU034", title="NVL72 tray: IMEX service running with its node list",
       stage="health", needs=ON_BUS,
       budget=Budget(value=9, cost=Cost(cpu=1, gpu=1), source="estimated"))
def imex_service(ctx: Context) -> Iterator[Result]:
    """Multi-node NVLink memory sharing needs nvidia-imex running on every tray of the domain
    with nodes_config.cfg listing the domain's nodes (NVIDIA IMEX guide). FAILs: the unit not
    active, the node list missing or empty. The sorted node list goes into details so the fleet
    can require one list across the domain; a systemd that cannot be asked is an ERROR."""
    section = _section(ctx)
    if section is None or section.get("platform") != "nvl72":
        yield skip(f"profile {ctx.profile.name} is not an NVL72 compute tray")
        return
    unit = str((section.get("nvl72") or {}).get("imex_unit", "nvidia-imex"))
    trays = (section.get("nvl72") or {}).get("trays_per_domain")
    try:
        nodes = ctx.hw.imex_nodes_config()
    except HardwareError as exc:
        yield error(f"cannot read the IMEX node list: {exc}")
        return
    state = ctx.hw.service_state(unit)
    listed = sorted(nodes or [])
    details = {"unit": unit, "state": state, "nodes": listed}
    if nodes is None or not listed:
        yield fail(f"IMEX node list {'missing' if nodes is None else 'empty'} "
                   "(/etc/nvidia-imex/nodes_config.cfg)", value=0, details=details,
                   expected=f"the IPs of the domain's {trays or 'N'} trays",
                   remedy="write the IP of every compute tray of the NVLink domain into "
                          f"nodes_config.cfg (the same file on every tray), restart {unit}")
        return
    if state == "unknown":
        yield error(f"cannot ask systemd about {unit} (container: "
                    f"{ctx.hw.container() or 'no systemd'})", details=details,
                    remedy="run the quick checks on the host itself")
        return
    if state != "active":
        yield fail(f"{unit} is {state} ({len(listed)} nodes configured): CUDA cannot share "
                   "memory across trays (multi-node NVLink jobs fail)", value=state,
                   expected="active", details=details,
                   remedy=f"journalctl -u {unit}; systemctl enable --now {unit} (its version "
                          "must match the driver's: package nvidia-imex-<branch>)")
        return
    if trays and len(listed) != int(trays):
        yield warn(f"{unit} active, {len(listed)} nodes configured; a full NVL72 domain has "
                   f"{trays} trays", value=len(listed), expected=str(trays), details=details,
                   remedy="fine for a partial rack or a partition; otherwise complete "
                          "nodes_config.cfg on every tray")
        return
    yield passed(f"{unit} active with {len(listed)} nodes configured", value=len(listed),
                 expected=str(trays or len(listed)), details=details)
