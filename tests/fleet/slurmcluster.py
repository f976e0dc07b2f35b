"""A real Slurm cluster on this machine for the tests: munged, slurmctld and one slurmd per node.

Debian's slurmctld/slurmd/munge (22.05 on bookworm), started and stopped by the test. Each node
is a network namespace with its own address on a bridge the harness makes, and its own UTS
namespace so that `hostname` (which slurmd uses to find its NodeName) is the node's name; the
controller listens on the bridge address in this namespace. Munge authenticates through a
socket in the cluster's directory. Ports are chosen free; names carry the pid, so two test runs
on one machine do not collide. Everything is removed again on stop(): processes, namespaces,
links.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TOOLS = ("munged", "munge", "slurmctld", "slurmd", "sinfo", "scontrol", "sbatch", "srun", "ip",
         "unshare", "nsenter")


_instances = itertools.count()


def missing_tools() -> list[str]:
    return [t for t in TOOLS if shutil.which(t) is None]


def need_cluster() -> None:
    """Skip without root (namespaces, munged, slurmd); fail when the packages are missing."""
    import pytest

    if os.geteuid() != 0:
        pytest.skip("a local Slurm cluster needs root (network namespaces, munged, slurmd)")
    missing = missing_tools()
    if missing:
        pytest.fail(f"missing {', '.join(missing)}: make test installs .ci/apt-packages.txt "
                    "(slurmctld slurmd slurm-client munge iproute2)")


@contextlib.contextmanager
def local_cluster(base: Path, nodes: Sequence[str], **kw: Any) -> Iterator[SlurmCluster]:
    """A test module's cluster: checked for, started, stopped."""
    need_cluster()
    with SlurmCluster(base, nodes=nodes, **kw) as cluster:
        yield cluster


def pointed_at(cluster: SlurmCluster, monkeypatch: Any) -> SlurmCluster:
    """One test's view: every node idle again, and the helpers' sinfo/scontrol talk to it."""
    cluster.reset()
    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
    return cluster


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def _ip(*args: str, check: bool = True) -> None:
    subprocess.run(["ip", *args], check=check, capture_output=True, text=True, timeout=30)


