"""Cross-host stage: group planning, culprit naming, and real c10d rendezvous across "hosts"
(processes on 127.0.0.1 with their own ports), merged into the fleet report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from checks.fleet import crosshost_plan as crosshost
from checks.fleet import fleet_cli
from checks.node import crosshost_node as node_cli
from checks.supervise.launch import free_port

ROOT = Path(__file__).resolve().parents[2]


def test_plan_all_hosts_in_one_group() -> None:
    p = crosshost.plan(["a", "b", "c"], "all", 29500, "run1", addresses={"a": "10.0.0.1"})
    (groups,) = p["rounds"]
    assert groups == [{"id": "r0g0", "hosts": ["a", "b", "c"], "port": 29500,
                       "endpoint": "10.0.0.1:29500", "rdzv_id": "run1-r0g0"}]
    assert p["hosts"]["c"] == [{"group": "r0g0", "nnodes": 3, "node_rank": 2,
                                "endpoint": "10.0.0.1:29500", "rdzv_id": "run1-r0g0"}]


def test_plan_pairs_then_shifted_pairs_meet_two_partners() -> None:
    p = crosshost.plan(["a", "b", "c", "d"], "pairs")
    assert [[g["hosts"] for g in r] for r in p["rounds"]] == [[["a", "b"], ["c", "d"]],
                                                              [["b", "c"], ["d", "a"]]]
    ports = [g["port"] for r in p["rounds"] for g in r]
    assert len(set(ports)) == len(ports)
    partners = {h: {m for a in p["hosts"][h] for g in p["rounds"] for grp in g
                    if grp["id"] == a["group"] for m in grp["hosts"]} - {h} for h in "abcd"}
    assert all(len(v) == 2 for v in partners.values())


def test_plan_odd_and_degenerate_cases() -> None:
    p = crosshost.plan(["a", "b", "c", "d", "e"], "pairs")
    assert [g["hosts"] for g in p["rounds"][0]] == [["a", "b"], ["c", "d", "e"]]
    assert crosshost.plan(["a"], "pairs")["rounds"] == []
    with pytest.raises(ValueError):
        crosshost.plan(["a", "a"])


def node_report(status: str, ranks: dict[str, dict[str, Any]] | None = None,
                message: str = "m") -> dict[str, Any]:
    result = {"status": status, "message": message, "details": {"ranks": ranks or {}}}
    return {"checks": [{"id": "xhost-collective", "status": status, "results": [result]}]}


def test_analysis_names_the_host_that_did_not_report() -> None:
    p = crosshost.plan(["a", "b", "c"])
    a = crosshost.analyse(p, {"r0g0": {"a": node_report("FAIL"), "b": node_report("FAIL")}})
    assert a.suspects == ["c"] and "did not report" in a.groups[0].reason


def test_analysis_names_the_least_advanced_host_in_a_hang() -> None:
    p = crosshost.plan(["a", "b"])
    reports = {"a": node_report("FAIL", {"0": {"state": "hung", "seq": 9, "phase": "x"}}),
               "b": node_report("FAIL", {"1": {"state": "hung", "seq": 7, "phase": "y"}})}
    a = crosshost.analyse(p, {"r0g0": reports})
    assert a.groups[0].culprits == ["b"] and "'y'" in a.groups[0].reason


def test_analysis_blames_the_crash_not_the_peer_that_lost_it() -> None:
    p = crosshost.plan(["a", "b"])
    reports = {"a": node_report("FAIL", {"0": {"state": "error", "seq": 3,
                                               "error": "Connection closed by peer"}}),
               "b": node_report("FAIL", {"1": {"state": "crashed", "seq": 3, "exitcode": -9}})}
    assert crosshost.analyse(p, {"r0g0": reports}).suspects == ["b"]


def test_pairwise_isolates_a_bad_host_and_a_bad_link() -> None:
    p = crosshost.plan(["a", "b", "c", "d"], "pairs")
    ok, bad = node_report("PASS"), node_report("FAIL")
    # d is broken: both its pairs fail; a and c pass elsewhere.
    a = crosshost.analyse(p, {"r0g0": {"a": ok, "b": ok}, "r0g1": {"c": bad, "d": bad},
                              "r1g0": {"b": ok, "c": ok}, "r1g1": {"d": bad, "a": bad}})
    assert a.suspects == ["d"] and a.bad_links == []
    # only the a<->b link is bad: both pass with their other partner.
    a = crosshost.analyse(p, {"r0g0": {"a": bad, "b": bad}, "r0g1": {"c": ok, "d": ok},
                              "r1g0": {"b": ok, "c": ok}, "r1g1": {"d": ok, "a": ok}})
    assert a.suspects == [] and a.bad_links == [["a", "b"]]


def test_node_refuses_a_wildcard_endpoint(capsys: pytest.CaptureFixture[str]) -> None:
    code = node_cli.main(["--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint",
                          "0.0.0.0:29400", "--rdzv-id", "x"])
    assert code == 2 and "never 0.0.0.0" in capsys.readouterr().err


def start_node(out: Path, host: str, rank: int, nnodes: int, port: int, stages: str,
               extra_env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "checks.node.crosshost_node", "--nnodes", str(nnodes),
           "--node-rank", str(rank), "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "t",
           "--group", "r0g0", "--host", host, "--stages", stages, "--json", str(out / f"{host}.json"),
           "--stall", "20", "--timeout", "120", "--join-timeout", "60"]
    env = {**os.environ, **(extra_env or {})}
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def write_run(tmp_path: Path, hosts: list[str], plan_port: int) -> Path:
    """A run directory as verify.yml leaves it: host reports plus crosshost/<group>/."""
    run = tmp_path / "run"
    (run / "crosshost" / "r0g0").mkdir(parents=True)
    the_plan = crosshost.plan(hosts, "all", plan_port, "t", {h: "127.0.0.1" for h in hosts})
    (run / "crosshost" / "plan.json").write_text(json.dumps(the_plan))
    for host in hosts:
        code = subprocess.run([sys.executable, "-m", "checks", "--simulate", "cpu-only-healthy",
                               "--level", "quick", "-q", "--json", str(run / f"{host}.json")],
                              cwd=ROOT, check=False).returncode
        assert code == 0
    return run / "crosshost" / "r0g0"


@pytest.mark.slow
def test_real_rendezvous_across_two_hosts_passes_and_merges(tmp_path: Path) -> None:
    port = free_port()
    out = write_run(tmp_path, ["h0", "h1"], port)
    procs = [start_node(out, f"h{i}", i, 2, port, "collective,ddp") for i in range(2)]
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    code = fleet_cli.main(["report", str(tmp_path / "run"), "--no-history", "-q",
                           "--json", str(tmp_path / "fleet.json")])
    assert code == 0
    merged = json.loads((tmp_path / "run" / "h1.json").read_text())
    ids = {c["id"]: c["status"] for c in merged["checks"]}
    assert ids["xhost-collective"] == "PASS" and ids["xhost-ddp"] == "PASS"


@pytest.mark.slow
def test_hung_host_is_named_and_its_peer_is_only_a_victim(tmp_path: Path) -> None:
    port = free_port()
    out = write_run(tmp_path, ["h0", "h1"], port)
    procs = [start_node(out, "h0", 0, 2, port, "collective"),
             start_node(out, "h1", 1, 2, port, "collective",
                        {"NODECERT_INJECT": "hang:*@check all_reduce 1"})]
    assert [p.wait(timeout=200) for p in procs] == [1, 1]
    assert fleet_cli.main(["report", str(tmp_path / "run"), "--no-history", "-q"]) == 1
    analysis = json.loads((tmp_path / "run" / "crosshost" / "analysis.json").read_text())
    assert analysis["suspects"] == ["h1"]
    statuses = {h: {c["id"]: c["status"] for c in json.loads(
        (tmp_path / "run" / f"{h}.json").read_text())["checks"]}["xhost-collective"]
        for h in ("h0", "h1")}
    assert statuses == {"h0": "WARN", "h1": "FAIL"}


@pytest.mark.slow
def test_host_that_never_joins_is_named_and_the_run_ends(tmp_path: Path) -> None:
    port = free_port()
    out = write_run(tmp_path, ["h0", "h1"], port)
    proc = start_node(out, "h0", 0, 2, port, "collective")
    assert proc.wait(timeout=200) == 1  # the rendezvous times out; h0 reports, h1 never does
    assert fleet_cli.main(["report", str(tmp_path / "run"), "--no-history", "-q"]) == 1
    analysis = json.loads((tmp_path / "run" / "crosshost" / "analysis.json").read_text())
    assert analysis["suspects"] == ["h1"]
    assert "did not report" in analysis["groups"][0]["reason"]
