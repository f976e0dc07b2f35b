"""The remediation loop under a real slurmctld/slurmd (tests/fleet/remediation_cluster.py): one
node at a time, reboots through Slurm, GPU resets, verification, escalation, jobs and an
administrator's actions. The limits across nodes (budget, breaker, flapping) are in
test_slurm_remediate_limits.py."""

from __future__ import annotations

import json
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from remediation_cluster import (
    SCENARIOS,
    SERIAL4,
    BootableCluster,
    Node,
    Sampler,
    bootable_cluster,
    node_set,
    until,
)

UUID4 = "GPU-6f1b0d6a-0000-4000-8000-000000000004"  # GPU 4 of h100-sxm-8x-healthy (0000:9a:00.0)


@pytest.fixture(scope="module")
def rts1(tmp_path_factory) -> Iterator[BootableCluster]:
    yield from bootable_cluster(tmp_path_factory.mktemp("rts1"), "1")


@pytest.fixture(scope="module")
def rts2(tmp_path_factory) -> Iterator[BootableCluster]:
    yield from bootable_cluster(tmp_path_factory.mktemp("rts2"), "2")


@pytest.fixture()
def nodes(request, tmp_path) -> Iterator[dict[str, Node]]:
    """The cluster's nodes for one test (the cluster is the test's parameter, else rts1)."""
    yield from node_set(request.getfixturevalue(getattr(request, "param", "rts1")), tmp_path)


@pytest.mark.parametrize("nodes", ["rts1", "rts2"], indirect=True)
def test_a_reboot_fixed_by_the_reboot_returns_after_one_reboot_and_a_passing_verification(
        nodes) -> None:
    node = nodes["rm1"]
    node.use("fault-xid-79")
    assert node.health_check() == 1
    assert node.sinfo()[1].startswith("NODECERT: GPU005 xid-events XID 79")
    node.on_reboot("h100-sxm-8x-healthy")
    with Sampler(node.cluster, [node.name]) as sampler:
        until(node, lambda: node.sinfo() == ("idle", ""))
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
        until(node, lambda: "RMA" in node.sinfo()[1], 30)
        reason = node.sinfo()[1]
        for _ in range(2):  # later timer runs: nothing more
            node.remediate()
        time.sleep(1)
    assert node.reboots() == 2
    assert "idle" not in sampler.states(node.name), sampler.seen
    assert node.judged() == ("drained", reason)
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
    assert node.judged() == ("drained", "disk replaced, ops ticket 42")
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
    assert node.judged() == ("drained", "ops: keep for the vendor")
    assert node.remediate().returncode == 0 and node.judged() == ("drained", "ops: keep for the vendor")
    prom = (node.textfiles / "nodecert-remediation.prom").read_text()
    assert f'nodecert_remediation_breaker_open{{host="{node.name}"}} 1' in prom
    assert node.remediate("--reset-breaker").returncode == 0
    prom = (node.textfiles / "nodecert-remediation.prom").read_text()
    assert f'nodecert_remediation_breaker_open{{host="{node.name}"}} 0' in prom
    assert node.reboots() == 1  # the administrator's only


def _job_state(node: Node, job: str) -> str:
    return node.cluster.run("squeue", "-h", "-j", job, "-o", "%T", check=False).strip()


