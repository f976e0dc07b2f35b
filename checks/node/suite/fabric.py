"""Multi-node readiness: RDMA ports, firmware, error counters, rails, GPUDirect, ACS, the NCCL
environment, and (after the collective check) the transport NCCL really used.

Most multi-node failures are in the fabric, not the GPUs (issue 11). Every check here SKIPs with
the reason on a host without RDMA devices, except the NCCL environment lint, which matters on
any GPU host. Thresholds: profile `rdma:` and `nccl:` sections; sources in generic.yaml and
docs/multinode.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from checks.hw.base import HardwareError, PciDevice, RdmaDevice, RdmaPort
from checks.hw.measure.nccl_log import NcclLog
from checks.model import Device, Result, error, fail, passed, skip, warn
from checks.node import workload_plan as plan
from checks.node.context import Context
from checks.node.registry import check
from checks.report_schema import env_value

NO_RDMA = "no RDMA devices (/sys/class/infiniband is empty or absent): no RDMA fabric to check"
# ACS Control bits (PCIe base spec 7.7.8.3) that send peer-to-peer traffic up to the root
# complex instead of across the switch: P2P Request Redirect, P2P Completion Redirect,
# P2P Egress Control. NVIDIA/nccl#2079, #606: ACS on between a GPU and its NIC breaks P2P and
# GPUDirect RDMA and can hang NCCL; NCCL's troubleshooting guide asks for ACS off on bare metal.
ACS_REDIRECT_BITS = {0x04: "ReqRedir", 0x08: "CmpltRedir", 0x20: "EgressCtrl"}
AFFINITY_RANK = {"pcie-switch": 0, "numa": 1, "cross-socket": 2, "unknown": 3}


def _rdma(ctx: Context) -> list[RdmaDevice]:
    return ctx.hw.rdma_devices()


def _label(dev: RdmaDevice, port: RdmaPort) -> str:
    return f"{dev.name}:{port.port}"


def active_ports(devices: list[RdmaDevice]) -> tuple[str, ...]:
    """The ports that carry traffic, as NCCL names them ("mlx5_0:1")."""
    return tuple(_label(d, p) for d in devices for p in d.ports if p.up)


def _device(dev: RdmaDevice, port: RdmaPort | None = None) -> Device:
    return Device(name=_label(dev, port) if port else dev.name, pci=dev.pci_address)


def _option(ctx: Context, key: str, profile_key: str) -> tuple[Any, str]:
    """A command-line expectation (--expect-rdma-*) wins over the profile's value."""
    value = ctx.options.extra.get(key)
    if value is not None:
        return value, f"--{key.replace('_', '-')}"
    return ctx.profile.get(profile_key), f"profile {ctx.profile.name} {profile_key}"


def compute_nics(ctx: Context, devices: list[RdmaDevice]) -> list[RdmaDevice]:
    """The NICs that carry training traffic: of the profile's link layer when it names one;
    else the InfiniBand HCAs when there are any (imbue's H100 hosts: 8 IB CX-7 for compute,
    CX-6 Ethernet for IP, imbue-ai/cluster-health#4); else every RDMA device (RoCE)."""
    layer = ctx.profile.get("rdma.link_layer")
    if not layer and any(p.link_layer == "InfiniBand" for d in devices for p in d.ports):
        layer = "InfiniBand"  # a host with IB HCAs uses its Ethernet RDMA NICs for the front end
    if not layer:
        return devices
    return [d for d in devices if any(p.link_layer == layer for p in d.ports)]


@check("rdma-ports", code="NET001", title="RDMA ports active, at the expected rate, MTU, RoCE GIDs",
       stage="health", tags=("fabric",))
