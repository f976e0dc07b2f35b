"""RDMA devices from sysfs (/sys/class/infiniband), the port MTU from ibv_devinfo, and a PCI
bridge's ACS control from its extended config space (or setpci).

Sysfs layout read here (drivers/infiniband/core/sysfs.c):
    /sys/class/infiniband/mlx5_0/fw_ver, hca_type, device -> ../../../0000:1a:00.0
    /sys/class/infiniband/mlx5_0/ports/1/{state,phys_state,rate,link_layer}
    /sys/class/infiniband/mlx5_0/ports/1/gids/N, gid_attrs/types/N, gid_attrs/ndevs/N
    /sys/class/infiniband/mlx5_0/ports/1/counters/{symbol_error,link_downed,...}
Only the MTU is missing from sysfs for an InfiniBand port; `ibv_devinfo` prints `active_mtu`.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from checks.hw.base import HardwareError, RdmaDevice, RdmaPort

SYS_IB = Path("/sys/class/infiniband")
SYS_NET = Path("/sys/class/net")
SYS_PCI = Path("/sys/bus/pci/devices")
PCI_ADDRESS = re.compile(r"^[0-9a-f]{4,5}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
# "400 Gb/sec (4X NDR)", "100 Gb/sec (4X EDR)", "25 Gb/sec (1X EDR)", "10 Gb/sec (4X)"
RATE = re.compile(r"^\s*([\d.]+)\s*Gb/sec(?:\s*\((\d+X)\s*([A-Z]*)\))?")
ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
# PCI Express extended capability id of Access Control Services (PCIe base spec, 7.7.8).
ECAP_ACS = 0x000D
# ibv_devinfo: "hca_id:\tmlx5_0", "\t\tport:\t1", "\t\t\tactive_mtu:\t\t4096 (5)"
IBV_HCA = re.compile(r"^hca_id:\s*(\S+)")
IBV_PORT = re.compile(r"^\s+port:\s*(\d+)")
IBV_MTU = re.compile(r"^\s+active_mtu:\s*(\d+)")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def parse_rate(text: str | None) -> tuple[float | None, str | None, str | None]:
    """"400 Gb/sec (4X NDR)" -> (400.0, "4X", "NDR")."""
    match = RATE.match(text or "")
    if match is None:
        return None, None, None
    return float(match.group(1)), match.group(2), match.group(3) or None


def _state(text: str | None) -> str:
    """"4: ACTIVE" -> "ACTIVE"; "5: LinkUp" -> "LinkUp"."""
    if not text:
        return "unknown"
    return text.split(":", 1)[-1].strip() or "unknown"


def parse_ibv_devinfo(text: str) -> dict[tuple[str, int], int]:
    """active_mtu per (device, port) from `ibv_devinfo` output."""
    mtus: dict[tuple[str, int], int] = {}
    device, port = None, None
    for line in text.splitlines():
        if m := IBV_HCA.match(line):
            device, port = m.group(1), None
        elif m := IBV_PORT.match(line):
            port = int(m.group(1))
        elif (m := IBV_MTU.match(line)) and device is not None and port is not None:
            mtus[(device, port)] = int(m.group(1))
    return mtus


def ibv_devinfo_mtus() -> dict[tuple[str, int], int]:
    """{} when ibv_devinfo is not installed or fails (the MTU is then not reported)."""
    if shutil.which("ibv_devinfo") is None:
        return {}
    try:
        proc = subprocess.run(["ibv_devinfo"], capture_output=True, text=True, timeout=15,
                              check=False)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return parse_ibv_devinfo(proc.stdout) if proc.returncode == 0 else {}


def _gids(port_dir: Path) -> tuple[list[dict[str, Any]], str | None]:
    gids: list[dict[str, Any]] = []
    netdev: str | None = None
    gid_dir = port_dir / "gids"
    if not gid_dir.is_dir():
        return gids, netdev
    for entry in sorted(gid_dir.iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else -1):
        value = _read(entry)
        if not value or value == ZERO_GID:
            continue
        kind = _read(port_dir / "gid_attrs" / "types" / entry.name)
        ndev = _read(port_dir / "gid_attrs" / "ndevs" / entry.name)
        netdev = netdev or ndev
        gids.append({"index": int(entry.name), "gid": value, "type": kind})
    return gids, netdev


def _counters(port_dir: Path) -> dict[str, int]:
    counters = {}
    directory = port_dir / "counters"
    if directory.is_dir():
        for entry in sorted(directory.iterdir()):
            text = _read(entry)
            if text is not None and text.isdigit():
                counters[entry.name] = int(text)
    return counters


def _pci_path(resolved: Path) -> tuple[str, ...]:
    return tuple(p for p in resolved.parts[:-1] if PCI_ADDRESS.match(p))


def read_devices(root: Path = SYS_IB, net_root: Path = SYS_NET,
                 mtus: dict[tuple[str, int], int] | None = None) -> list[RdmaDevice]:
    """Every RDMA device under `root`; [] when the class directory does not exist."""
    if not root.exists():
        return []
    try:
        entries = sorted(root.iterdir())
    except OSError as exc:
        raise HardwareError(f"{root}: {exc.strerror}") from exc
    if mtus is None:
        mtus = ibv_devinfo_mtus() if entries else {}
    devices = []
    for entry in entries:
        address: str | None = None
        path: tuple[str, ...] = ()
        numa: int | None = None
        link = entry / "device"
        if link.exists():
            resolved = link.resolve()
            if PCI_ADDRESS.match(resolved.name):
                address, path = resolved.name, _pci_path(resolved)
            numa_text = _read(link / "numa_node")
            numa = int(numa_text) if numa_text and numa_text.lstrip("-").isdigit() else None
            numa = None if numa is not None and numa < 0 else numa
        ports = []
        port_root = entry / "ports"
        for port_dir in sorted(port_root.iterdir() if port_root.is_dir() else [],
                               key=lambda p: int(p.name) if p.name.isdigit() else 0):
            if not port_dir.name.isdigit():
                continue
            number = int(port_dir.name)
            rate, width, speed = parse_rate(_read(port_dir / "rate"))
            gids, netdev = _gids(port_dir)
            layer = _read(port_dir / "link_layer")
            mtu = mtus.get((entry.name, number))
            if mtu is None and layer == "Ethernet" and netdev:
                # A RoCE port's RDMA MTU follows its Ethernet MTU (largest IB MTU that fits).
                mtu = roce_mtu(_read(net_root / netdev / "mtu"))
            ports.append(RdmaPort(
                port=number, state=_state(_read(port_dir / "state")),
                phys_state=_state(_read(port_dir / "phys_state")), rate_gbps=rate, width=width,
                speed=speed, link_layer=layer, gids=tuple(gids), active_mtu=mtu, netdev=netdev,
                counters=_counters(port_dir)))
        devices.append(RdmaDevice(name=entry.name, fw_ver=_read(entry / "fw_ver"),
                                  hca_type=_read(entry / "hca_type"), pci_address=address,
                                  numa_node=numa, pci_path=path, ports=tuple(ports)))
    return devices


def roce_mtu(netdev_mtu: str | None) -> int | None:
    """The RDMA MTU a RoCE port gets from its interface MTU: the largest of 256..4096 that fits
    with the RoCE headers (an Ethernet MTU of 1500 gives 1024, 9000 gives 4096)."""
    if not netdev_mtu or not netdev_mtu.isdigit():
        return None
    usable = int(netdev_mtu) - 96  # IB BTH + GRH/IP + UDP + ICRC headers, rounded up
    fitting = [m for m in (256, 512, 1024, 2048, 4096) if m <= usable]
    return fitting[-1] if fitting else None


def acs_from_config(config: bytes) -> int | None:
    """ACS Control from a PCI config space dump; None when there is no ACS capability.
    Raises ValueError when the dump stops before the extended space (not root)."""
    if len(config) < 0x104:
        raise ValueError("extended configuration space not readable")
    offset, seen = 0x100, set()
    while offset and offset not in seen and offset + 8 <= len(config):
        seen.add(offset)
        header = int.from_bytes(config[offset:offset + 4], "little")
        if header in (0, 0xFFFFFFFF):
            return None
        if header & 0xFFFF == ECAP_ACS:
            return int.from_bytes(config[offset + 6:offset + 8], "little")
        offset = (header >> 20) & 0xFFC
    return None


def read_acs(address: str, sys_pci: Path = SYS_PCI) -> int | None:
    try:
        config = (sys_pci / address / "config").read_bytes()
    except OSError as exc:
        raise HardwareError(f"{address}: config space: {exc.strerror}") from exc
    try:
        return acs_from_config(config)
    except ValueError:
        pass
    # Unprivileged reads stop at 64 bytes; setpci (pciutils) may still answer under sudo rules.
    if shutil.which("setpci") is None:
        raise HardwareError(f"{address}: extended config space needs root (no setpci either)")
    try:
        proc = subprocess.run(["setpci", "-s", address, "ECAP_ACS+6.w"], capture_output=True,
                              text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise HardwareError(f"setpci -s {address}: {exc}") from exc
    text = proc.stdout.strip()
    if proc.returncode == 0 and re.fullmatch(r"[0-9a-fA-F]{1,4}", text):
        return int(text, 16)
    if "not found" in proc.stderr.lower() or "capability" in proc.stderr.lower():
        return None
    raise HardwareError(f"setpci -s {address} ECAP_ACS+6.w: "
                        f"{(proc.stderr or proc.stdout).strip()[:80] or 'no answer'}")