@dataclass
class SlurmCluster:
    base: Path
    nodes: Sequence[str] = ("node1",)
    cpus: int = 2
    extra_conf: dict[str, str] = field(default_factory=dict)
    # NodeName -> the node's host name (NodeHostname=) where they differ; else the NodeName
    hostnames: dict[str, str] = field(default_factory=dict)
    tag: str = ""
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        self.base.chmod(0o755)  # munged wants the socket's directory reachable by everyone
        # Distinct names and subnets per cluster: several may run at once (pid, then a counter).
        n = next(_instances)
        self.tag = self.tag or f"nc{os.getpid() % 10000}x{n}"
        self.subnet = f"10.{213 + n % 30}.{os.getpid() % 250}"
        self.controller_addr = f"{self.subnet}.1"
        self.bridge = f"{self.tag}br"
        self.conf = self.base / "slurm.conf"
        self.munge_socket = self.base / "munge.sock"
        self.ctld_port, self.slurmd_port = _free_port(), _free_port()

    # -- addresses and environment -------------------------------------------------------
    def addr(self, node: str) -> str:
        return f"{self.subnet}.{11 + list(self.nodes).index(node)}"

    def hostname(self, node: str) -> str:
        return self.hostnames.get(node, node)

    def netns(self, node: str) -> str:
        return f"{self.tag}-{node}"

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["SLURM_CONF"] = str(self.conf)
        return env

    def run(self, *cmd: str, timeout: float = 30, check: bool = True) -> str:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              env=self.env(), check=False)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}: exit {proc.returncode}: {proc.stderr.strip()}")
        return proc.stdout

    def in_node(self, node: str, *cmd: str) -> list[str]:
        """A command line that runs inside the node's namespaces, with its hostname."""
        # Node names resolve as on a real cluster: the cluster's hosts file is bind-mounted over
        # /etc/hosts in the node's own mount namespace (nothing changes outside it).
        script = (f'mount --bind {self.base / "hosts"} /etc/hosts && hostname {self.hostname(node)} && '
                  'exec "$@"')
        # nsenter, not `ip netns exec`: that remounts /sys, and slurmd then finds no cgroup fs.
        return ["nsenter", f"--net=/run/netns/{self.netns(node)}", "unshare", "--uts", "--mount",
                "--propagation", "private", "sh", "-c", script, "sh", *cmd]

    # -- lifecycle -------------------------------------------------------------------------
    def start(self, timeout: float = 60) -> SlurmCluster:
        try:
            self._network()
            self._munge()
            self._write_conf()
            self._spawn("slurmctld", ["slurmctld", "-D", "-f", str(self.conf)])
            self._wait(lambda: self._answers(), timeout, "slurmctld to answer")
            for node in self.nodes:
                (self.base / "spool" / node).mkdir(parents=True, exist_ok=True)
                self._spawn(f"slurmd-{node}", self.in_node(node, "slurmd", "-D", "-f", str(self.conf)))
            self._wait(lambda: self.all_idle(), timeout, "every node to be idle")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in self.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.procs.clear()
        # Jobs' processes (slurmstepd and what it ran) live in the node namespaces.
        for node in self.nodes:
            pids = subprocess.run(["ip", "netns", "pids", self.netns(node)], capture_output=True,
                                  text=True, check=False).stdout.split()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            _ip("netns", "del", self.netns(node), check=False)
        _ip("link", "del", self.bridge, check=False)

    def __enter__(self) -> SlurmCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- state ---------------------------------------------------------------------------------
    def node_state(self, node: str) -> tuple[str, str]:
        out = self.run("sinfo", "-h", "-N", "-n", node, "-o", "%T|%E").strip()
        state, _, reason = out.partition("|")
        return state.lower().rstrip("*~#!%$@^-"), ("" if reason == "none" else reason)

    def all_idle(self) -> bool:
        try:
            return all(self.node_state(n)[0] == "idle" for n in self.nodes)
        except (RuntimeError, subprocess.TimeoutExpired):
            return False

    def reset(self) -> None:
        """Every node back to idle with no reason, as at start."""
        for node in self.nodes:
            state, _ = self.node_state(node)
            if "drain" in state or state in ("down", "fail"):
                self.run("scontrol", "update", f"NodeName={node}", "State=RESUME")
        self._wait(self.all_idle, 30, "nodes to return to idle")

    def wait_for(self, predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
        self._wait(predicate, timeout, what)

    def log(self, name: str) -> str:
        path = self.base / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    # -- pieces ----------------------------------------------------------------------------------
    def _network(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.controller_addr}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i, node in enumerate(self.nodes):
            ns, host_end = self.netns(node), f"{self.tag}v{i}"
            _ip("netns", "add", ns)
            _ip("link", "add", host_end, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("link", "set", host_end, "master", self.bridge, "up")
            _ip("-n", ns, "addr", "add", f"{self.addr(node)}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        hosts = (["127.0.0.1 localhost", f"{self.controller_addr} {socket.gethostname()}"]
                 + [f"{self.addr(n)} {' '.join(dict.fromkeys([n, self.hostname(n)]))}"
                    for n in self.nodes])
        (self.base / "hosts").write_text("\n".join(hosts) + "\n")

    def _munge(self) -> None:
        key = self.base / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self._spawn("munged", ["munged", "-F", "-f", f"--socket={self.munge_socket}",
                               f"--key-file={key}", f"--pid-file={self.base / 'munged.pid'}",
                               f"--seed-file={self.base / 'munged.seed'}",
                               f"--log-file={self.base / 'munged.log'}"])
        self._wait(self.munge_socket.exists, 15, "munged's socket")

    def _write_conf(self) -> None:
        b = self.base
        (b / "state").mkdir(exist_ok=True)
        lines = {
            "ClusterName": "nodecert",
            # slurmctld only starts on the host this names: this machine, at the bridge address.
            "SlurmctldHost": f"{socket.gethostname().split('.')[0]}({self.controller_addr})",
            "MailProg": "/bin/true",
            "SlurmctldPort": str(self.ctld_port),
            "SlurmdPort": str(self.slurmd_port),
            "AuthType": "auth/munge",
            "AuthInfo": f"socket={self.munge_socket}",
            "CredType": "cred/munge",
            "SlurmUser": "root",
            "SlurmdUser": "root",
            "StateSaveLocation": str(b / "state"),
            "SlurmdSpoolDir": str(b / "spool" / "%n"),
            "SlurmctldPidFile": str(b / "slurmctld.pid"),
            "SlurmdPidFile": str(b / "slurmd.%n.pid"),
            "SlurmctldLogFile": str(b / "slurmctld.log"),
            "SlurmdLogFile": str(b / "slurmd.%n.log"),
            "ProctrackType": "proctrack/linuxproc",
            "TaskPlugin": "task/none",
            "SelectType": "select/cons_tres",
            "SelectTypeParameters": "CR_Core",
            "SchedulerType": "sched/backfill",
            "MpiDefault": "none",
            "ReturnToService": "2",
            "JobCompType": "jobcomp/none",
            "AccountingStorageType": "accounting_storage/none",
            "SlurmctldTimeout": "30",
            "SlurmdTimeout": "30",
            "MessageTimeout": "10",
            **self.extra_conf,
        }
        text = "".join(f"{k}={v}\n" for k, v in lines.items())
        for node in self.nodes:
            named = f" NodeHostname={self.hostnames[node]}" if node in self.hostnames else ""
            text += (f"NodeName={node}{named} NodeAddr={self.addr(node)} CPUs={self.cpus} "
                     "State=UNKNOWN\n")
        text += "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n"
        self.conf.write_text(text)

    def _spawn(self, name: str, cmd: list[str]) -> None:
        out = open(self.base / f"{name}.out", "wb")  # noqa: SIM115 - lives as long as the daemon
        self.procs.append(subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                           env=self.env(), start_new_session=True))

    def _answers(self) -> bool:
        try:
            self.run("scontrol", "ping", timeout=10)
            return True
        except (RuntimeError, subprocess.TimeoutExpired):
            return False

    def _wait(self, predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for proc in self.procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"{proc.args[0]} exited ({proc.returncode}) while waiting for "
                                       f"{what}; logs in {self.base}")
            if predicate():
                return
            time.sleep(0.3)
        raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}; logs in {self.base}")