def rdma_ports(ctx: Context) -> list[Result]:
    """Every port of every RDMA device: state ACTIVE, physical state LinkUp, rate at least the
    expected one (--expect-rdma-rate or profile rdma.expected_rate_gbps), width (profile
    rdma.expected_width), link layer (profile rdma.link_layer), a RoCE v2 GID on Ethernet
    ports, active MTU at least rdma.active_mtu_min (WARN). SKIP without RDMA devices."""
    devices = _rdma(ctx)
    if not devices:
        return [skip(NO_RDMA)]
    rates, rate_src = _option(ctx, "expect_rdma_rate", "rdma.expected_rate_gbps")
    width = ctx.profile.get("rdma.expected_width")
    layer = ctx.profile.get("rdma.link_layer")
    mtu_min = ctx.profile.get("rdma.active_mtu_min")
    compute_names = {d.name for d in compute_nics(ctx, devices)}
    results = []
    for dev in devices:
        if not dev.ports:
            results.append(error(f"{dev.name}: no ports under /sys/class/infiniband/{dev.name}",
                                 device=_device(dev)))
        for port in dev.ports:
            # A number applies to every port; a mapping gives the rate per link layer.
            rate = rates.get(port.link_layer) if isinstance(rates, dict) else rates
            results.append(_judge_port(dev, port, rate, rate_src, width, layer, mtu_min,
                                       dev.name in compute_names))
    return results


def _judge_port(dev: RdmaDevice, port: RdmaPort, rate: Any, rate_src: str, width: Any,
                layer: Any, mtu_min: Any, compute: bool = True) -> Result:
    name = _label(dev, port)
    speed = (f"{port.rate_gbps:g} Gb/s ({port.width or '?'} {port.speed or ''})".rstrip()
             .replace(" )", ")") if port.rate_gbps is not None else "rate unknown")
    details: dict[str, Any] = {
        "state": port.state, "phys_state": port.phys_state, "rate_gbps": port.rate_gbps,
        "width": port.width, "speed": port.speed, "link_layer": port.link_layer,
        "active_mtu": port.active_mtu, "netdev": port.netdev, "fw_ver": dev.fw_ver,
        "gids": [dict(g) for g in port.gids if g.get("type")][:8]}
    kw: dict[str, Any] = {"device": _device(dev, port), "details": details, "value": port.rate_gbps,
                          "unit": "Gb/s"}
    summary = f"{name} {port.link_layer or '?'} {port.state}/{port.phys_state} {speed}"
    if not port.up and not compute:
        return warn(f"{summary}: port is not up (not a compute NIC: an uncabled front-end "
                    "port is common)", expected="ACTIVE/LinkUp", **kw)
    if not port.up:
        return fail(f"{summary}: port is not up", expected="ACTIVE/LinkUp",
                    remedy="check the cable and the switch port (ibstat, `ibstatus`); on "
                           "InfiniBand state INIT/ARMED with LinkUp means no subnet manager "
                           "answered (start opensm or check the fabric's SM); Polling means no "
                           "link partner", **kw)
    problems, warnings = [], []
    if rate is not None:
        if port.rate_gbps is None:
            return error(f"{summary}: the rate could not be read", expected=f">= {rate} Gb/s",
                         **kw)
        if port.rate_gbps < float(rate):
            problems.append(f"runs at {port.rate_gbps:g} Gb/s, below the expected {rate} Gb/s "
                            f"({rate_src})")
    if width and port.width and port.width != str(width):
        problems.append(f"width {port.width}, expected {width}")
    if layer and port.link_layer != layer:
        problems.append(f"link layer {port.link_layer}, expected {layer}")
    if port.link_layer == "Ethernet":
        v2 = [g for g in port.gids if str(g.get("type", "")).lower() == "roce v2"]
        details["roce_v2_gid_indices"] = [g.get("index") for g in v2]
        if not v2:
            problems.append("no RoCE v2 GID (no IP address on its interface "
                            f"{port.netdev or '?'}?): NCCL cannot pick a routable GID")
    if mtu_min is not None and port.active_mtu is not None and port.active_mtu < int(mtu_min):
        warnings.append(f"active MTU {port.active_mtu} < {mtu_min}")
    mtu_note = "" if port.active_mtu is not None else " (MTU not read: ibv_devinfo missing)"
    expected = " ".join(filter(None, [f">= {rate} Gb/s" if rate is not None else None,
                                      f"width {width}" if width else None, layer]))
    kw["expected"] = expected or None
    if problems:
        return fail(f"{summary}: {'; '.join(problems + warnings)}",
                    remedy="reseat or replace the cable/transceiver, check the switch port's "
                           "speed setting; mlx5 logs 'PCIe bandwidth limited' when the NIC "
                           "itself trained narrow; RoCE needs an IP on the port's interface",
                    **kw)
    if warnings:
        return warn(f"{summary}: {'; '.join(warnings)}",
                    remedy="set the fabric/interface MTU to 4096 (IB) or jumbo frames (RoCE)",
                    **kw)
    return passed(summary + mtu_note, **kw)


