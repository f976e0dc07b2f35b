"""The cross-host stage over real links: every host a network namespace with its own address on
a bridge the test makes (tests/netlab.py), the real `python -m checks.node.crosshost_node` on each,
then the controller's merge and analysis (`checks.fleet report`), with links broken in the
kernel: a host rate-limited with tc tbf, a host whose link is down, a host blackholing the
rendezvous address, a multi-homed host whose hostname resolves to an interface that reaches no
one. Rounds run one after the other as verify.yml runs them; the groups of a round at once.

Traffic stays on the lab's 10.243-252.x.0/24 addresses (the bridge has no address of this
machine and the namespaces no route out). Root only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # importlib mode: tests/ for netlab

from netlab import NetLab, missing_tools

from checks.fleet import crosshost_plan as crosshost
from checks.fleet import fleet_cli
from checks.node.rails import parse_rails
from checks.report import load

ROOT = Path(__file__).resolve().parents[2]
# Joining includes torch's start-up in torchrun and in the rank: with four nodes starting at once
# on a shared 2-core machine (load ~10), 20 s was not always enough for healthy hosts.
JOIN_TIMEOUT, STALL, TIMEOUT = 45, 15, 90
# What a node may take at most: the join timeout, the stage's hard limit, torch's start-up on a
# loaded 2-core machine. A node still running past it is a hang, and the test says so.
NODE_LIMIT = JOIN_TIMEOUT + TIMEOUT + 60
# gloo on CPU processes of a shared 2-core machine: healthy pairs measured 0.19-0.51 GB/s in one
# run (a factor of 2-3 of noise); a 10 Mbit/s link measures ~0.001-0.005. The tests call a group
# slow below a tenth of the best, not half as the default for a real fabric does.
SLOW_PCT = 90.0
SHAPED = "10mbit"
# The rails test (four rounds, load ~17 from other jobs): one unshaped pair measured 0.025 GB/s
# against a best of 0.531 (1/21), while shaped pairs measure 0.001-0.005 GB/s: it calls a group
# slow below 2.5 % of the best.
RAIL_SLOW_PCT = 97.5

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[NetLab]:
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    if missing_tools():
        pytest.skip(f"missing {', '.join(missing_tools())}")
    with NetLab(tmp_path / "lab", ("h0", "h1", "h2", "h3")) as the_lab:
        yield the_lab


@dataclass
class Run:
    analysis: dict[str, Any]
    statuses: dict[str, str]   # host -> merged xhost-collective status (worst over its groups)
    messages: dict[str, str]   # host -> merged messages
    seconds: dict[str, float]  # "group/host" -> wall time of the node command
    fleet_exit: int


def run_stage(lab: NetLab, tmp: Path, mode: str, ifname: dict[str, str] | None = None,
              plan_extra: dict[str, Any] | None = None, order: list[str] | None = None) -> Run:
    """One cross-host run as verify.yml does it; `order` is the inventory order (the first host
    of a group leads it), `ifname` the --ifname per host."""
    hosts = order or list(lab.hosts)
    run = tmp / "run"
    cross = run / "crosshost"
    cross.mkdir(parents=True)
    the_plan = crosshost.plan(hosts, mode, 29400, "nl", {h: lab.addr(h) for h in hosts},
                              **{"slow_pct": SLOW_PCT, **(plan_extra or {})})
    (cross / "plan.json").write_text(json.dumps(the_plan))
    for host in hosts:
        code = subprocess.run([sys.executable, "-m", "checks", "--simulate", "cpu-only-healthy",
                               "--level", "quick", "-q", "--json", str(run / f"{host}.json")],
                              cwd=ROOT, check=False).returncode
        assert code == 0
    seconds: dict[str, float] = {}
    for groups in the_plan["rounds"]:
        started = []
        for group in groups:
            (cross / group["id"]).mkdir()
            for rank, host in enumerate(group["hosts"]):
                cmd = [sys.executable, "-m", "checks.node.crosshost_node",
                       "--nnodes", str(len(group["hosts"])), "--node-rank", str(rank),
                       "--rdzv-endpoint", group["endpoint"], "--rdzv-id", group["rdzv_id"],
                       "--group", group["id"], "--host", host, "--stages", "collective",
                       "--local-addr", lab.addr(host),
                       "--json", str(cross / group["id"] / f"{host}.json"),
                       "--stall", str(STALL), "--timeout", str(TIMEOUT),
                       "--join-timeout", str(JOIN_TIMEOUT)]
                if (ifname or {}).get(host):
                    cmd += ["--ifname", (ifname or {})[host]]
                if group.get("rail"):  # per-rail run: what verify.yml passes from the plan
                    rail = group["rail"]
                    cmd += ["--rail", rail["name"], "--ifname", rail["ifname"]]
                    cmd += ["--hca", rail["hca"]] if rail.get("hca") else []
                log = open(tmp / f"{group['id']}-{host}.log", "wb")  # noqa: SIM115
                started.append((f"{group['id']}/{host}", time.monotonic(), subprocess.Popen(
                    lab.command(host, *cmd), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                    env={**os.environ, "PYTHONPATH": str(ROOT)})))
        for name, t0, proc in started:
            try:
                proc.wait(timeout=max(1.0, NODE_LIMIT - (time.monotonic() - t0)))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                pytest.fail(f"{name} still ran after {NODE_LIMIT} s: a hang past its timeouts")
            seconds[name] = time.monotonic() - t0
        # Every node command returned: nothing of this round may be left in any namespace.
        assert lab.pids() == [], f"processes left behind after the round: {lab.pids()}"
    fleet_exit = fleet_cli.main(["report", str(run), "--no-history", "-q"])
    analysis = json.loads((cross / "analysis.json").read_text())
    statuses, messages = {}, {}
    for host in hosts:
        checks = [c for c in json.loads((run / f"{host}.json").read_text())["checks"]
                  if c["id"] == "xhost-collective"]
        order = ["PASS", "WARN", "ERROR", "FAIL"]
        statuses[host] = max((c["status"] for c in checks), key=order.index)
        messages[host] = " | ".join(r["message"] for c in checks for r in c["results"])
    return Run(analysis, statuses, messages, seconds, fleet_exit)


def test_healthy_lab_links_are_real_and_private(lab: NetLab) -> None:
    """The hosts reach each other on their own addresses, and nothing outside the lab."""
    probe = ("import socket,sys; s=socket.create_connection((sys.argv[1], int(sys.argv[2])), 3); "
             "print(s.getsockname()[0])")
    server = subprocess.Popen(lab.command("h0", sys.executable, "-c",
                                          "import socket; s=socket.create_server(('', 29399)); "
                                          "c,_=s.accept(); print(c.getpeername()[0])"),
                              stdout=subprocess.PIPE, text=True)
    try:
        for _ in range(50):
            got = lab.exec("h1", sys.executable, "-c", probe, lab.addr("h0"), "29399")
            if got.returncode == 0:
                break
            time.sleep(0.2)
        assert got.stdout.strip() == lab.addr("h1")
        assert server.communicate(timeout=10)[0].strip() == lab.addr("h1")
    finally:
        server.kill()
        server.wait()
    # No route out of the lab: an address outside it is unreachable at once.
    outside = lab.exec("h1", sys.executable, "-c", probe, "10.0.0.1", "80")
    assert outside.returncode != 0 and "unreachable" in outside.stderr.lower()
    assert lab.exec("h2", "hostname").stdout.strip() == "h2"


def test_rate_limited_host_is_named_in_pairs_mode(lab: NetLab, tmp_path: Path) -> None:
    lab.rate_limit("h3", SHAPED)
    run = run_stage(lab, tmp_path, "pairs")
    slow = [g for g in run.analysis["groups"] if g.get("slow")]
    assert sorted(sorted(g["hosts"]) for g in slow) == [["h0", "h3"], ["h2", "h3"]], run.analysis
    assert run.analysis["suspects"] == ["h3"] and run.analysis["bad_links"] == []
    assert run.statuses == {"h0": "WARN", "h1": "PASS", "h2": "WARN", "h3": "FAIL"}, run.messages
    assert "busbw" in run.messages["h3"] and "h3" in run.messages["h0"]
    assert run.fleet_exit == 1


def test_slow_link_between_two_good_hosts_is_named(lab: NetLab, tmp_path: Path) -> None:
    """Only h0<->h1 is slow (tbf on h0 for h1's address only): a bad link, no bad host."""
    lab.rate_limit("h0", SHAPED, peer=lab.addr("h1"))
    lab.rate_limit("h1", SHAPED, peer=lab.addr("h0"))
    run = run_stage(lab, tmp_path, "pairs")
    assert run.analysis["bad_links"] == [["h0", "h1"]] and run.analysis["suspects"] == []
    assert run.statuses["h2"] == run.statuses["h3"] == "PASS"
    assert run.statuses["h0"] == run.statuses["h1"] == "FAIL"


def test_unreachable_host_is_named_and_nothing_hangs(lab: NetLab, tmp_path: Path) -> None:
    lab.link_down("h2")
    run = run_stage(lab, tmp_path, "pairs")
    assert run.analysis["suspects"] == ["h2"], run.analysis
    assert run.statuses["h2"] == "FAIL" and run.statuses["h0"] == "PASS"
    assert max(run.seconds.values()) < NODE_LIMIT
    assert run.fleet_exit == 1


def test_blackholed_rendezvous_names_the_host_in_all_mode(lab: NetLab, tmp_path: Path) -> None:
    """h3 cannot reach the rendezvous (h0's address): the others wait for it and time out."""
    lab.blackhole("h3", lab.addr("h0"))
    run = run_stage(lab, tmp_path, "all")
    (group,) = run.analysis["groups"]
    assert group["culprits"] == ["h3"], run.analysis
    assert run.analysis["suspects"] == ["h3"]
    assert run.statuses == {"h0": "WARN", "h1": "WARN", "h2": "WARN", "h3": "FAIL"}, run.messages
    assert max(run.seconds.values()) < NODE_LIMIT


def test_multihomed_leader_hosts_the_rendezvous(lab: NetLab, tmp_path: Path) -> None:
    """h1 has a second interface, mgmt0: its default route, on a bridge of its own (it reaches no
    other host), and h1's hostname resolves to it. h1 leads the group (the rendezvous is at its
    data0 address). torchrun guesses from the hostname whether to host the rendezvous and guessed
    wrong here (before checks.supervise.launch passed is_host, every node waited out its join
    timeout). The group passes without --ifname and with --ifname data0.

    Not asserted: a failure named without --ifname, or with --ifname mgmt0. gloo (torch 2.13)
    completed in this lab in both cases, so neither failure could be produced here (see
    docs/multinode.md)."""
    lab.add_dead_interface("h1")
    order = ["h1", "h0", "h2", "h3"]  # h1 first: the leader
    plain = run_stage(lab, tmp_path / "default", "all", order=order)
    assert set(plain.statuses.values()) == {"PASS"}, plain.analysis
    good = run_stage(lab, tmp_path / "data0", "all", ifname={"h1": "data0"}, order=order)
    assert set(good.statuses.values()) == {"PASS"}, good.messages
    assert max(plain.seconds.values()) < JOIN_TIMEOUT + TIMEOUT


def test_busbw_floor_fails_a_slow_all_mode_group(lab: NetLab, tmp_path: Path) -> None:
    """In one group the ring runs at its slowest link, so no host can be told apart: a floor
    (from the plan) fails the group instead of passing it."""
    lab.rate_limit("h1", SHAPED)
    run = run_stage(lab, tmp_path, "all", plan_extra={"min_busbw_gbs": 0.05})
    (group,) = run.analysis["groups"]
    assert group["slow"] and not group["ok"] and "0.05" in group["reason"], run.analysis
    assert set(run.statuses.values()) == {"FAIL"}, run.messages


def test_slow_rail_of_one_host_is_named_with_its_rail(lab: NetLab, tmp_path: Path) -> None:
    """Two rails: every host has data0 (rail0, the lab's bridge) and data1 (rail1, a bridge of
    its own); only h3's rail1 is rate-limited. Per-rail pairs mode runs every pair once per rail,
    pinned with GLOO_SOCKET_IFNAME: the report names h3 on rail1 and no other host or rail. h3's
    rail0 pairs passing and its rail1 pairs crawling prove that each run moved its data over the
    rail it was pinned to (the rendezvous stays on data0)."""
    lab.add_rail("data1")
    lab.rate_limit("h3", SHAPED, ifname="data1")
    rails = parse_rails("rail0=-/data0,rail1=-/data1")
    run = run_stage(lab, tmp_path, "pairs", plan_extra={"rails": rails,
                                                         "slow_pct": RAIL_SLOW_PCT})
    analysis = run.analysis
    assert analysis["rail_suspects"] == [{"host": "h3", "rail": "rail1", "hca": None,
                                          "ifname": "data1"}], analysis
    assert analysis["suspects"] == ["h3"] and analysis["bad_links"] == []
    assert analysis["rail_links"] == []
    slow = sorted((g["rail"]["name"], sorted(g["hosts"])) for g in analysis["groups"] if g["slow"])
    assert slow == [("rail1", ["h0", "h3"]), ("rail1", ["h2", "h3"])], analysis
    assert run.statuses == {"h0": "WARN", "h1": "PASS", "h2": "WARN", "h3": "FAIL"}, run.messages
    h3 = json.loads((tmp_path / "run" / "h3.json").read_text())
    by_rail: dict[str, set[str]] = {}
    for chk in h3["checks"]:
        if chk["id"] == "xhost-collective":
            rail = chk["results"][0]["details"]["rail"]["name"]
            by_rail.setdefault(rail, set()).add(chk["status"])
    assert by_rail == {"rail0": {"PASS"}, "rail1": {"FAIL"}}, by_rail
    assert "h3 rail1 (-/data1) too slow" in run.messages["h3"]
    assert "vs best rail" in run.messages["h3"]
    # The merged reports stay valid (a victim's WARN carries a fault code): the fleet report
    # reads every host, none is "report unreadable".
    for host in lab.hosts:
        found = load.read(tmp_path / "run" / f"{host}.json", validate=load.validator())
        assert found is not None and found.report is not None, found
    assert run.fleet_exit == 1


def teardown_module() -> None:
    leftovers = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                               check=False).stdout
    assert f"nl{os.getpid() % 10000}x" not in leftovers, leftovers
