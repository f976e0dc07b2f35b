"""Guards of today's wrappers against a real slurmctld/slurmd (tests/fleet/slurmcluster.py): a
pending reboot is never resumed away, an administrator's drain, reason, reboot or RESUME ends
nodecert's hold, the reason is cut for people but kept whole, a configuration failure pushed to
every node drains at most the drain budget and says so in the textfile, and `scripts` refuses a
typo in the options it passes through before writing anything.

slurm.conf names a HealthCheckProgram and a Prolog shim that exec the wrapper `scripts` wrote
into the node's own directory (nothing while there is none), and a RebootProgram that records
the call (slurmd is not restarted: a pending reboot stays pending while a job runs)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from checks.fleet import slurm, slurm_control

sys.path.insert(0, str(Path(__file__).resolve().parent))
from promtools import samples
from slurmcluster import SlurmCluster, need_cluster, role_shims

NODES = ("gd1", "gd2", "gd3")
ROLES = {"HealthCheckProgram": "nodecert-healthcheck", "Prolog": "nodecert-prolog"}
FAULT, HEALTHY = "fault-ecc-uncorrectable", "h100-sxm-8x-healthy"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[SlurmCluster]:
    need_cluster()
    base = tmp_path_factory.mktemp("guards")
    shims = base / "shims"
    shims.mkdir()
    reboot = shims / "reboot"
    reboot.write_text(f'#!/bin/sh\necho "$(hostname) $*" >> {base}/reboots\n')
    reboot.chmod(0o755)
    conf = {"HealthCheckInterval": "2", "HealthCheckNodeState": "ANY",
            "SchedulerParameters": "nohold_on_prolog_fail", "RebootProgram": str(reboot)}
    role_shims(base, ROLES, conf)
    with SlurmCluster(base / "cluster", nodes=NODES, extra_conf=conf) as c:
        c.wrappers = base / "nodes"  # type: ignore[attr-defined]
        yield c


@pytest.fixture()
def env(cluster) -> Iterator[SlurmCluster]:
    """Every node idle, no wrappers, no reboot pending, no jobs, before and after the test."""
    _clean(cluster)
    yield cluster
    _clean(cluster)


def _clean(cluster: SlurmCluster) -> None:
    for node in NODES:
        for wrapper in ROLES.values():
            with contextlib.suppress(FileNotFoundError):
                (cluster.wrappers / node / wrapper).unlink()
    deadline = time.monotonic() + 60
    while _running("checks.fleet.slurm") and time.monotonic() < deadline:
        time.sleep(0.2)
    cluster.run("scontrol", "cancel_reboot", ",".join(NODES), check=False)
    subprocess.run(["scancel", "-u", "root"], env=cluster.env(), check=False, capture_output=True)
    cluster.wait_for(lambda: not cluster.run("squeue", "-h").strip(), 60, "jobs to end")
    cluster.reset()


def _running(needle: str) -> bool:
    out = subprocess.run(["pgrep", "-f", needle], capture_output=True, text=True, check=False)
    return bool(out.stdout.strip())


def _health_check(cluster: SlurmCluster, node: str, state: Path, scenario: str) -> int:
    """One health check by hand on `node`, --apply, as the wrapper runs it."""
    env = {**cluster.env(), "SLURMD_NODENAME": node}
    return subprocess.run([sys.executable, "-m", "checks.fleet.slurm", "health-check", "--apply",
                           "--state-dir", str(state), "--", "--simulate", scenario], env=env,
                          capture_output=True, timeout=180, check=False).returncode


def _show(cluster: SlurmCluster, node: str) -> str:
    """scontrol's State= of the node: MIXED+DRAIN+REBOOT_REQUESTED and the like."""
    out = cluster.run("scontrol", "-o", "show", "node", node)
    return out.split(" State=", 1)[1].split(" ", 1)[0]


def _job(cluster: SlurmCluster, node: str, command: str = "sleep 300") -> str:
    job = cluster.run("sbatch", "--parsable", "-w", node, "-o", "/dev/null", "--wrap",
                      command).strip()
    cluster.wait_for(lambda: "JobState=RUNNING" in cluster.run("scontrol", "-o", "show", "job",
                                                               job), 60, f"job {job} to run")
    return job


# -- (i) a pending reboot is never resumed away ---------------------------------------------------