@check("rdma-firmware", code="NET002", title="same firmware on every HCA of a model",
       stage="health", tags=("fabric",))
def rdma_firmware(ctx: Context) -> list[Result]:
    """HCAs of one type (sysfs hca_type) must run one firmware version: mixed firmware is a
    half-finished update (gcm's check-iblink fails firmware mismatches)."""
    devices = _rdma(ctx)
    if not devices:
        return [skip(NO_RDMA)]
    by_type: dict[str, list[RdmaDevice]] = {}
    for dev in devices:
        by_type.setdefault(dev.hca_type or "unknown type", []).append(dev)
    results = []
    for kind, devs in sorted(by_type.items()):
        versions: dict[str, list[str]] = {}
        for dev in devs:
            versions.setdefault(dev.fw_ver or "unreadable", []).append(dev.name)
        details = {"hca_type": kind, "firmware": versions}
        if "unreadable" in versions:
            results.append(error(f"{kind}: firmware version not readable on "
                                 f"{', '.join(versions['unreadable'])}", details=details))
        elif len(versions) > 1:
            common = max(versions, key=lambda v: len(versions[v]))
            odd = {v: n for v, n in versions.items() if v != common}
            text = "; ".join(f"{', '.join(n)} on {v}" for v, n in sorted(odd.items()))
            results.append(fail(f"{kind}: mixed firmware: {len(versions[common])} HCA(s) on "
                                f"{common}, {text}", value=sorted(versions),
                                expected="one version per HCA type", details=details,
                                remedy="update every HCA to one firmware (mlxfwmanager, or the "
                                       "vendor's bundle) and reset them (mlxfwreset) or reboot"))
        else:
            version = next(iter(versions))
            results.append(passed(f"{kind}: {len(devs)} HCA(s) on firmware {version}",
                                  value=version, details=details))
    return results


@check("rdma-counters", code="NET003", title="RDMA port error counters and link flaps",
       stage="health", tags=("fabric",))
def rdma_counters(ctx: Context) -> list[Result]:
    """Port error counters since they were last cleared (usually boot) against profile
    rdma.counters: above `warn` WARN, above `fail` FAIL. link_downed counts link flaps and names
    the port. A port that exposes none of the counters is an ERROR (could not measure)."""
    devices = _rdma(ctx)
    if not devices:
        return [skip(NO_RDMA)]
    limits: dict[str, dict[str, Any]] = ctx.profile.get("rdma.counters") or {}
    results = []
    for dev in devices:
        for port in dev.ports:
            kw = {"device": _device(dev, port)}
            seen = {k: port.counters[k] for k in limits if k in port.counters}
            if not seen and port.link_layer == "Ethernet":
                results.append(skip(f"{_label(dev, port)}: RoCE port without the InfiniBand "
                                    "error counters (read `ethtool -S "
                                    f"{port.netdev or '<netdev>'}` for its Ethernet errors)",
                                    **kw))
                continue
            if not seen:
                results.append(error(f"{_label(dev, port)}: none of the error counters "
                                     f"{sorted(limits)} is exposed", **kw))
                continue
            failing = {k: v for k, v in seen.items()
                       if limits[k].get("fail") is not None and v > int(limits[k]["fail"])}
            warning = {k: v for k, v in seen.items() if k not in failing
                       and limits[k].get("warn") is not None and v > int(limits[k]["warn"])}
            text = ", ".join(f"{k}={v}" for k, v in {**failing, **warning}.items())
            flaps = seen.get("link_downed", 0)
            flap_note = f"; the link went down {flaps} time(s) (flapped)" if flaps else ""
            details = {"counters": seen, "limits": {k: limits[k] for k in seen}}
            remedy = ("reseat/replace the cable or transceiver of this port, check the switch "
                      "side (ibqueryerrors, ibdiagnet); clear counters (perfquery -x -R) and "
                      "watch whether they grow")
            if failing:
                results.append(fail(f"{_label(dev, port)}: {text}{flap_note}", value=seen,
                                    details=details, remedy=remedy, **kw))
            elif warning:
                results.append(warn(f"{_label(dev, port)}: {text}{flap_note}", value=seen,
                                    details=details, remedy=remedy, **kw))
            else:
                results.append(passed(f"{_label(dev, port)}: error counters clean "
                                      f"({len(seen)} read)", value=seen, details=details, **kw))
    return results


