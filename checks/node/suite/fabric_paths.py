"""Multi-node readiness between each GPU and its NIC: GPUDirect RDMA (peer memory or dma-buf)
and ACS redirect off on the PCIe path between them."""

from __future__ import annotations

import re

from checks.hw.base import HardwareError, PciDevice, RdmaDevice
from checks.model import Device, Result, error, fail, passed, skip, warn
from checks.node.context import Context
from checks.node.registry import Budget, Cost, check
from checks.node.suite.fabric_links import NO_RDMA, compute_nics, rails_map, rdma_of

# ACS Control bits (PCIe base spec 7.7.8.3) that send peer-to-peer traffic up to the root
# complex instead of across the switch: P2P Request Redirect, P2P Completion Redirect,
# P2P Egress Control. NVIDIA/nccl#2079, #606: ACS on between a GPU and its NIC breaks P2P and
# GPUDirect RDMA and can hang NCCL; NCCL's troubleshooting guide asks for ACS off on bare metal.
ACS_REDIRECT_BITS = {0x04: "ReqRedir", 0x08: "CmpltRedir", 0x20: "EgressCtrl"}

def _kernel_at_least(release: str, major: int, minor: int) -> bool:
    match = re.match(r"(\d+)\.(\d+)", release)
    if match is None:
        return False
    return (int(match.group(1)), int(match.group(2))) >= (major, minor)


@check("gpudirect-rdma", code="NET005", title="GPUDirect RDMA available (peer memory or dma-buf)",
       stage="health", tags=("fabric",),
       budget=Budget(value=9, cost=Cost(cpu=1, gpu=1), source="estimated"))
def gpudirect_rdma(ctx: Context) -> Result:
    """Where GPUs and RDMA devices meet, NCCL needs a GPU memory path for the NIC: the
    nvidia_peermem module registered with the RDMA core (/sys/kernel/mm/memory_peers/nv_mem),
    or dma-buf (open kernel module and kernel >= 5.12). Without it NCCL prints "GPU Direct RDMA
    Disabled" and 2-node all-reduce drops from ~180 to ~10 GB/s (NVIDIA/nccl#1676); loaded but
    not registered is NVIDIA/nccl#1939."""
    devices = rdma_of(ctx)
    if not devices:
        return skip(NO_RDMA)
    if not ctx.pci_gpus:
        return skip("no NVIDIA GPU on the PCI bus: GPUDirect RDMA does not apply")
    modules = ctx.hw.loaded_modules()
    peermem = sorted(m for m in ("nvidia_peermem", "nv_peer_mem") if m in modules)
    peers = ctx.hw.memory_peers() or []
    proc = ctx.hw.proc_driver_version() or ""
    kernel = ctx.hw.kernel_release()
    dmabuf = "Open Kernel Module" in proc and _kernel_at_least(kernel, 5, 12)
    details = {"peer_memory_modules": peermem, "memory_peers": ctx.hw.memory_peers(),
               "dmabuf_possible": dmabuf,
               "kernel": kernel, "open_kernel_module": "Open Kernel Module" in proc}
    registered = bool(peers) and any(p.startswith("nv_mem") for p in peers)
    remedy = ("load the peer-memory module at boot (`modprobe nvidia-peermem`, "
              "/etc/modules-load.d/), rebuilt against the installed RDMA stack, or use the open "
              "GPU kernel module on kernel >= 5.12 for dma-buf; NCCL >= 2.23 is needed to see "
              "nvidia-peermem when nv_peer_mem was renamed (nccl#1676)")
    if peermem and registered:
        return passed(f"{peermem[0]} loaded and registered (memory_peers: {', '.join(peers)})",
                      value=peermem[0], details=details)
    if peermem:
        text = (f"{peermem[0]} is loaded but not registered with the RDMA core "
                f"(/sys/kernel/mm/memory_peers {'has no nv_mem' if peers else 'missing or empty'})")
        if dmabuf:
            return warn(f"{text}; dma-buf may still carry GPUDirect (open module, kernel "
                        f"{kernel}): confirm GDRDMA with the nccl-transport check",
                        value="dma-buf?", details=details, remedy=remedy)
        return fail(f"{text}: NCCL will run without GPUDirect RDMA", value="none",
                    details=details, remedy=remedy)
    if dmabuf:
        return passed(f"dma-buf path available (open kernel module, kernel {kernel}); no "
                      "peer-memory module loaded", value="dma-buf", details=details)
    return fail("no GPUDirect RDMA path: nvidia_peermem not loaded and no dma-buf support "
                f"(proprietary kernel module or kernel {kernel} < 5.12)", value="none",
                expected="nvidia_peermem registered, or dma-buf", details=details, remedy=remedy)


