"""Multi-node readiness, the RDMA side: ports active at the expected rate, MTU and RoCE GIDs,
the same firmware on every HCA of a model, error counters and link flaps, and which NIC is
nearest each GPU (the rails). Every check SKIPs with the reason on a host without RDMA devices.
Thresholds: the profile's `rdma:` section; sources in generic.yaml and docs/multinode.md."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from checks.hw.base import PciDevice, RdmaDevice, RdmaPort
from checks.model import Device, Result, error, fail, passed, skip, warn
from checks.node.context import Context
from checks.node.registry import Budget, Cost, check

NO_RDMA = "no RDMA devices (/sys/class/infiniband is empty or absent): no RDMA fabric to check"
AFFINITY_RANK = {"pcie-switch": 0, "numa": 1, "cross-socket": 2, "unknown": 3}


def rdma_of(ctx: Context) -> list[RdmaDevice]:
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
       stage="health", tags=("fabric",),
       # sysfs reads plus `ibv_devinfo`
       budget=Budget(value=9, cost=Cost(cpu=1, gpu=2), source="estimated"))
def rdma_ports(ctx: Context) -> list[Result]:
    """Every port of every RDMA device: state ACTIVE, physical state LinkUp, rate at least the
    expected one (--expect-rdma-rate or profile rdma.expected_rate_gbps), width (profile
    rdma.expected_width), link layer (profile rdma.link_layer), a RoCE v2 GID on Ethernet
    ports, active MTU at least rdma.active_mtu_min (WARN). SKIP without RDMA devices."""
    devices = rdma_of(ctx)
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
       stage="health", tags=("fabric",),
       budget=Budget(value=5, cost=Cost(cpu=1, gpu=1), source="estimated"))
def rdma_firmware(ctx: Context) -> list[Result]:
    """HCAs of one type (sysfs hca_type) must run one firmware version: mixed firmware is a
    half-finished update (gcm's check-iblink fails firmware mismatches)."""
    devices = rdma_of(ctx)
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
       stage="health", tags=("fabric",),
       budget=Budget(value=8, cost=Cost(cpu=1, gpu=1), source="estimated"))
def rdma_counters(ctx: Context) -> list[Result]:
    """Port error counters since they were last cleared (usually boot) against profile
    rdma.counters: above `warn` WARN, above `fail` FAIL. link_downed counts link flaps and names
    the port. A port that exposes none of the counters is an ERROR (could not measure)."""
    devices = rdma_of(ctx)
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
       stage="health", tags=("fabric",),
       budget=Budget(value=7, cost=Cost(cpu=1, gpu=1), source="estimated"))
def rdma_rails(ctx: Context) -> list[Result]:
    """The rails map: for each GPU the nearest compute NIC from the PCI topology (same PCIe
    switch, else same NUMA node). FAIL when fewer compute NICs than expected
    (--expect-rdma-nics or profile rdma.compute_nics, e.g. one per GPU on HGX); WARN for a GPU
    whose nearest NIC is across the socket (its traffic crosses the inter-socket link)."""
    devices = rdma_of(ctx)
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