@dataclass(frozen=True)
class Rail:
    gpu: str  # label "GPU0 0000:1b:00.0"
    gpu_pci: str
    nic: str | None
    affinity: str  # pcie-switch, numa, cross-socket, unknown


def affinity(gpu: PciDevice, nic: RdmaDevice) -> str:
    """pcie-switch when both hang below one bridge (same switch or root port), numa when they
    share a NUMA node, cross-socket when both NUMA nodes are known and differ."""
    common = 0
    for a, b in zip(gpu.pci_path, nic.pci_path, strict=False):
        if a != b:
            break
        common += 1
    if common:
        return "pcie-switch"
    if gpu.numa_node is None or nic.numa_node is None:
        return "unknown"
    return "numa" if gpu.numa_node == nic.numa_node else "cross-socket"


def rails_map(ctx: Context, nics: list[RdmaDevice]) -> list[Rail]:
    rails = []
    for i, gpu in enumerate(ctx.pci_gpus):
        ranked = sorted(nics, key=lambda n: (AFFINITY_RANK[affinity(gpu, n)], n.name))
        best = ranked[0] if ranked else None
        rails.append(Rail(f"GPU{i} {gpu.address}", gpu.address, best.name if best else None,
                          affinity(gpu, best) if best else "unknown"))
    return rails


@check("rdma-rails", code="NET004", title="compute NIC count and each GPU's nearest NIC",
       stage="health", tags=("fabric",))
def rdma_rails(ctx: Context) -> list[Result]:
    """The rails map: for each GPU the nearest compute NIC from the PCI topology (same PCIe
    switch, else same NUMA node). FAIL when fewer compute NICs than expected
    (--expect-rdma-nics or profile rdma.compute_nics, e.g. one per GPU on HGX); WARN for a GPU
    whose nearest NIC is across the socket (its traffic crosses the inter-socket link)."""
    devices = _rdma(ctx)
    if not devices:
        return [skip(NO_RDMA)]
    if not ctx.pci_gpus:
        return [skip("no NVIDIA GPU on the PCI bus: no rails to map")]
    nics = compute_nics(ctx, devices)
    expected, source = _option(ctx, "expect_rdma_nics", "rdma.compute_nics")
    rails = rails_map(ctx, nics)
    table = {r.gpu: {"nic": r.nic, "affinity": r.affinity} for r in rails}
    details = {"rails": table, "compute_nics": [n.name for n in nics]}
    shared: dict[str, int] = {}
    for r in rails:
        if r.nic:
            shared[r.nic] = shared.get(r.nic, 0) + 1
    summary = ", ".join(f"GPU{i}->{r.nic or '-'}({r.affinity})" for i, r in enumerate(rails))
    results = []
    if expected is not None and len(nics) < int(expected):
        results.append(fail(f"{len(nics)} compute NIC(s), expected {expected} ({source}): "
                            f"{', '.join(n.name for n in nics) or 'none'}", value=len(nics),
                            expected=f">= {expected}", details=details,
                            remedy="a missing HCA: check `lspci | grep Mellanox`, the mlx5 "
                                   "driver messages in the kernel log, and the card's seating"))
    far = [r for r in rails if r.affinity == "cross-socket"]
    if far:
        results.append(warn(f"{len(far)} GPU(s) have their nearest NIC across the socket: "
                            f"{', '.join(f'{r.gpu}->{r.nic}' for r in far)}", value=summary,
                            details=details,
                            remedy="move the NIC to a slot on the GPU's socket, or pin the "
                                   "rank's NIC (NCCL_IB_HCA) to one on its NUMA node"))
    if not results:
        results.append(passed(f"{len(nics)} compute NIC(s); {summary}", value=len(nics),
                              expected=f">= {expected}" if expected is not None else None,
                              details=details))
    return results