def _bridges_between(gpu: PciDevice, nic: RdmaDevice) -> list[str]:
    """Bridges on the path from a GPU to a NIC, from the last one they share downward."""
    common = 0
    for a, b in zip(gpu.pci_path, nic.pci_path, strict=False):
        if a != b:
            break
        common += 1
    start = max(common - 1, 0)
    out: list[str] = []
    for bridge in [*gpu.pci_path[start:], *nic.pci_path[start:]]:
        if bridge not in out:
            out.append(bridge)
    return out


@check("pcie-acs", code="NET006", title="ACS redirect off between each GPU and its NIC",
       stage="health", tags=("fabric",),
       # config-space reads of every bridge on the GPU-NIC path
       budget=Budget(value=7, cost=Cost(cpu=1, gpu=2), source="estimated"))
def pcie_acs(ctx: Context) -> list[Result]:
    """ACS P2P redirect on a PCIe bridge between a GPU and its nearest NIC sends GPUDirect
    traffic through the root complex: slow, and NCCL can hang (nccl#2079, #606). FAIL on bare
    metal; inside a VM ACS is how the hypervisor isolates devices, so it is reported, not
    failed. ERROR when the config space cannot be read (it needs root)."""
    devices = rdma_of(ctx)
    if not devices:
        return [skip(NO_RDMA)]
    if not ctx.pci_gpus:
        return [skip("no NVIDIA GPU on the PCI bus: no GPU-NIC path to check")]
    virt = ctx.hw.virtualization()
    nics = {n.name: n for n in compute_nics(ctx, devices)}
    results = []
    for rail, gpu in zip(rails_map(ctx, list(nics.values())), ctx.pci_gpus, strict=True):
        if rail.nic is None:
            continue
        nic = nics[rail.nic]
        bridges = _bridges_between(gpu, nic) if gpu.pci_path and nic.pci_path else []
        kw = {"device": Device(name=rail.gpu, pci=gpu.address)}
        if not bridges:
            results.append(skip(f"{rail.gpu} -> {rail.nic}: no PCI bridge known between them "
                                "(no topology path)", **kw))
            continue
        enabled, unreadable = {}, []
        for bridge in bridges:
            try:
                control = ctx.hw.pci_acs_control(bridge)
            except HardwareError as exc:
                unreadable.append(f"{bridge} ({exc})")
                continue
            bits = [name for bit, name in ACS_REDIRECT_BITS.items() if control and control & bit]
            if bits:
                enabled[bridge] = bits
        details = {"nic": rail.nic, "bridges": bridges,
                   "acs_redirect": enabled, "unreadable": unreadable}
        path = f"{rail.gpu} -> {rail.nic} via {len(bridges)} bridge(s)"
        if enabled:
            text = "; ".join(f"{b}: {'+ '.join(v)}+" for b, v in enabled.items())
            if virt:
                results.append(passed(f"{path}: ACS redirect on ({text}), expected inside a "
                                      f"{virt} VM", details=details, **kw))
            else:
                results.append(fail(f"{path}: ACS redirect enabled on {text}", details=details,
                                    value=sorted(enabled), expected="ACS redirect off",
                                    remedy="disable ACS in the BIOS (PCIe ACS / 'ACS Control'), "
                                           "or at boot: setpci -s <bridge> ECAP_ACS+6.w=0000 "
                                           "for each bridge named (bare metal only)", **kw))
        elif unreadable:
            results.append(error(f"{path}: ACS control not readable on "
                                 f"{'; '.join(unreadable)}", details=details, **kw))
        else:
            results.append(passed(f"{path}: ACS redirect off", details=details, **kw))
    return results or [skip("no GPU has a compute NIC to check")]
