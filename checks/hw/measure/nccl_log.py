"""Which transport NCCL really used: a parser for its INFO log (NCCL_DEBUG=INFO,
NCCL_DEBUG_SUBSYS=INIT,NET,GRAPH).

A run can finish with plausible numbers over the wrong path (TCP sockets while InfiniBand is
up, IB without GPUDirect, SHM where NVLink P2P should be), and NCCL says so only in INFO lines.
The shapes parsed here, and the NCCL versions they were seen with (test data under
tests/workloads/nccl_logs/ names the public report of each):

    host:pid:tid [dev] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/RoCE ; OOB eth0:...
    host:pid:tid [dev] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0>
    host:pid:tid [dev] NCCL INFO Using network IB          (Socket, IBext_v8, AWS Libfabric)
    ... Ring 00 : 3[b01000] -> 4[201000] [send] via NET/Socket/0          (2.4-2.6)
    ... Channel 01 : 2[c7000] -> 0[87000] [receive] via NET/IB/5/GDRDMA   (2.7-2.11)
    ... Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read                    (2.12+; CUMEM 2.19+)
    ... Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0(1)/GDRDMA         (PXN: proxy rank)
    ... NVLS multicast support is available on dev 0    ("is not available" when it is not)
    ... 16 coll channels, 0 collnet channels, 16 nvls channels, 32 p2p channels, ...
    ... GPU Direct RDMA Disabled for HCA 0 'mlx5_0' (no nvidia-peermem / dma-buf)
    ... NCCL version 2.18.5+cuda12.2      (also without the INFO prefix, printed by rank 0)
"""

from __future__ import annotations

import contextlib
import re
import shutil
import sys
import tempfile
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

PREFIX = re.compile(r"(?P<host>[^\s:]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] NCCL INFO ")
VERSION = re.compile(r"NCCL version (\d+\.\d+\.\d+)")
USING_NETWORK = re.compile(r"\bUsing network (.+?)\s*$")
NET_IB = re.compile(r"\bNET/IB : Using (.*?)\s*(?:;|$)")
NET_SOCKET = re.compile(r"\bNET/Socket : Using (.*?)\s*$")
DEVICE_ITEM = re.compile(r"\[\d+\](\S+)")
CONNECTION = re.compile(
    r"\b(?:Channel|Ring) (?P<ch>\d+)(?:/\d+)? : (?P<src>\d+)\[[0-9a-fA-Fx]+\] -> "
    r"(?P<dst>\d+)\[[0-9a-fA-Fx]+\](?: \[(?P<dir>send|receive)\])? via (?P<via>.+?)\s*$")
NVLS_SUPPORT = re.compile(r"NVLS multicast support is (not )?available on dev (\d+)")
NVLS_CHANNELS = re.compile(r"\b(\d+) nvls channels")
NNODES = re.compile(r"\bnNodes (\d+)\b")
GDR_STATE = re.compile(r"GPU Direct RDMA (Enabled|Disabled) for HCA \d+ '([^']+)'")
# NCCL 2.4-2.6 wording: "GPU Direct RDMA Disabled for GPU 0[0] / HCA 0"
GDR_STATE_OLD = re.compile(r"GPU Direct RDMA (Enabled|Disabled) for GPU \S+ / HCA (\d+)")
GDR_RING = re.compile(r"Connected all rings.*\bGDR (\d)")


@dataclass
class Connection:
    """One channel connection NCCL set up between two ranks."""

    channel: int
    src: int
    dst: int
    via: str  # as logged: "P2P/CUMEM/read", "NET/IB/0/GDRDMA", "SHM/direct/direct"
    direction: str | None = None  # "send" / "receive" (NET lines), None for P2P/SHM
    host: str | None = None  # host that logged it

    @property
    def transport(self) -> str:
        return self.via.split("/", 1)[0].split()[0]  # P2P, SHM, NET, COLLNET

    @property
    def network(self) -> str | None:
        """For NET connections, the network: "IB", "Socket", "IBext_v8", "AWS Libfabric"."""
        if self.transport != "NET":
            return None
        parts = self.via.split("/")
        return parts[1] if len(parts) > 1 else None

    @property
    def gdr(self) -> bool:
        return "GDRDMA" in self.via

    @property
    def kind(self) -> str:
        """Transport class: P2P, SHM, NET/Socket, NET/IB, NET/IB+GDRDMA, NET/<plugin>[+GDRDMA]."""
        if self.transport != "NET":
            return self.transport
        return f"NET/{self.network}" + ("+GDRDMA" if self.gdr else "")