def _kernel_at_least(release: str, major: int, minor: int) -> bool:
    match = re.match(r"(\d+)\.(\d+)", release)
    if match is None:
        return False
    return (int(match.group(1)), int(match.group(2))) >= (major, minor)


@check("gpudirect-rdma", code="NET005", title="GPUDirect RDMA available (peer memory or dma-buf)",
       stage="health", tags=("fabric",))
def gpudirect_rdma(ctx: Context) -> Result:
    """Where GPUs and RDMA devices meet, NCCL needs a GPU memory path for the NIC: the
    nvidia_peermem module registered with the RDMA core (/sys/kernel/mm/memory_peers/nv_mem),
    or dma-buf (open kernel module and kernel >= 5.12). Without it NCCL prints "GPU Direct RDMA
    Disabled" and 2-node all-reduce drops from ~180 to ~10 GB/s (NVIDIA/nccl#1676); loaded but
    not registered is NVIDIA/nccl#1939."""
    devices = _rdma(ctx)
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
       stage="health", tags=("fabric",))
def pcie_acs(ctx: Context) -> list[Result]:
    """ACS P2P redirect on a PCIe bridge between a GPU and its nearest NIC sends GPUDirect
    traffic through the root complex: slow, and NCCL can hang (nccl#2079, #606). FAIL on bare
    metal; inside a VM ACS is how the hypervisor isolates devices, so it is reported, not
    failed. ERROR when the config space cannot be read (it needs root)."""
    devices = _rdma(ctx)
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


# name -> (values that hurt (lowercase), status, why)
NCCL_ENV_RULES: dict[str, tuple[tuple[str, ...], str, str]] = {
    "NCCL_P2P_DISABLE": (("1",), "FAIL", "disables NVLink/PCIe peer-to-peer: in-node traffic "
                         "goes through host memory"),
    "NCCL_P2P_LEVEL": (("loc", "0"), "FAIL", "LOC forbids P2P between any two GPUs "
                       "(stale NCCL_P2P_LEVEL=LOC: NVIDIA/nccl-tests#228)"),
    "NCCL_SHM_DISABLE": (("1",), "WARN", "disables the shared-memory transport"),
    "NCCL_NVLS_ENABLE": (("0",), "WARN", "disables NVLink SHARP on NVSwitch systems"),
    "NCCL_IB_DISABLE": (("1",), "FAIL", "disables InfiniBand/RoCE: NCCL falls back to TCP "
                        "sockets across nodes"),
    "NCCL_NET": (("socket",), "FAIL", "forces the TCP socket transport across nodes"),
    "NCCL_NET_GDR_LEVEL": (("loc", "0"), "WARN", "disables GPUDirect RDMA"),
}
# Only harmful where RDMA devices exist.
RDMA_ONLY = {"NCCL_IB_DISABLE", "NCCL_NET", "NCCL_NET_GDR_LEVEL"}


def _names_match(spec: str, names: list[str]) -> list[str]:
    """NCCL's interface/HCA list syntax: comma-separated prefixes, '=' for exact names, a
    leading '^' to exclude. Returns the names the list would select."""
    exact = spec.startswith("=")
    exclude = spec.lstrip("=").startswith("^")
    items = [i.split(":")[0] for i in spec.lstrip("=^").split(",") if i]

    def hit(name: str) -> bool:
        return any(name == i if exact else name.startswith(i) for i in items)

    return [n for n in names if hit(n) != exclude]


@check("nccl-env", code="NET007", title="no NCCL variable silently cripples a job",
       stage="health", tags=("fabric", "nccl"))
