"""Hosts with their own network namespaces and addresses, on a bridge the test makes.

Each host is a network namespace with one veth leg ("data0") on a bridge in this namespace; the
bridge itself has no address, so the hosts reach each other and nothing else (no route out, no
address of this machine). A host runs commands with its own hostname and its own /etc/hosts
(UTS and mount namespaces, as tests/fleet/slurmcluster.py does), so name resolution behaves as
on a cluster; its /etc/resolv.conf points at its own loopback, so no DNS query leaves the lab.
Faults are real kernel state: `tc` rate limits (tbf), a link set down, a blackhole
route, a second interface that the hostname resolves to but that reaches no one. Rails: every
host can get more data interfaces ("data1", ...), each network on a bridge of its own, like the
one-NIC-per-rail networks of a GPU cluster; a fault can then hit one host on one rail.

Names carry the pid and a counter, subnets are 10.243-252.x.0/24 (slurmcluster uses 213-242),
so several labs can exist at once. stop() kills every process left in the namespaces and deletes
namespaces and links.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

TOOLS = ("ip", "tc", "nsenter", "unshare", "mount")
_instances = itertools.count()


def missing_tools() -> list[str]:
    return [t for t in TOOLS if shutil.which(t) is None]


def _run(*cmd: str, check: bool = True) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {proc.returncode}: {proc.stderr.strip()}")
    return proc.stdout


@dataclass
class NetLab:
    base: Path
    hosts: Sequence[str] = ("h0", "h1")
    tag: str = ""
    bridges: list[str] = field(default_factory=list)
    namespaces: list[str] = field(default_factory=list)
    resolve: dict[str, str] = field(default_factory=dict)  # hostname -> address in /etc/hosts
    rails: dict[str, tuple[str, int]] = field(default_factory=dict)  # ifname -> (subnet, number)

    def __post_init__(self) -> None:
        n = next(_instances)
        self.tag = self.tag or f"nl{os.getpid() % 10000}x{n}"
        self.second = 243 + n % 10
        self.subnet = f"10.{self.second}.{os.getpid() % 250}"
        self.bridge = f"{self.tag}br"
        self.base.mkdir(parents=True, exist_ok=True)

    # -- names and addresses ---------------------------------------------------------------
    def addr(self, host: str, ifname: str = "data0") -> str:
        subnet = self.rails[ifname][0] if ifname != "data0" else self.subnet
        return f"{subnet}.{11 + list(self.hosts).index(host)}"

    def netns(self, host: str) -> str:
        return f"{self.tag}-{host}"

    def veth(self, host: str, ifname: str = "data0") -> str:
        """The bridge-side end of the host's data link (where a test can cut or shape it)."""
        if ifname != "data0":
            return f"{self.tag}d{self.rails[ifname][1]}v{list(self.hosts).index(host)}"
        return f"{self.tag}v{list(self.hosts).index(host)}"

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> NetLab:
        try:
            self._add_bridge(self.bridge)
            for host in self.hosts:
                ns = self.netns(host)
                _run("ip", "netns", "add", ns)
                self.namespaces.append(ns)
                _run("ip", "-n", ns, "link", "set", "lo", "up")
                self._leg(host, self.veth(host), "data0", self.bridge, f"{self.addr(host)}/24")
                self.resolve[host] = self.addr(host)
            self.write_hosts()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for ns in self.namespaces:
            for pid in self.pids(ns):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while any(self.pids(ns) for ns in self.namespaces) and time.monotonic() < deadline:
            time.sleep(0.1)
        for ns in self.namespaces:
            _run("ip", "netns", "del", ns, check=False)
        for bridge in self.bridges:
            _run("ip", "link", "del", bridge, check=False)
        self.namespaces.clear()
        self.bridges.clear()

    def __enter__(self) -> NetLab:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- running things on a host ------------------------------------------------------------
    def pids(self, ns: str | None = None) -> list[int]:
        """Processes in one namespace (or in all of the lab's)."""
        spaces = [ns] if ns else self.namespaces
        found = []
        for space in spaces:
            out = _run("ip", "netns", "pids", space, check=False)
            found += [int(p) for p in out.split() if p.isdigit()]
        return found

    def command(self, host: str, *cmd: str) -> list[str]:
        """A command line that runs on the host: its network, its hostname, its /etc/hosts."""
        script = (f'mount --bind {self.base / "hosts"} /etc/hosts && '
                  f'mount --bind {self.base / "resolv.conf"} /etc/resolv.conf && '
                  f'hostname {host} && exec "$@"')
        return ["nsenter", f"--net=/run/netns/{self.netns(host)}", "unshare", "--uts", "--mount",
                "--propagation", "private", "sh", "-c", script, "sh", *cmd]

    def exec(self, host: str, *cmd: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.command(host, *cmd), capture_output=True, text=True,
                              timeout=timeout, check=False)

    def write_hosts(self) -> None:
        lines = ["127.0.0.1 localhost"] + [f"{a} {h}" for h, a in self.resolve.items()]
        (self.base / "hosts").write_text("\n".join(lines) + "\n")
        # Names resolve from the hosts file only: a lookup it cannot answer fails at once on the
        # host's own loopback instead of waiting on this machine's nameserver (which a host with
        # a default route would otherwise query, out of the lab).
        (self.base / "resolv.conf").write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")

    # -- faults ------------------------------------------------------------------------------
    def rate_limit(self, host: str, rate: str = "20mbit", peer: str | None = None,
                   ifname: str = "data0") -> None:
        """Without `peer`: a token bucket (tbf) on both directions of the host's data link (its
        own egress, and the bridge side's egress towards it), of `ifname` (a rail). With `peer`:
        only what the host sends to that address over data0, through an htb class (everything
        else unshaped)."""
        ns = ["-n", self.netns(host)]
        if peer is None:
            for args in ([*ns, "qdisc", "add", "dev", ifname],
                         ["qdisc", "add", "dev", self.veth(host, ifname)]):
                _run("tc", *args, "root", "tbf", "rate", rate, "burst", "32kbit",
                     "latency", "400ms")
            return
        _run("tc", *ns, "qdisc", "add", "dev", "data0", "root", "handle", "1:", "htb",
             "default", "10")
        _run("tc", *ns, "class", "add", "dev", "data0", "parent", "1:", "classid", "1:10",
             "htb", "rate", "10gbit")
        _run("tc", *ns, "class", "add", "dev", "data0", "parent", "1:", "classid", "1:20",
             "htb", "rate", rate, "ceil", rate)
        _run("tc", *ns, "filter", "add", "dev", "data0", "parent", "1:", "protocol", "ip",
             "u32", "match", "ip", "dst", f"{peer}/32", "flowid", "1:20")

    def link_down(self, host: str) -> None:
        _run("ip", "link", "set", self.veth(host), "down")

    def blackhole(self, host: str, address: str) -> None:
        _run("ip", "-n", self.netns(host), "route", "add", "blackhole", f"{address}/32")

    def add_dead_interface(self, host: str, ifname: str = "mgmt0") -> str:
        """A second interface on a bridge of its own (it reaches no other host), made the host's
        default route, with the hostname resolving to it: the classic multi-homed node whose
        first interface is the management network. Returns its address."""
        bridge = f"{self.tag}m{list(self.hosts).index(host)}"
        self._add_bridge(bridge)
        address = f"10.{self.second}.{(os.getpid() + 1 + list(self.hosts).index(host)) % 250}.11"
        self._leg(host, f"{self.tag}m{list(self.hosts).index(host)}v", ifname, bridge,
                  f"{address}/24")
        _run("ip", "-n", self.netns(host), "route", "add", "default", "dev", ifname)
        self.resolve[host] = address
        self.write_hosts()
        return address

    def add_rail(self, ifname: str = "data1") -> str:
        """One more data network: every host gets `ifname` with an address on a bridge of its own
        (a second rail). No route or hostname points at it: traffic takes it only when a program
        binds to it (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME). Returns the subnet."""
        if ifname == "data0" or ifname in self.rails:
            raise ValueError(f"{ifname} exists already")
        number = len(self.rails) + 1
        subnet = f"10.{self.second}.{(os.getpid() + 100 + number) % 250}"
        self.rails[ifname] = (subnet, number)
        bridge = f"{self.tag}b{number}"
        self._add_bridge(bridge)
        for host in self.hosts:
            self._leg(host, self.veth(host, ifname), ifname, bridge,
                      f"{self.addr(host, ifname)}/24")
        return subnet

    # -- pieces ------------------------------------------------------------------------------
    def _add_bridge(self, name: str) -> None:
        _run("ip", "link", "add", name, "type", "bridge")
        self.bridges.append(name)
        _run("ip", "link", "set", name, "up")

    def _leg(self, host: str, outer: str, inner: str, bridge: str, cidr: str) -> None:
        ns = self.netns(host)
        _run("ip", "link", "add", outer, "type", "veth", "peer", "name", inner, "netns", ns)
        _run("ip", "link", "set", outer, "master", bridge, "up")
        _run("ip", "-n", ns, "addr", "add", cidr, "dev", inner)
        _run("ip", "-n", ns, "link", "set", inner, "up")
