"""The remediation loop under a real slurmctld/slurmd (tests/fleet/slurmcluster.py): reboots
through Slurm, GPU resets, verification, escalation, and the guards around them.

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
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from checks.fleet import slurm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from slurmcluster import SlurmCluster, need_cluster

NODES = ("rm1", "rm2", "rm3")
SCENARIOS = Path(slurm.__file__).resolve().parents[1] / "scenarios"
SERIAL4 = "1650123000004"  # GPU 4 of h100-sxm-8x-healthy, which fault-xid-79 names
POWER = """#!/bin/sh
# the node's power: slurmd again after every reboot, reporting itself just booted (-b)
flag=
while :; do slurmd -D -f "$1" $flag; flag=-b; sleep 0.2; done
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


def _cluster(base: Path, rts: str) -> Iterator[BootableCluster]:
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


@pytest.fixture(scope="module")
def rts1(tmp_path_factory) -> Iterator[BootableCluster]:
    yield from _cluster(tmp_path_factory.mktemp("rts1"), "1")


@pytest.fixture(scope="module")
def rts2(tmp_path_factory) -> Iterator[BootableCluster]:
    yield from _cluster(tmp_path_factory.mktemp("rts2"), "2")


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

    def health_check(self) -> int:
        """One health check by hand (what slurmd's would do): drains a failing node."""
        env = {**self.cluster.env(), "SLURMD_NODENAME": self.name,
               "NODECERT_STATE_DIR": str(self.state)}
        return subprocess.run([sys.executable, "-m", "checks.fleet.slurm", "health-check",
                               "--apply", "--state-dir", str(self.state), "--", "--simulate",
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

    def reboots(self) -> int:
        log = self.base / "reboots.log"
        return sum(1 for line in log.read_text().splitlines() if line.split()[1] == self.name) \
            if log.exists() else 0

    def sinfo(self) -> tuple[str, str]:
        out = self.cluster.run("sinfo", "-h", "-N", "-n", self.name, "-o", "%T|%E").strip()
        state, _, reason = out.partition("|")
        return state, "" if reason == "none" else reason


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


@pytest.fixture()
def nodes(request, tmp_path) -> Iterator[dict[str, Node]]:
    """The cluster's nodes for one test (the cluster is the test's parameter), reset after it."""
    cluster = request.getfixturevalue(request.param if hasattr(request, "param") else "rts1")
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


def _until(node: Node, done, runs: int = 20, *args: str) -> list[str]:  # type: ignore[no-untyped-def]
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


@pytest.mark.parametrize("nodes", ["rts1", "rts2"], indirect=True)
def test_a_reboot_fixed_by_the_reboot_returns_after_one_reboot_and_a_passing_verification(
        nodes) -> None:
    node = nodes["rm1"]
    node.use("fault-xid-79")
    assert node.health_check() == 1
    assert node.sinfo()[1].startswith("NODECERT: GPU005 xid-events XID 79")
    node.on_reboot("h100-sxm-8x-healthy")
    with Sampler(node.cluster, [node.name]) as sampler:
        _until(node, lambda: node.sinfo() == ("idle", ""))
    assert node.reboots() == 1
    acts = [(a["action"], a["result"]) for a in node.actions()]
    assert acts == [("detect", "ok"), ("reboot", "ok")] + [("wait", "reboot")] * acts.count(
        ("wait", "reboot")) + [("rebooted", "ok"), ("verify", "ok"), ("resume", "ok")], acts
    verified = next(a["t"] for a in node.actions() if a["action"] == "verify")
    states = sampler.states(node.name)
    assert states[-1] == "idle" and "idle" not in states[:-1], states
    assert sampler.first(node.name, "idle") >= verified
    assert any(s.startswith("reboot") for s in states), states
    kept = json.loads((node.state / "last.json").read_text())
    assert kept["level"] == "standard" and kept["verdict"] == "PASS"  # not the quick level
    assert "nodecert_" not in node.cluster.run("scontrol", "show", "reservation")
    prom = (node.textfiles / "nodecert-remediation.prom").read_text()
    assert f'nodecert_remediation_state{{host="{node.name}",state="in-service"}} 1' in prom
    assert f'nodecert_remediation_actions_total{{host="{node.name}",kind="reboot",result="ok"}} 1' in prom


@pytest.mark.parametrize("nodes", ["rts2"], indirect=True)
def test_b_a_fault_that_survives_every_reboot_escalates_to_rma_after_n_reboots(nodes) -> None:
    node = nodes["rm2"]
    node.use("fault-xid-79")
    assert node.health_check() == 1
    with Sampler(node.cluster, [node.name]) as sampler:
        _until(node, lambda: "RMA" in node.sinfo()[1], 30)
        reason = node.sinfo()[1]
        for _ in range(2):  # later timer runs: nothing more
            node.remediate()
        time.sleep(1)
    assert node.reboots() == 2
    assert "idle" not in sampler.states(node.name), sampler.seen
    assert node.sinfo() == ("drained", reason)
    head, _, path = reason.partition(" bundle ")
    assert head == f"NODECERT: RMA GPU005 {SERIAL4}"
    with tarfile.open(path) as tar:
        names = tar.getnames()
    assert any(n.endswith("report.json") for n in names) and any(n.endswith("kernel.log") for n in names)
    assert f"{node.name}/actions.jsonl" in names
    kernel = next(p for p in (node.state / "remediation" / "evidence").glob("*/kernel.log"))
    assert "Xid (PCI:0000:9a:00): 79" in kernel.read_text()
    acts = node.actions()
    assert acts[-1]["action"] == "escalate"  # the later timer runs did nothing
    assert [a["action"] for a in acts].count("reboot") == 2
    assert "after 2 remedies within 7 days" in acts[-1]["detail"]


def test_d_an_administrators_drain_and_reboot_are_left_alone(nodes) -> None:
    node = nodes["rm3"]
    node.cluster.run("scontrol", "update", f"NodeName={node.name}", "State=DRAIN",
                     "Reason=disk replaced, ops ticket 42")
    out = node.remediate().stdout
    assert "nothing to do" in out and "ran:" not in out
    assert node.sinfo() == ("drained", "disk replaced, ops ticket 42")
    node.cluster.run("scontrol", "update", f"NodeName={node.name}", "State=RESUME")
    node.cluster.run("scontrol", "reboot", "ASAP", "reason=kernel update", node.name)
    out = node.remediate().stdout
    assert "ran:" not in out and ("left to it" in out or "nothing to do" in out)
    assert node.actions() == [] or all(a["action"] == "wait" for a in node.actions())
    # nodecert's own drain, held by its breaker; an administrator takes it over: released
    node.cluster.wait_for(lambda: node.sinfo()[0] in ("idle", "down"), 60, "the admin's reboot")
    if node.sinfo()[0] == "down":
        node.cluster.run("scontrol", "update", f"NodeName={node.name}", "State=RESUME")
    node.use("fault-xid-79")
    assert node.health_check() == 1
    out = node.remediate("--breaker-drains", "1").stdout
    assert "breaker-open" in out and "wait (breaker)" in out
    node.cluster.run("scontrol", "update", f"NodeName={node.name}", "State=DRAIN",
                     "Reason=ops: keep for the vendor")
    out = node.remediate().stdout
    assert "release (ok): detected -> released" in out
    assert node.sinfo() == ("drained", "ops: keep for the vendor")
    assert node.remediate().returncode == 0 and node.sinfo() == ("drained", "ops: keep for the vendor")
    prom = (node.textfiles / "nodecert-remediation.prom").read_text()
    assert f'nodecert_remediation_breaker_open{{host="{node.name}"}} 1' in prom
    assert node.remediate("--reset-breaker").returncode == 0
    prom = (node.textfiles / "nodecert-remediation.prom").read_text()
    assert f'nodecert_remediation_breaker_open{{host="{node.name}"}} 0' in prom
    assert node.reboots() == 1  # the administrator's only
