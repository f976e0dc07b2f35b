"""The remediation loop's test harness on a real slurmctld/slurmd (tests/fleet/slurmcluster.py),
shared by tests/fleet/test_slurm_remediate*.py.

Each node's slurmd runs under a "power" loop that starts it again after it exits, with -b (just
rebooted), and slurm.conf's RebootProgram records the call, runs the node's on-reboot hook (the
test swaps the node's scenario there, as a real repair changes the hardware) and stops slurmd:
Slurm sees the whole reboot. Each "timer run" is the node's generated nodecert-remediate run
inside the node's namespaces. A sampler records every state sinfo shows, to prove that no node
was IDLE between its reboot and a passing verification."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from slurmcluster import SlurmCluster, need_cluster

from checks.fleet import slurm

NODES = ("rm1", "rm2", "rm3")
SCENARIOS = Path(slurm.__file__).resolve().parents[1] / "scenarios"
SERIAL4 = "1650123000004"  # GPU 4 of h100-sxm-8x-healthy, which fault-xid-79 names
POWER = """#!/bin/sh
# the node's power: slurmd again after every reboot, reporting itself just booted (-b). The boot
# takes 2 s: slurmctld keeps a node in REBOOT_ISSUED while its boot time (now less the uptime
# slurmd reports, whole seconds) is older than the reboot's issue time, and a restart within
# the same second as the issue (a loaded host) was never seen as the reboot: the node stayed
# "reboot^" until ResumeTimeout.
flag=
while :; do slurmd -D -f "$1" $flag; flag=-b; sleep 2; done
"""
REBOOT = """#!/bin/sh
# RebootProgram: record the call, run the node's hook (a repair), stop slurmd (the power loop
# starts it again, as a boot would)
node=$(hostname)
echo "$(date +%s.%N) $node" >> {base}/reboots.log
[ -x {base}/nodes/$node/on-reboot ] && {base}/nodes/$node/on-reboot
( sleep 0.5; kill -TERM $(cat {base}/cluster/slurmd.$node.pid) ) >/dev/null 2>&1 &
exit 0
"""
SHIM = '#!/bin/sh\nw={base}/nodes/$(hostname)/{name}\n[ -x "$w" ] && exec "$w"\nexit 0\n'


class BootableCluster(SlurmCluster):
    """slurmd under the power loop (POWER), so that a RebootProgram can restart it."""

    def _spawn(self, name: str, cmd: list[str]) -> None:
        if name.startswith("slurmd-") and cmd[-4:-2] == ["slurmd", "-D"]:
            cmd = [*cmd[:-4], "sh", str(self.base.parent / "power.sh"), cmd[-1]]
        super()._spawn(name, cmd)


def bootable_cluster(base: Path, rts: str) -> Iterator[BootableCluster]:
    """A three-node cluster with ReturnToService=`rts`, the health check every 2 s (a shim that
    runs a node's nodecert-healthcheck when the test puts one in its home)."""
    need_cluster()
    (base / "power.sh").write_text(POWER)
    reboot = base / "reboot.sh"
    reboot.write_text(REBOOT.format(base=base))
    reboot.chmod(0o755)
    shim = base / "healthcheck-shim"
    shim.write_text(SHIM.format(base=base, name="nodecert-healthcheck"))
    shim.chmod(0o755)
    conf = {"ReturnToService": rts, "RebootProgram": str(reboot), "ResumeTimeout": "60",
            "HealthCheckProgram": str(shim), "HealthCheckInterval": "2",
            "HealthCheckNodeState": "ANY"}
    with BootableCluster(base / "cluster", nodes=NODES, extra_conf=conf) as c:
        yield c


class Node:
    """One node of a test: its scenario (a symlink the test swaps), state directory, wrappers."""

    def __init__(self, cluster: BootableCluster, name: str, tmp: Path) -> None:
        self.cluster, self.name = cluster, name
        self.base = cluster.base.parent
        self.home = self.base / "nodes" / name  # what the shims and RebootProgram look at
        self.home.mkdir(parents=True, exist_ok=True)
        self.state = tmp / name / "state"
        self.textfiles = tmp / name / "textfiles"
        self.scripts = tmp / name / "scripts"
        self.scenario = tmp / name / "node.yaml"
        self.scenario.parent.mkdir(parents=True, exist_ok=True)

    def use(self, scenario: str | Path) -> None:
        target = Path(scenario) if Path(scenario).is_absolute() else SCENARIOS / f"{scenario}.yaml"
        tmp = self.scenario.with_suffix(".new")
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(target)
        tmp.replace(self.scenario)

    def on_reboot(self, scenario: str | None) -> None:
        """What the node's next reboot repairs: its scenario becomes `scenario`."""
        hook = self.home / "on-reboot"
        if scenario is None:
            hook.unlink(missing_ok=True)
            return
        hook.write_text(f"#!/bin/sh\nln -sfn {SCENARIOS / (scenario + '.yaml')} {self.scenario}\n")
        hook.chmod(0o755)

    def write_scripts(self) -> None:
        done = subprocess.run(
            [sys.executable, "-m", "checks.fleet.slurm", "scripts", str(self.scripts),
             "--state-dir", str(self.state), "--textfile-dir", str(self.textfiles),
             "--", "--simulate", str(self.scenario)],
            env=self.cluster.env(), capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr

    def health_check(self, *options: str) -> int:
        """One health check by hand (what slurmd's would do): drains a failing node."""
        env = {**self.cluster.env(), "SLURMD_NODENAME": self.name,
               "NODECERT_STATE_DIR": str(self.state)}
        return subprocess.run([sys.executable, "-m", "checks.fleet.slurm", "health-check",
                               "--apply", "--state-dir", str(self.state), *options, "--", "--simulate",
                               str(self.scenario)], env=env, capture_output=True, timeout=120,
                              check=False).returncode

    def remediate(self, *args: str) -> subprocess.CompletedProcess[str]:
        """One timer run: the generated wrapper, inside the node (its hostname names it)."""
        cmd = self.cluster.in_node(self.name, str(self.scripts / "nodecert-remediate"), *args)
        return subprocess.run(cmd, env=self.cluster.env(), capture_output=True, text=True,
                              timeout=300, check=False)

    def actions(self) -> list[dict]:
        path = self.state / "remediation" / "actions.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines()]

    def reboot_times(self) -> list[float]:
        """When RebootProgram ran on this node (reboots.log)."""
        log = self.base / "reboots.log"
        lines = log.read_text().splitlines() if log.exists() else []
        return [float(line.split()[0]) for line in lines if line.split()[1] == self.name]

    def reboots(self) -> int:
        return len(self.reboot_times())

    def sinfo(self) -> tuple[str, str]:
        out = self.cluster.run("sinfo", "-h", "-N", "-n", self.name, "-o", "%T|%E").strip()
        state, _, reason = out.partition("|")
        return state, "" if reason == "none" else reason

    def judged(self) -> tuple[str, str]:
        """sinfo's state less `*` (not responding: slurmctld marks a node whose ping it missed,
        after a slurmd restart or on a loaded host, for a ping or two), and the reason: what a
        test asserts of a node's state, which that flag does not change."""
        state, reason = self.sinfo()
        return state.rstrip("*"), reason

    def in_service(self) -> bool:
        """IDLE with no reason, `*` allowed (judged)."""
        state, reason = self.judged()
        return state == "idle" and not reason


class Sampler:
    """Every state sinfo shows for the nodes, with the time it was first seen."""

    def __init__(self, cluster: SlurmCluster, nodes: list[str]) -> None:
        self.cluster, self.nodes = cluster, nodes
        self.seen: list[tuple[float, dict[str, str]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        last = None
        while not self._stop.is_set():
            out = self.cluster.run("sinfo", "-h", "-N", "-o", "%N|%T|%E", check=False)
            now = {p[0]: f"{p[1]}|{p[2]}" for p in (ln.split("|", 2) for ln in out.splitlines())
                   if len(p) == 3 and p[0] in self.nodes}
            if now and now != last:
                self.seen.append((time.time(), now))
                last = now
            time.sleep(0.05)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def states(self, node: str) -> list[str]:
        return [s[node].split("|")[0] for _, s in self.seen if node in s]

    def first(self, node: str, state: str) -> float | None:
        return next((t for t, s in self.seen if s.get(node, "").split("|")[0] == state), None)


def node_set(cluster: BootableCluster, tmp_path: Path) -> Iterator[dict[str, Node]]:
    """The cluster's nodes for one test, healthy, their scripts written; reset after it: jobs
    cancelled, reservations deleted, no reboot pending, every node idle. The reboot log starts
    empty for each test."""
    (cluster.base.parent / "reboots.log").unlink(missing_ok=True)
    made = {n: Node(cluster, n, tmp_path) for n in NODES}
    for node in made.values():
        node.use("h100-sxm-8x-healthy")
        node.write_scripts()
    yield made
    subprocess.run(["scancel", "-u", "root"], env=cluster.env(), check=False, capture_output=True)
    for node in made.values():
        node.on_reboot(None)
        (node.home / "nodecert-healthcheck").unlink(missing_ok=True)
    with contextlib.suppress(RuntimeError):
        for node in NODES:
            cluster.run("scontrol", "delete", f"ReservationName=nodecert_{node}", check=False)
    cluster.wait_for(lambda: not any("@" in n.sinfo()[0] or "^" in n.sinfo()[0]
                                     for n in made.values()), 60, "no reboot pending")
    cluster.reset()


def until(node: Node, done: Callable[[], bool], runs: int = 20, *args: str) -> list[str]:
    """Timer runs until `done()` (at most `runs`); each run's output."""
    outputs = []
    for _ in range(runs):
        proc = node.remediate(*args)
        outputs.append(proc.stdout + proc.stderr)
        assert proc.returncode in (0, 1), outputs[-1]
        if done():
            return outputs
        time.sleep(0.3)
    raise AssertionError(f"{node.name}: not done after {runs} runs:\n" + "\n".join(outputs[:8]))