def node_report(tmp_path: Path, base: dict[str, Any], broken: Sequence[Any] = ()) -> Path:
    """One synthetic host report of node gpu07 (its `broken` faults), written to tmp_path: what
    the Slurm tests hand `checks.fleet.slurm report`."""
    import json

    from checks.devtools import synthetic

    [report] = synthetic.build(1, base=base, broken=list(broken))
    report["host"] = "gpu07.cluster.example"
    path = tmp_path / "gpu07.json"
    path.write_text(json.dumps(report))
    return path


def role_shims(base: Path, roles: dict[str, str], conf: dict[str, str]) -> dict[str, str]:
    """slurm.conf entries (`roles`: key -> wrapper name) pointing at shims in base/shims that run
    base/nodes/<hostname>/<name> when a test has put one there (else exit 0): each node's
    wrapper is swapped per test without restarting the daemons. Returns `conf` with them."""
    shims = base / "shims"
    shims.mkdir(exist_ok=True)
    for key, name in roles.items():
        shim = shims / name
        shim.write_text(f'#!/bin/sh\nw={base}/nodes/$(hostname)/{name}\n'
                        f'[ -x "$w" ] && exec "$w"\nexit 0\n')
        shim.chmod(0o755)
        conf[key] = str(shim)
    return conf
