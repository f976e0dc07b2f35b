"""The remediation loop's limits across nodes, under a real slurmctld/slurmd
(tests/fleet/remediation_cluster.py): the breaker and the budget when three nodes fail at once,
and a flapping node escalated. Every node runs its own loop, as each node's timer does."""

from __future__ import annotations

import itertools
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from remediation_cluster import BootableCluster, Node, bootable_cluster, node_set, until


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[BootableCluster]:
    yield from bootable_cluster(tmp_path_factory.mktemp("limits"), "1")


@pytest.fixture()
def nodes(cluster, tmp_path) -> Iterator[dict[str, Node]]:
    yield from node_set(cluster, tmp_path)


def _together(nodes: dict[str, Node], *args: str) -> dict[str, str]:
    """One timer run on every node at the same moment; each node's output."""
    out: dict[str, str] = {}

    def one(node: Node) -> None:
        proc = node.remediate(*args)
        out[node.name] = proc.stdout + proc.stderr
        assert proc.returncode in (0, 1), out[node.name]

    threads = [threading.Thread(target=one, args=(n,)) for n in nodes.values()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def _breaker(node: Node) -> str:
    prom = (node.textfiles / "nodecert-remediation.prom").read_text()
    return next(line.rsplit(" ", 1)[1] for line in prom.splitlines()
                if line.startswith("nodecert_remediation_breaker_open{"))


def test_e_three_nodes_failing_at_once_open_the_breaker_then_remediate_one_at_a_time(nodes) -> None:
    for node in nodes.values():
        node.use("fault-xid-79")
        assert node.health_check("--max-drain-fraction", "1") == 1
        node.on_reboot("h100-sxm-8x-healthy")
    # the breaker: three drains by nodecert within the window open it on every node's loop
    out = _together(nodes, "--breaker-drains", "3")
    for node in nodes.values():
        assert "breaker-open" in out[node.name] and "wait (breaker)" in out[node.name], out
        assert node.sinfo()[1].startswith("NODECERT: GPU005") and _breaker(node) == "1"
    out = _together(nodes)  # it stays open, whatever the options now say
    assert all("wait (breaker)" in text for text in out.values()), out
    assert sum(n.reboots() for n in nodes.values()) == 0
    # an operator resets it on every node (pdsh -w rm[1-3] nodecert-remediate --reset-breaker)
    _together(nodes, "--reset-breaker")
    assert all(_breaker(n) == "0" for n in nodes.values())
    # the budget: one node of three (--max-remediating-fraction 0.10, at least one) at a time.
    # Timer runs until all three are back, bounded in time, not in runs: three reboots one after
    # the other (2 s each, with registration and verification) take more runs on a loaded host.
    deadline = time.monotonic() + 120
    while not all(n.in_service() for n in nodes.values()):
        if time.monotonic() > deadline:
            raise AssertionError({n.name: n.sinfo() for n in nodes.values()})
        out = _together(nodes)
        time.sleep(0.3)
    assert [n.reboots() for n in nodes.values()] == [1, 1, 1]
    spans = sorted((next(a["t"] for a in n.actions() if a["action"] == "reboot"),
                    next(a["t"] for a in n.actions() if a["action"] == "resume"), n.name)
                   for n in nodes.values())
    for (_, resumed, first), (claimed, _, second) in itertools.pairwise(spans):
        assert claimed > resumed, f"{second} rebooted while {first} was in remediation: {spans}"
    waited = [n.name for n in nodes.values()
              if any(a["action"] == "wait" and a["result"] == "budget" for a in n.actions())]
    assert len(waited) == 2, waited


def test_g_a_flapping_node_escalates_instead_of_cycling(nodes) -> None:
    node = nodes["rm1"]
    options = ("--flap-limit", "2", "--repeat-limit", "9")
    for _ in range(2):  # thermal throttling (GPU007, recheck) that passes when checked again
        node.use("fault-thermal-throttle")
        assert node.health_check() == 1
        node.use("h100-sxm-8x-healthy")
        until(node, node.in_service, 3, *options)
    node.use("fault-thermal-throttle")
    assert node.health_check() == 1
    node.use("h100-sxm-8x-healthy")  # it would pass a third time: flapping stops it anyway
    out = until(node, lambda: "RMA" in node.sinfo()[1], 3, *options)
    state, reason = node.judged()
    assert state == "drained" and reason.startswith("NODECERT: RMA GPU007 1650123000006 bundle "), reason
    assert "flapping: 2 drain/resume cycles within a day" in out[-1]
    for _ in range(2):  # later timer runs leave it drained, and the health check too
        node.remediate(*options)
    assert node.health_check() == 0 and node.judged() == (state, reason)
    assert [a["action"] for a in node.actions()].count("resume") == 2
    assert node.actions()[-1]["action"] == "escalate" and node.reboots() == 0