@dataclass
class NcclLog:
    """What the INFO lines of one run say about the transports."""

    info_lines: int = 0
    versions: list[str] = field(default_factory=list)
    networks: list[str] = field(default_factory=list)  # "Using network X", in order seen
    ib_devices: list[str] = field(default_factory=list)  # "mlx5_0:1/IB"
    socket_interfaces: list[str] = field(default_factory=list)  # "eth0:10.0.0.1<0>"
    connections: list[Connection] = field(default_factory=list)
    nvls_available: dict[int, bool] = field(default_factory=dict)  # CUDA device -> support
    nvls_channels: int | None = None
    nnodes: int | None = None
    gdr_disabled: list[str] = field(default_factory=list)  # HCAs NCCL ran without GDR on
    gdr_enabled: list[str] = field(default_factory=list)
    ring_gdr: list[int] = field(default_factory=list)  # "use ring PXN 0 GDR 1"
    hosts: list[str] = field(default_factory=list)

    @property
    def kinds(self) -> dict[str, int]:
        """Connections per transport class (send and receive sides counted once each)."""
        return dict(Counter(c.kind for c in self.connections))

    @property
    def net(self) -> list[Connection]:
        return [c for c in self.connections if c.transport == "NET"]

    @property
    def socket(self) -> list[Connection]:
        return [c for c in self.net if c.network == "Socket"]

    @property
    def nvls_used(self) -> bool | None:
        """True when NCCL built NVLS channels; None when the log does not say."""
        if self.nvls_channels is not None:
            return self.nvls_channels > 0
        if self.nvls_available:
            return all(self.nvls_available.values())
        return None

    def summary(self) -> dict[str, Any]:
        """Compact, JSON-ready: what the report and the fleet view carry."""
        return {"nccl_versions": self.versions, "networks": self.networks,
                "ib_devices": self.ib_devices, "socket_interfaces": self.socket_interfaces,
                "transports": self.kinds, "nvls_available": _nvls_text(self.nvls_available),
                "nvls_channels": self.nvls_channels, "nnodes": self.nnodes,
                "gdr_disabled": self.gdr_disabled, "hosts": self.hosts,
                "info_lines": self.info_lines,
                "connections": [_conn_dict(c) for c in self.connections[:64]],
                "connections_total": len(self.connections)}

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["nvls_available"] = {str(k): v for k, v in self.nvls_available.items()}
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NcclLog:
        data = dict(data)
        data["connections"] = [Connection(**c) for c in data.get("connections") or []]
        data["nvls_available"] = {int(k): bool(v)
                                  for k, v in (data.get("nvls_available") or {}).items()}
        return cls(**data)


def _nvls_text(support: dict[int, bool]) -> bool | None:
    return None if not support else all(support.values())


def _conn_dict(c: Connection) -> dict[str, Any]:
    return {"channel": c.channel, "src": c.src, "dst": c.dst, "via": c.via, "kind": c.kind,
            "direction": c.direction, "host": c.host}


def _add(seq: list[str], items: Iterable[str]) -> None:
    for item in items:
        if item not in seq:
            seq.append(item)


