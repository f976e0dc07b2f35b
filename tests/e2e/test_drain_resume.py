"""The drain and resume steps of the rolling reboots (playbooks/tasks/drain.yml, resume.yml), run
by ansible-playbook against a real Slurm cluster on this machine (tests/fleet/slurmcluster.py:
munged, slurmctld, slurmd). Only the reboot between them is left out: a chroot cannot reboot.
kubectl is not installed here, so the Kubernetes steps find no node and do nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "fleet"))
from slurmcluster import SlurmCluster, local_cluster  # noqa: E402

pytestmark = [pytest.mark.timeout(300)]

NODES = ("gpu01", "gpu02")
REASON = "provision: reboot to load NVIDIA driver 580.95.05"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[SlurmCluster]:
    with local_cluster(tmp_path_factory.mktemp("slurm"), NODES) as c:
        yield c


def drain_then_resume(
    cluster: SlurmCluster, tmp_path: Path, node: str
) -> tuple[dict, subprocess.CompletedProcess]:
    """One play: drain.yml, the node's Slurm state written down, then resume.yml."""
    between = tmp_path / "between.json"
    play = [
        {
            "name": "Drain and resume",
            "hosts": "localhost",
            "gather_facts": False,
            "vars": {
                "_provision_drain_slurm": True,
                "_provision_drain_kubernetes": True,
                "_provision_slurm_node_name": node,
                "_provision_kubernetes_node_name": node,
                "_provision_drain_timeout": 60,
                "_provision_drain_reason": REASON,
            },
            "tasks": [
                {"name": "Drain", "ansible.builtin.import_tasks": str(REPO / "playbooks/tasks/drain.yml")},
                {
                    "name": "Read the state between",
                    "ansible.builtin.command": {"argv": ["sinfo", "-h", "-N", "-n", node, "-o", "%T|%E"]},
                    "register": "between",
                    "changed_when": False,
                },
                {
                    "name": "Write it down",
                    "ansible.builtin.copy": {
                        "dest": str(between),
                        "content": "{{ between.stdout | to_json }}",
                        "mode": "0644",
                    },
                },
                {"name": "Resume", "ansible.builtin.import_tasks": str(REPO / "playbooks/tasks/resume.yml")},
            ],
        }
    ]
    playbook = tmp_path / "drain.yml"
    playbook.write_text(yaml.safe_dump(play, sort_keys=False))
    env = {
        "PATH": f"{REPO / '.venv/bin'}:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": str(tmp_path),
        "LANG": "C.UTF-8",
        "SLURM_CONF": str(cluster.conf),
        "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"),
    }
    proc = subprocess.run(
        [
            str(REPO / ".venv/bin/ansible-playbook"),
            "-i",
            "localhost,",
            "-c",
            "local",
            "-e",
            f"ansible_python_interpreter={sys.executable}",
            str(playbook),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )
    state, _, reason = json.loads(between.read_text()).partition("|") if between.exists() else ("", "", "")
    return {"state": state, "reason": reason}, proc


def test_an_idle_node_is_drained_with_the_reason_then_resumed(cluster, tmp_path):
    cluster.reset()
    between, proc = drain_then_resume(cluster, tmp_path, "gpu01")
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert between == {"state": "drained", "reason": REASON}
    assert cluster.node_state("gpu01") == ("idle", "")
    assert cluster.node_state("gpu02") == ("idle", "")  # the other node untouched


def test_a_node_the_admin_drained_stays_drained(cluster, tmp_path):
    cluster.reset()
    cluster.run("scontrol", "update", "NodeName=gpu02", "State=DRAIN", "Reason=bad DIMM, ticket 4711")
    between, proc = drain_then_resume(cluster, tmp_path, "gpu02")
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert between == {"state": "drained", "reason": "bad DIMM, ticket 4711"}
    assert cluster.node_state("gpu02") == ("drained", "bad DIMM, ticket 4711")


def test_a_host_slurm_does_not_know_is_left_alone(cluster, tmp_path):
    cluster.reset()
    _between, proc = drain_then_resume(cluster, tmp_path, "not-a-slurm-node")
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert (
        "Drain in Slurm the host not-a-slurm-node" in proc.stdout and "skipping: [localhost]" in proc.stdout
    )
    assert [cluster.node_state(n)[0] for n in NODES] == ["idle", "idle"]