def test_c_a_node_running_a_job_is_rebooted_only_after_the_job_and_a_passing_check_keeps_the_reboot(
        nodes, tmp_path) -> None:
    node = nodes["rm2"]
    done = tmp_path / "job-may-end"  # the job runs until the test lets it end
    job = node.cluster.run("sbatch", "--parsable", "-w", node.name, "-o", "/dev/null", "--wrap",
                           f"while [ ! -e {done} ]; do sleep 0.2; done").strip()
    node.cluster.wait_for(lambda: _job_state(node, job) == "RUNNING", 30, "the job to run")
    node.use("fault-xid-79")
    assert node.health_check() == 1
    node.on_reboot("h100-sxm-8x-healthy")
    out = node.remediate().stdout
    assert "reboot (ok): detected -> rebooting: issued while jobs run" in out, out
    state, reason = node.judged()
    assert "@" in state and reason.startswith("NODECERT: REBOOT GPU005 1/2"), (state, reason)
    # the fault clears before the reboot: the health check passes, and a timer run comes
    node.use("h100-sxm-8x-healthy")
    assert node.health_check() == 0
    out = node.remediate().stdout
    assert "wait (reboot)" in out and "ran:" not in out, out
    assert _job_state(node, job) == "RUNNING"
    assert node.judged() == (state, reason) and node.reboots() == 0  # pending, not cancelled
    ended = time.time()
    done.touch()
    node.cluster.wait_for(lambda: _job_state(node, job) == "", 30, "the job to end")
    until(node, lambda: node.sinfo() == ("idle", ""), 40)
    [rebooted] = node.reboot_times()
    assert rebooted > ended  # Slurm rebooted it once the job had ended, not before
    acts = [a["action"] for a in node.actions()]
    assert acts.count("reboot") == 1 and acts[-2:] == ["verify", "resume"], acts


XID_119 = """description: XID 119 (GSP RPC timeout) on GPU 4; NVIDIA's catalog action RESET_GPU.
extends: {base}
gpu_defaults: {{compute_processes: {processes}}}
host:
  kernel_log:
    - "[    6.002] NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  550.90.07"
    - "[81234.551] NVRM: GPU at PCI:0000:9a:00: GPU-6f1b0d6a-0000-4000-8000-000000000004"
    - "[81234.552] NVRM: Xid (PCI:0000:9a:00): 119, pid=1234, name=python, Timeout after 6s of \
waiting for RPC response from GPU4 GSP! Expected function 76 (GSP_RM_CONTROL) (0x20802a02 0x8)."
"""


def test_f_an_xid_whose_remedy_is_a_gpu_reset_passes_after_the_reset_without_a_reboot(
        nodes, tmp_path) -> None:
    node = nodes["rm3"]
    scenario = tmp_path / "xid-119.yaml"  # the XID stays in the kernel log, as after a real reset
    base = SCENARIOS / "h100-sxm-8x-healthy.yaml"
    scenario.write_text(XID_119.format(base=base, processes="[{pid: 4242, used_memory_bytes: 1}]"))
    node.use(scenario)
    assert node.health_check() == 1
    assert node.sinfo()[1].startswith("NODECERT: GPU005 xid-events XID 119")
    out = node.remediate().stdout  # a process (outside any job) holds the GPUs: no reset
    assert "wait (gpu-busy)" in out and "pid 4242" in out and "ran:" not in out, out
    scenario.write_text(XID_119.format(base=base, processes="[]"))  # it has gone
    with Sampler(node.cluster, [node.name]) as sampler:
        until(node, lambda: node.sinfo() == ("idle", ""), 10)
    assert node.reboots() == 0
    acts = node.actions()
    assert [(a["action"], a["result"]) for a in acts] == [
        ("detect", "ok"), ("wait", "gpu-busy"), ("gpu-reset", "ok"), ("verify", "ok"),
        ("resume", "ok")], acts
    assert acts[0]["remedy"] == "gpu-reset" and acts[2]["gpus"] == [UUID4]
    [marker] = json.loads((node.state / "gpu-resets.json").read_text())
    assert marker["uuid"] == UUID4 and marker["pci"] == "0000:9a:00.0"
    assert marker["clock_s"] == 81234.552  # the fixture's clock: the recording's last stamp
    kept = json.loads((node.state / "last.json").read_text())
    assert kept["level"] == "standard" and kept["verdict"] == "PASS"
    [xid] = [c for c in kept["checks"] if c["id"] == "xid-events"]
    assert xid["status"] == "PASS" and xid["results"][0]["details"]["lines_before_gpu_reset"] == 1
    reasons = [s[node.name].split("|")[1] for _, s in sampler.seen]
    assert any(r.startswith("NODECERT: VERIFY GPU005 after gpu-reset 1/2") for r in reasons), reasons
    assert "idle" not in sampler.states(node.name)[:-1]
    assert sampler.first(node.name, "idle") >= acts[3]["t"]  # idle only after the verification