def test_a_passing_check_leaves_a_reboot_requested_while_a_job_runs(env, tmp_path) -> None:
    """nodecert drained the node; an administrator asks for `scontrol reboot ASAP` while a job
    runs (Slurm keeps nodecert's reason); the next health check passes. Before: it resumed the
    node, and the RESUME cancelled the reboot. Now the reboot stays requested, the node drained."""
    node, state = "gd1", tmp_path / "state"
    _job(env, node)
    assert _health_check(env, node, state, FAULT) == 1
    drained, reason = env.node_state(node)
    assert drained == "draining" and reason.startswith("NODECERT: GPU002"), (drained, reason)
    env.run("scontrol", "reboot", "ASAP", "nextstate=RESUME", node)
    assert "REBOOT_REQUESTED" in _show(env, node)
    assert _health_check(env, node, state, HEALTHY) == 0
    assert "REBOOT_REQUESTED" in _show(env, node) and "DRAIN" in _show(env, node), _show(env, node)
    assert env.node_state(node)[1] == reason


def test_node_state_keeps_sinfos_reboot_flags(env, monkeypatch) -> None:
    monkeypatch.setenv("SLURM_CONF", str(env.conf))
    _job(env, "gd2")
    env.run("scontrol", "reboot", "gd2")
    seen = slurm_control.node_state("gd2")
    assert seen.reboot_pending and "@" in seen.flags and seen.state in ("allocated", "mixed"), seen
    # failing while in service: drained all the same (a plain reboot keeps jobs coming)
    failed = slurm_control.Verdict(True, "GPU002 ecc-errors x")
    assert slurm_control.decide("gd2", failed, seen, "NODECERT").kind == "drain"
    env.run("scontrol", "update", "NodeName=gd2", "State=DRAIN", "Reason=NODECERT: GPU002 x")
    seen = slurm_control.node_state("gd2")
    assert seen.drained and seen.reboot_pending
    passed = slurm_control.Verdict(False, "")
    assert slurm_control.decide("gd2", passed, seen, "NODECERT").kind == "none"
    assert slurm_control.decide("gd2", failed, seen, "NODECERT").kind == "none"


# -- (ii) an administrator's drain, reason, reboot or RESUME ends nodecert's hold ---------------

@pytest.mark.parametrize("admin", ["drain", "reason"])
def test_an_administrators_drain_or_reason_is_never_touched(env, tmp_path, admin) -> None:
    node, state = "gd2", tmp_path / "state"
    if admin == "drain":
        env.run("scontrol", "update", f"NodeName={node}", "State=DRAIN", "Reason=fan swap")
    else:  # nodecert drained it; the administrator rewrote the reason: now it is theirs
        assert _health_check(env, node, state, FAULT) == 1
        env.run("scontrol", "update", f"NodeName={node}", "Reason=RMA ticket 4711")
    kept = env.node_state(node)
    assert _health_check(env, node, state, FAULT) == 1  # fails: reason not overwritten
    assert env.node_state(node) == kept
    assert _health_check(env, node, state, HEALTHY) == 0  # passes: not resumed
    assert env.node_state(node) == kept and "drain" in kept[0]


def test_an_administrators_resume_lets_the_next_job_run(env, tmp_path) -> None:
    """nodecert drained the node; an administrator resumes it. Before: the Prolog drained it
    again for the verdict the administrator had overridden and bounced the job. Now the job
    runs; the next health check judges the node anew."""
    node, state = "gd3", tmp_path / "state"
    assert _health_check(env, node, state, FAULT) == 1
    assert env.node_state(node)[1].startswith("NODECERT: GPU002")
    env.run("scontrol", "update", f"NodeName={node}", "State=RESUME")
    written = subprocess.run([sys.executable, "-m", "checks.fleet.slurm", "scripts",
                              str(env.wrappers / node), "--state-dir", str(state)],
                             env=env.env(), capture_output=True, text=True, timeout=120)
    assert written.returncode == 0, written.stderr
    (env.wrappers / node / "nodecert-healthcheck").unlink()  # only the Prolog acts here
    ran = tmp_path / "ran"
    job = env.run("sbatch", "--parsable", "-w", node, "-o", "/dev/null", "--wrap",
                  f"touch {ran}").strip()
    env.wait_for(lambda: "JobState=COMPLETED" in env.run("scontrol", "-o", "show", "job", job),
                 60, f"job {job} to complete")
    assert ran.exists() and "drain" not in env.node_state(node)[0], env.node_state(node)
    # a fresh failing verdict drains again: the hold ended, checking did not
    assert _health_check(env, node, state, FAULT) == 1
    assert "drain" in env.node_state(node)[0]