def nccl_env(ctx: Context) -> list[Result]:
    """NCCL_* variables in this environment that disable a transport (NCCL_P2P_DISABLE,
    NCCL_P2P_LEVEL=LOC, NCCL_IB_DISABLE, NCCL_NET=Socket, ...) or name nothing that exists
    (NCCL_SOCKET_IFNAME naming no interface, NCCL_IB_HCA naming no HCA). The InfiniBand ones
    only FAIL where RDMA devices exist."""
    env = ctx.hw.environ()
    # Values as a report may show them: secret-looking ones masked (checks/report_schema.py).
    seen = {k: env_value(k, v) for k, v in env.items() if k.startswith("NCCL_")}
    try:
        rdma = [d.name for d in _rdma(ctx)]
    except HardwareError:
        rdma = []
    results = []
    for name, (bad, status, why) in NCCL_ENV_RULES.items():
        value = seen.get(name)
        if value is None or value.strip().lower() not in bad:
            continue
        text = f"{name}={value}: {why}"
        kw = {"value": f"{name}={value}", "expected": f"{name} unset",
              "remedy": f"unset {name} (shell profile, /etc/environment, the container image, "
                        "the job script or ~/.nccl.conf / /etc/nccl.conf)"}
        if name in RDMA_ONLY and not rdma:
            results.append(passed(f"{text} (harmless here: no RDMA device)", **kw))
        elif status == "FAIL":
            results.append(fail(text, **kw))
        else:
            results.append(warn(text, **kw))
    ifname = seen.get("NCCL_SOCKET_IFNAME")
    if ifname:
        interfaces = ctx.hw.net_interfaces()
        if interfaces is None:
            results.append(error(f"NCCL_SOCKET_IFNAME={ifname}: interfaces not listable"))
        elif not _names_match(ifname, interfaces):
            results.append(fail(f"NCCL_SOCKET_IFNAME={ifname} selects no interface of this host "
                                f"({', '.join(interfaces)}): NCCL cannot bootstrap",
                                value=ifname, expected=f"one of {', '.join(interfaces)}",
                                remedy="set it to this host's cluster interface, or unset it"))
    hca = seen.get("NCCL_IB_HCA")
    if hca and rdma and not _names_match(hca, rdma):
        results.append(fail(f"NCCL_IB_HCA={hca} selects none of the HCAs ({', '.join(rdma)}): "
                            "NCCL falls back to sockets", value=hca,
                            expected=f"one of {', '.join(rdma)}",
                            remedy="name this host's HCAs (mlx5_0,...) or unset it"))
    if not results:
        listed = ", ".join(f"{k}={v}" for k, v in sorted(seen.items())) or "none set"
        results.append(passed(f"no NCCL variable disables a transport ({listed})",
                              value=sorted(seen)))
    return results


# --- Proof of transport ---------------------------------------------------------------------
@dataclass(frozen=True)
class TransportExpectation:
    """What the node says NCCL should have used."""

    cross_host: bool
    rdma_up: tuple[str, ...]  # ACTIVE RDMA ports ("mlx5_0:1")
    nvlink: bool  # the GPUs have active NVLinks: in-node traffic must be P2P
    nvls: bool  # NVSwitch + Hopper or later: NVLS expected


def expectation(ctx: Context, cross_host: bool) -> TransportExpectation:
    try:
        up = active_ports(_rdma(ctx))
    except HardwareError:
        up = ()
    try:
        gpus = [g for g in ctx.gpus if not g.lost]
    except HardwareError:
        gpus = []
    nvlink = any(plan.nvlinks_up(g) for g in gpus)
    cc_min = str(ctx.profile.get("nccl.nvls_min_compute_capability"))
    cc = None
    for g in gpus[:1]:
        try:
            cc = g.handle.query("compute_capability")
        except HardwareError:
            cc = None
    nvls = bool(ctx.nvswitches) and cc is not None and tuple(cc) >= tuple(
        int(x) for x in cc_min.split("."))
    return TransportExpectation(cross_host, up, nvlink, nvls)