def parse(text: str) -> NcclLog:
    """Parse NCCL output (any mix of ranks, hosts and other program output)."""
    log = NcclLog()
    seen: set[tuple[Any, ...]] = set()
    for raw in text.splitlines():
        line = raw.rstrip()
        if version := VERSION.search(line):
            _add(log.versions, [version.group(1)])
        marker = line.find("NCCL INFO ")
        if marker < 0:
            continue
        log.info_lines += 1
        prefix = PREFIX.search(line)
        host = prefix.group("host") if prefix else None
        if host:
            _add(log.hosts, [host])
        msg = line[marker + len("NCCL INFO "):]
        if m := CONNECTION.search(msg):
            conn = Connection(int(m.group("ch")), int(m.group("src")), int(m.group("dst")),
                              m.group("via"), m.group("dir"), host)
            key = (conn.channel, conn.src, conn.dst, conn.via)
            if key not in seen:  # the same connection is logged by both ends (send, receive)
                seen.add(key)
                log.connections.append(conn)
        elif m := NET_IB.search(msg):
            _add(log.ib_devices, DEVICE_ITEM.findall(m.group(1)))
        elif m := NET_SOCKET.search(msg):
            _add(log.socket_interfaces, DEVICE_ITEM.findall(m.group(1)))
        elif m := USING_NETWORK.search(msg):
            _add(log.networks, [m.group(1)])
        elif m := NVLS_SUPPORT.search(msg):
            log.nvls_available[int(m.group(2))] = m.group(1) is None
        elif m := GDR_STATE.search(msg) or GDR_STATE_OLD.search(msg):
            hca = m.group(2) if not m.group(2).isdigit() else f"HCA {m.group(2)}"
            _add(log.gdr_enabled if m.group(1) == "Enabled" else log.gdr_disabled, [hca])
        elif m := GDR_RING.search(msg):
            log.ring_gdr.append(int(m.group(1)))
        if m := NVLS_CHANNELS.search(msg):
            log.nvls_channels = max(log.nvls_channels or 0, int(m.group(1)))
        if m := NNODES.search(msg):
            log.nnodes = max(log.nnodes or 0, int(m.group(1)))
    return log


def parse_file(path: str | Path) -> NcclLog:
    return parse(Path(path).read_text(errors="replace"))


# What the collective check and the cross-host stage add to the ranks' environment.
DEBUG_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET,GRAPH"}
LAUNCH_LOG = "launcher.log"  # checks/supervise/launch.py: torchrun's and every rank's output


def debug_env(profile: Any = None) -> dict[str, str]:
    """NCCL_DEBUG=INFO with the INIT,NET,GRAPH subsystems (profile nccl.debug_env overrides)."""
    configured = profile.get("nccl.debug_env") if profile is not None else None
    return {str(k): str(v) for k, v in (configured or DEBUG_ENV).items()}


class Capture:
    """A launch directory whose launcher.log is parsed after the run. Made here (and removed
    after a clean run) when the caller gives none, because collective.run() deletes its own."""

    def __init__(self, workdir: str | None, active: bool) -> None:
        self.active = active
        self.own = active and not workdir
        self.workdir = tempfile.mkdtemp(prefix="nodecert-nccl-") if self.own else workdir
        self.keep = False

    def parse(self, measurement: Mapping[str, Any], simulated: bool = False) -> NcclLog | None:
        """The run's NCCL log: a scenario's `nccl_log` text, else the launch log file; None
        when not capturing, or when a scenario records no log."""
        if not self.active:
            return None
        self.keep = not measurement.get("ok", False)
        if measurement.get("nccl_log") is not None:
            return parse(str(measurement["nccl_log"]))
        if simulated:
            return None
        directory = measurement.get("workdir") or self.workdir
        try:
            return parse_file(Path(str(directory)) / LAUNCH_LOG)
        except OSError:
            return NcclLog()  # nothing captured: the transport check reports ERROR


@contextlib.contextmanager
def capture(workdir: str | None, active: bool) -> Iterator[Capture]:
    cap = Capture(workdir, active)
    try:
        yield cap
    finally:
        if cap.own and not cap.keep and cap.workdir:
            shutil.rmtree(cap.workdir, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m checks.hw.measure.nccl_log FILE...`: print each log's transport summary."""
    import json

    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print("usage: python -m checks.hw.measure.nccl_log NCCL_LOG_FILE...", file=sys.stderr)
        return 0 if args else 2
    for name in args:
        try:
            log = parse_file(name)
        except OSError as exc:
            print(f"error: {name}: {exc.strerror}", file=sys.stderr)
            return 2
        print(json.dumps({"file": name, **log.summary()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