# -- (iii) the reason: short for people, whole in the kept report ------------------------------

def test_slurm_keeps_a_long_reason_whole_and_ours_is_cut_keeping_code_and_count(env) -> None:
    long = "NODECERT: " + " ".join(f"w{i:04d}" for i in range(400))
    env.run("scontrol", "update", "NodeName=gd1", "State=DRAIN", f"Reason={long}")
    assert env.node_state("gd1")[1] == long  # Slurm's own limit is not what cuts it
    summary = ("GPU005 xid-events XID 79 on 0000:3a:00.0: GPU has fallen off the bus and is not "
               "responding to commands, logged 3 times since boot by the driver (+4 more)")
    reason = slurm.drain_reason("NODECERT", summary)
    assert len(reason) <= slurm_control.REASON_MAX
    assert reason.startswith("NODECERT: GPU005 xid-events XID 79 on 0000:3a:00.0")
    assert reason.endswith("... (+4 more)"), reason


# -- (iv) a configuration failure pushed to every node -------------------------------------------

@pytest.mark.parametrize("broken", ["typo", "interpreter"])
def test_a_broken_wrapper_on_every_node_drains_at_most_the_budget(env, tmp_path, broken) -> None:
    """Every node's health check wrapper fails (a typo: exit 2; a moved interpreter: 127) and
    slurmd runs them every 2 s. Before: every node drained within one interval and the 127 left
    no textfile. Now at most the budget (1 of 3) stays drained, and every node publishes
    nodecert_host_healthy 0 and nodecert_config_failure 1 from the shell."""
    proms = {}
    for node in NODES:
        proms[node] = tmp_path / node / "prom"
        written = subprocess.run([sys.executable, "-m", "checks.fleet.slurm", "scripts",
                                  str(env.wrappers / node), "--state-dir", str(tmp_path / node),
                                  "--textfile-dir", str(proms[node])],
                                 env=env.env(), capture_output=True, text=True, timeout=120)
        assert written.returncode == 0, written.stderr
        (env.wrappers / node / "nodecert-prolog").unlink()
        wrapper = env.wrappers / node / "nodecert-healthcheck"
        text = wrapper.read_text()
        if broken == "typo":  # pushed after `scripts` checked the options
            text = text.replace("--apply ", "--apply --expect-gpuz 8 ", 1)
        else:
            text = text.replace(sys.executable, "/opt/moved/bin/python3", 1)
        wrapper.write_text(text)
    code = "2" if broken == "typo" else "127"

    def drained() -> list[str]:
        return [n for n in NODES if "drain" in env.node_state(n)[0]]

    def published() -> bool:
        return all((proms[n] / "nodecert.prom").exists() for n in NODES)

    env.wait_for(published, 60, "every node's textfile")
    seen = set()
    deadline = time.monotonic() + 12  # six health check intervals
    while time.monotonic() < deadline:
        now = drained()
        seen.add(len(now))
        time.sleep(0.3)
    assert max(seen) < len(NODES), seen  # never every node
    # runs that drained in the same instant may keep one more for an interval; the one that is
    # not among the first names resumes itself at its next run
    env.wait_for(lambda: len(drained()) == 1, 20, "the drains to settle at the budget (1 of 3)")
    for node in drained():
        assert env.node_state(node)[1] == (f"NODECERT: nodecert-config health-check exited {code}:"
                                           " nodecert's configuration failed, not the node")
    for node in NODES:
        text = (proms[node] / "nodecert.prom").read_text()
        assert samples(text, "nodecert_host_healthy") == {(
            "nodecert_host_healthy",
            frozenset({"host": node, "level": "quick", "profile": ""}.items()), 0.0)}, text
        assert samples(text, "nodecert_config_failure") == {(
            "nodecert_config_failure",
            frozenset({"host": node}.items()), 1.0)}


# -- (v) scripts refuses a typo in the options it passes through --------------------------------

def test_scripts_refuses_options_the_checks_would_refuse(tmp_path) -> None:
    out = tmp_path / "wrappers"
    proc = subprocess.run([sys.executable, "-m", "checks.fleet.slurm", "scripts", str(out),
                           "--", "--expect-gpuz", "8"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and not out.exists(), proc
    assert proc.stderr.count("\n") == 1 and "--expect-gpuz" in proc.stderr
    assert proc.stderr.startswith("error: the options after -- are refused by python -m checks")
    assert "Traceback" not in proc.stderr