def judge_transport(log: NcclLog, exp: TransportExpectation) -> Result:
    """FAIL when the log shows a transport the node should not have used (see the module doc
    and docs/multinode.md); ERROR when the log cannot tell."""
    details: dict[str, Any] = {"nccl": log.summary(), "expected": {
        "cross_host": exp.cross_host, "rdma_up": list(exp.rdma_up), "nvlink": exp.nvlink,
        "nvls": exp.nvls}}
    if not log.info_lines:
        return error("no NCCL INFO line captured: cannot tell which transport NCCL used",
                     details=details, remedy="run with NCCL_DEBUG=INFO "
                     "NCCL_DEBUG_SUBSYS=INIT,NET,GRAPH (the check sets them; something "
                     "overrode them, e.g. NCCL_DEBUG_FILE)")
    if not log.connections:
        return error(f"{log.info_lines} NCCL INFO lines but no channel connection line: cannot "
                     "tell which transport carried the data", details=details)
    kinds = log.kinds
    summary = ", ".join(f"{k} x{n}" for k, n in sorted(kinds.items()))
    version = f"NCCL {log.versions[0]}: " if log.versions else ""
    problems, notes = [], []
    in_node_other = [c for c in log.connections
                     if c.transport == "SHM" or (c.transport == "NET" and not exp.cross_host)]
    if exp.nvlink and in_node_other:
        kinds_bad = sorted({c.kind for c in in_node_other})
        problems.append(f"in-node traffic via {', '.join(kinds_bad)} although the GPUs have "
                        "NVLink: P2P is disabled (NCCL_P2P_DISABLE / NCCL_P2P_LEVEL) or broken")
    if exp.cross_host:
        sockets = log.socket
        if not log.net:
            problems.append("no inter-node (NET) connection in the log")
        elif sockets and exp.rdma_up:
            where = ", ".join(log.socket_interfaces) or "a TCP interface"
            problems.append(f"{len(sockets)} inter-node connection(s) moved over NET/Socket "
                            f"({where}) while RDMA ports {', '.join(exp.rdma_up)} are ACTIVE")
        elif sockets:
            notes.append("NET/Socket across hosts (no RDMA port up on this host)")
        no_gdr = [c for c in log.net if c.network != "Socket" and not c.gdr]
        if no_gdr and exp.rdma_up:
            disabled = f" (NCCL: GPU Direct RDMA Disabled for {', '.join(log.gdr_disabled)})" \
                if log.gdr_disabled else ""
            problems.append(f"{len(no_gdr)} inter-node connection(s) over "
                            f"{sorted({c.kind for c in no_gdr})[0]} without GDRDMA{disabled}: "
                            "GPUDirect RDMA is off")
    if exp.nvls and log.nvls_used is False:
        notes.append("NVLS not used (multicast not available or 0 nvls channels)")
    details["problems"] = problems
    if problems:
        return fail(f"{version}{'; '.join(problems)} [{summary}]", value=kinds, details=details,
                    remedy="see gpudirect-rdma, rdma-ports and nccl-env; the NCCL INFO lines "
                           "'NET/IB : Using', 'Using network' and 'GPU Direct RDMA' say why")
    if notes and exp.nvls and log.nvls_used is False:
        return warn(f"{version}{'; '.join(notes)} [{summary}]", value=kinds, details=details,
                    remedy="NVLS needs Fabric Manager, CUDA >= 12.1 and NCCL >= 2.17; check "
                           "NCCL_NVLS_ENABLE and the fabric-manager check")
    note = f" ({'; '.join(notes)})" if notes else ""
    return passed(f"{version}{summary}{note}", value=kinds, details=details)


@check("nccl-transport", code="NET008",
       title="NCCL used the expected transports (P2P in node, IB+GDRDMA across nodes, NVLS)",
       level="standard", stage="workload", tags=("fabric", "nccl", "collective"))
def nccl_transport(ctx: Context) -> Result:
    """Reads the NCCL INFO log the nccl-allreduce check captured and judges the transport of
    every channel against the node: in-node P2P where the GPUs have NVLink, NVLS on NVSwitch
    nodes that support it (WARN when missing). SKIP on CPU (gloo has no NCCL transport)."""
    outcome = ctx.outcomes.get("nccl-allreduce")
    if outcome is None:
        return skip("nccl-allreduce did not run: no NCCL log to read")
    details = outcome.results[0].details if outcome.results else {}
    if details.get("backend") != "nccl":
        return skip(f"the collective ran on {details.get('backend') or 'no'} backend (CPU "
                    "processes): no NCCL transport to prove")
    raw = details.get("nccl_log")
    if raw is None and ctx.hw.simulated:
        return skip("the scenario records no NCCL log (measurements.collectives.nccl_log)")
    if raw is None:
        return error("nccl-allreduce ran on NCCL but no NCCL log was captured")
    return judge_transport(NcclLog.from_dict(raw), expectation(ctx, cross_host=False))
