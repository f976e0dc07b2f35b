"""Slurm node names that are not a host's short name, against a real cluster
(tests/fleet/slurmcluster.py): a fully qualified NodeName whose slurmd runs on a host of that
name, and a NodeName whose NodeHostname differs (slurmd finds its NodeName from the host name).
Each is matched exactly (checks.fleet.slurm_control.match_node): by the programs slurmd runs
($SLURMD_NODENAME), by a run outside slurmd (cron: the host's own name), by a host report and a
fleet summary, and by the wrapper's own fail-closed shell."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from checks.devtools import synthetic
from checks.devtools.synthetic import Broken
from checks.fleet import fleet_cli, slurm, slurm_conf
from checks.fleet.slurm_control import match_node

sys.path.insert(0, str(Path(__file__).resolve().parent))
from slurmcluster import SlurmCluster, local_cluster, pointed_at

FQDN, OTHER = "gpu21.cluster.example", "slot3"
NODES = (FQDN, OTHER)
HOSTNAMES = {OTHER: "hostb"}  # NodeName=slot3 NodeHostname=hostb
XID_REASON = "NODECERT: GPU005 xid-events"
ECC = Broken("node0000", "ecc-errors", gpu=5, message="GPU5: 2 volatile uncorrectable ECC errors")


@pytest.mark.parametrize(("host", "node"), [
    (FQDN, FQDN),                       # the NodeName itself
    ("gpu21", None),                    # no prefix or suffix matching
    ("GPU21.cluster.example", None),    # no case folding
    ("hostb", OTHER),                   # by NodeHostname
    ("hostb.cluster.example", OTHER),   # its short name, by NodeHostname
    ("slot3.cluster.example", OTHER),   # its short name, by NodeName
    ("hostc", None),
])
def test_a_host_name_is_matched_exactly(host: str, node: str | None) -> None:
    assert match_node(host, {FQDN: FQDN, OTHER: "hostb"}) == node


def test_a_host_name_two_nodes_share_matches_none() -> None:
    """Several slurmd on one host (NodeHostname shared): the host name alone names no node."""
    assert match_node("big", {"a": "big", "b": "big"}) is None
    assert match_node("a", {"a": "big", "b": "big"}) == "a"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[SlurmCluster]:
    base = tmp_path_factory.mktemp("names")
    shim = base / "env-probe"  # what slurmd gives the HealthCheckProgram, per host
    shim.write_text(f'#!/bin/sh\nenv > {base}/env.$(uname -n)\n')
    shim.chmod(0o755)
    conf = {"HealthCheckProgram": str(shim), "HealthCheckInterval": "2",
            "HealthCheckNodeState": "ANY"}
    with local_cluster(base / "cluster", NODES, hostnames=HOSTNAMES, extra_conf=conf) as c:
        c.probes = base  # type: ignore[attr-defined]
        yield c


@pytest.fixture()
def slurm_env(cluster, monkeypatch) -> SlurmCluster:
    monkeypatch.delenv("SLURMD_NODENAME", raising=False)
    return pointed_at(cluster, monkeypatch)


def test_slurmd_gives_its_programs_the_node_name_not_the_host_name(slurm_env) -> None:
    for node in NODES:
        probe = slurm_env.probes / f"env.{slurm_env.hostname(node)}"
        slurm_env.wait_for(probe.exists, 60, f"{node}'s health check")
        env = dict(line.split("=", 1) for line in probe.read_text().splitlines() if "=" in line)
        assert env.get("SLURMD_NODENAME") == node, env


def _in_node(cluster: SlurmCluster, node: str, *cmd: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in cluster.env().items() if k != "SLURMD_NODENAME"}
    return subprocess.run(cluster.in_node(node, *cmd), env=env, capture_output=True, text=True,
                          timeout=180, check=False)


@pytest.mark.parametrize("node", NODES)
def test_a_run_outside_slurmd_finds_its_node_from_the_host_name(slurm_env, tmp_path, node) -> None:
    """No $SLURMD_NODENAME (cron, by hand): the host's own name (gpu21.cluster.example; hostb)
    names the node, and that node is the one drained."""
    done = _in_node(slurm_env, node, sys.executable, "-m", "checks.fleet.slurm", "health-check",
                    "--apply", "--state-dir", str(tmp_path / "state"), "--", "--simulate",
                    "fault-xid-79")
    assert done.returncode == 1, done.stderr
    state, reason = slurm_env.node_state(node)
    assert "drain" in state and reason.startswith(XID_REASON), (state, reason)
    other = next(n for n in NODES if n != node)
    assert slurm_env.node_state(other) == ("idle", "")


def _report(tmp_path: Path, base: dict[str, Any], host: str) -> Path:
    [report] = synthetic.build(1, base=base, broken=[ECC])
    report["host"] = host
    path = tmp_path / "host.json"
    path.write_text(json.dumps(report))
    return path


@pytest.mark.parametrize(("host", "node"), [(FQDN, FQDN), ("hostb.cluster.example", OTHER)])
def test_a_host_report_drains_the_node_its_host_names(slurm_env, tmp_path, h100_report, host,
                                                     node) -> None:
    assert slurm.main(["report", str(_report(tmp_path, h100_report, host)), "--apply"]) == 1
    state, reason = slurm_env.node_state(node)
    assert "drain" in state and reason.startswith("NODECERT: GPU002 ecc-errors"), (state, reason)


def test_a_host_no_node_matches_exactly_is_exit_3(slurm_env, tmp_path, h100_report, capsys) -> None:
    assert slurm.main(["report", str(_report(tmp_path, h100_report, "gpu21")), "--apply"]) == 3
    err = capsys.readouterr().err
    assert err == ("error: sinfo knows no node for host 'gpu21' (matched exactly: a NodeName or "
                   "NodeHostname equal to the full, then the short name)\n")
    assert all(slurm_env.node_state(n) == ("idle", "") for n in NODES)


def test_a_fleet_summary_names_fully_qualified_nodes(slurm_env, tmp_path, h100_report) -> None:
    reports = synthetic.build(2, base=h100_report, broken=[ECC])
    reports[0]["host"], reports[1]["host"] = FQDN, "hostb"
    directory = synthetic.write(reports, tmp_path / "reports" / "r1")
    summary = tmp_path / "fleet.json"
    assert fleet_cli.main(["report", str(directory), "--json", str(summary), "-q",
                           "--no-history"]) == 1
    assert slurm.main(["report", str(summary), "--apply", "--max-drain-fraction", "1"]) == 1
    state, reason = slurm_env.node_state(FQDN)
    assert "drain" in state and reason.startswith("NODECERT: fleet host FAIL ecc-errors"), reason
    assert slurm_env.node_state(OTHER) == ("idle", "")


def test_the_fail_closed_shell_finds_a_fully_qualified_node(slurm_env, tmp_path) -> None:
    """The wrapper's own drain (its run exited 1) without $SLURMD_NODENAME: the host's full
    name is a node, so that node is drained."""
    python = tmp_path / "python3"
    python.write_text("#!/bin/sh\nexit 1\n")
    python.chmod(0o755)
    plan = slurm_conf.Plan(check_timeout_s=35, slurm_call_timeout_s=10, prolog_call_timeout_s=2.5,
                           budget_s=None, health_check_max_s=35, epilog_max_s=300)
    import shutil

    slurm.write_scripts(tmp_path / "w", tmp_path / "st", "NODECERT", plan, [], python=str(python),
                        scontrol=shutil.which("scontrol"))
    done = _in_node(slurm_env, FQDN, "/bin/sh", str(tmp_path / "w" / "nodecert-healthcheck"))
    assert done.returncode == 1, done.stderr
    assert slurm_env.node_state(FQDN)[1] == ("NODECERT: nodecert-config health-check exited 1: "
                                             "nodecert's configuration failed, not the node")
