"""The cross-host judgement added for real links: the bandwidth rule (floor and slow-vs-best),
naming the host that could not reach the rendezvous, and the plan options (units; the netns
tests in test_crosshost_netns.py run them for real)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from checks.fleet import crosshost_plan as crosshost
from checks.node import crosshost_node as node_cli


def report(status: str, busbw: float | None = None, rendezvous: str | None = None,
           message: str = "m", address: dict[str, Any] | None = None) -> dict[str, Any]:
    details: dict[str, Any] = {"ranks": {}}
    if address:
        details["address"] = address
    if busbw is not None:
        details["figures"] = {"xhost_allreduce_busbw_gbs": busbw}
    if rendezvous:
        details["rendezvous"] = rendezvous
    result = {"status": status, "message": message, "details": details}
    return {"checks": [{"id": "xhost-collective", "code": "XHOST001", "status": status,
                        "results": [result]}]}


def pairs(busbw: dict[tuple[str, str], float], **rule: Any) -> crosshost.Analysis:
    p = crosshost.plan(["a", "b", "c", "d"], "pairs", **rule)
    nodes = {}
    for groups in p["rounds"]:
        for g in groups:
            value = busbw.get(tuple(g["hosts"]), busbw.get(tuple(reversed(g["hosts"])), 10.0))
            nodes[g["id"]] = {h: report("PASS", value) for h in g["hosts"]}
    return crosshost.analyse(p, nodes)


def test_plan_carries_the_bandwidth_rule() -> None:
    p = crosshost.plan(["a", "b"], min_busbw_gbs=40.0, slow_pct=30.0)
    assert p["busbw_rule"] == {"min_busbw_gbs": 40.0, "slow_pct": 30.0}
    assert crosshost.plan(["a", "b"])["busbw_rule"]["slow_pct"] == crosshost.DEFAULT_SLOW_PCT


@pytest.mark.parametrize("rule", [{"min_busbw_gbs": 0.0}, {"slow_pct": 0.0}, {"slow_pct": 100.0}])
def test_plan_refuses_a_rule_that_cannot_judge(rule: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        crosshost.plan(["a", "b"], **rule)


def test_slow_host_is_the_one_in_every_slow_pair() -> None:
    a = pairs({("c", "d"): 2.0, ("d", "a"): 1.5})
    assert a.suspects == ["d"] and a.bad_links == []
    slow = {g.id: g for g in a.groups if g.slow}
    assert sorted(slow) == ["r0g1", "r1g1"] and all(g.culprits == ["d"] for g in slow.values())
    assert "1.5 GB/s" in slow["r1g1"].reason and "best group (10 GB/s)" in slow["r1g1"].reason


def test_slow_link_between_two_fast_hosts_is_a_bad_link() -> None:
    a = pairs({("a", "b"): 1.0})
    assert a.suspects == [] and a.bad_links == [["a", "b"]]
    assert next(g for g in a.groups if g.slow).culprits == ["a", "b"]


def test_noise_within_the_rule_is_not_slow() -> None:
    a = pairs({("a", "b"): 6.0, ("c", "d"): 8.0})  # 40 % below the best: within 50 %
    assert all(g.ok for g in a.groups) and a.suspects == []


def test_floor_fails_a_single_group_with_no_peer_to_compare() -> None:
    p = crosshost.plan(["a", "b", "c"], "all", min_busbw_gbs=40.0)
    a = crosshost.analyse(p, {"r0g0": {h: report("PASS", b) for h, b in
                                       (("a", 30.0), ("b", 31.0), ("c", 29.5))}})
    (g,) = a.groups
    assert not g.ok and g.slow and g.busbw_gbs == 29.5 and "floor of 40 GB/s" in g.reason
    assert crosshost.analyse(crosshost.plan(["a", "b"], "all"),
                             {"r0g0": {h: report("PASS", 1.0) for h in "ab"}}).groups[0].ok


def test_a_group_without_figures_is_not_judged_on_bandwidth() -> None:
    p = crosshost.plan(["a", "b", "c", "d"], "pairs", min_busbw_gbs=40.0)
    nodes = {g["id"]: {h: report("PASS") for h in g["hosts"]} for r in p["rounds"] for g in r}
    assert all(g.ok and g.busbw_gbs is None for g in crosshost.analyse(p, nodes).groups)


def test_host_that_could_not_reach_the_rendezvous_is_named_not_the_waiters() -> None:
    p = crosshost.plan(["a", "b", "c", "d"], "all")
    nodes = {"r0g0": {"a": report("FAIL", rendezvous="reached"),
                      "b": report("FAIL", rendezvous="reached"),
                      "c": report("FAIL", rendezvous="unreachable"),
                      "d": report("FAIL", rendezvous="reached")}}
    (g,) = crosshost.analyse(p, nodes).groups
    assert g.culprits == ["c"] and "could not reach the rendezvous" in g.reason


def test_leader_nobody_reaches_is_named() -> None:
    p = crosshost.plan(["a", "b", "c"], "all")
    nodes = {"r0g0": {"a": report("FAIL", rendezvous="reached"),
                      "b": report("FAIL", rendezvous="unreachable"),
                      "c": report("FAIL", rendezvous="unreachable")}}
    (g,) = crosshost.analyse(p, nodes).groups
    assert g.culprits == ["a"] and "no other host could reach" in g.reason


def test_rendezvous_view_reads_torchs_client_errors() -> None:
    tail = ("[E1201 socket.cpp:818] [c10d] The client socket has failed to connect to any "
            "network address of (10.243.1.11, 29400).")
    assert node_cli.rendezvous_view(tail, "10.243.1.11:29400") == "unreachable"
    assert node_cli.rendezvous_view(tail, "10.243.1.12:29400") == "reached"
    assert node_cli.rendezvous_view("", "10.243.1.11:29400") == "reached"


def test_merge_fails_the_slow_host_and_warns_its_partners(tmp_path) -> None:
    p = crosshost.plan(["a", "b", "c", "d"], "pairs")
    run = tmp_path / "run"
    (run / "crosshost").mkdir(parents=True)
    (run / "crosshost" / "plan.json").write_text(json.dumps(p))
    for groups in p["rounds"]:
        for g in groups:
            (run / "crosshost" / g["id"]).mkdir()
            for h in g["hosts"]:
                value = 1.0 if "d" in g["hosts"] else 10.0
                (run / "crosshost" / g["id"] / f"{h}.json").write_text(
                    json.dumps(report("PASS", value)))
    for h in "abcd":
        (run / f"{h}.json").write_text(json.dumps({"checks": [], "summary": {}}))
    crosshost.merge(run)
    status = {h: [c["status"] for c in json.loads((run / f"{h}.json").read_text())["checks"]]
              for h in "abcd"}
    assert status == {"a": ["PASS", "WARN"], "b": ["PASS", "PASS"], "c": ["WARN", "PASS"],
                      "d": ["FAIL", "FAIL"]}
    d = json.loads((run / "d.json").read_text())
    assert d["verdict"] == "FAIL" and d["checks"][0]["results"][0]["fault_code"] == "XHOST001"


def test_plan_cli_takes_the_rule(capsys: pytest.CaptureFixture[str]) -> None:
    assert crosshost.main(["--hosts", "a,b", "--min-busbw-gbs", "12.5"]) == 0
    assert json.loads(capsys.readouterr().out)["busbw_rule"]["min_busbw_gbs"] == 12.5
    assert crosshost.main(["--hosts", "a,b", "--slow-pct", "120"]) == 2
    assert "slow_pct" in capsys.readouterr().err


def test_host_advertising_an_unreachable_address_is_named_even_if_it_passed_elsewhere() -> None:
    """Multi-homed h1: its pair as rank 1 worked, its pair as leader did not; the address it
    advertised (hostname) is not the one it routes from, so it is the suspect, not a link."""
    p = crosshost.plan(["a", "b", "c", "d"], "pairs")
    bad = {"mismatch": True, "route_source": "10.1.0.12", "hostname_addresses": ["10.9.0.12"]}
    ok = report("PASS", 5.0)
    nodes = {"r0g0": {"a": ok, "b": ok}, "r0g1": {"c": ok, "d": ok},
             "r1g0": {"b": report("FAIL", address=bad), "c": report("FAIL")},
             "r1g1": {"d": ok, "a": ok}}
    a = crosshost.analyse(p, nodes)
    assert a.suspects == ["b"] and a.bad_links == []
    g = next(g for g in a.groups if g.id == "r1g0")
    assert g.culprits == ["b"] and "--ifname" in g.reason and "10.9.0.12" in g.reason


def test_address_view_compares_hostname_with_the_route() -> None:
    view = node_cli.address_view("127.0.0.1:29400", None)
    assert view["route_source"] == "127.0.0.1"
    assert view["mismatch"] == ("127.0.0.1" not in view["hostname_addresses"])
    assert node_cli.address_view("127.0.0.1:29400", "lo")["mismatch"] is False


def test_address_view_reads_through_the_hardware_layer_so_a_scenario_plays_it() -> None:
    """A multi-homed node whose hostname resolves to the management network while the route to
    the rendezvous leaves from the fabric (Debian's `127.0.1.1 hostname` line is the same case)."""
    from checks.hw.fixture import FixtureBackend

    multihomed = FixtureBackend({"host": {"network": {
        "interfaces": {"ens1": "10.9.0.12", "eno1": "192.0.2.7"}, "route_source": "10.9.0.12",
        "hostname_addresses": ["192.0.2.7"]}}})
    view = node_cli.address_view("10.9.0.1:29400", None, multihomed)
    assert view["route_source"] == "10.9.0.12" and view["mismatch"] is True
    assert node_cli.address_view("10.9.0.1:29400", "ens1", multihomed)["mismatch"] is False
    unrouted = FixtureBackend({"host": {"network": {"route_source": None}}})
    view = node_cli.address_view("10.9.0.1:29400", None, unrouted)
    assert view["route_source"] is None and "no route" in view["route_error"] and view["mismatch"] is False


def _own_address() -> str | None:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.255.255.254", 9))  # UDP: picks a route, sends nothing
        except OSError:
            return None
        return str(probe.getsockname()[0])


def test_leader_is_told_to_host_the_rendezvous_only_on_its_own_address() -> None:
    from checks.supervise import launch

    def conf(endpoint: str) -> str:
        cmd = launch.torchrun_command("m", [], nproc=1, nnodes=2, rdzv_endpoint=endpoint,
                                      rdzv_id="x", node_rank=0)
        return next(a for a in cmd if a.startswith("--rdzv-conf="))

    # Loopback: several "hosts" on one machine; torchrun keeps its own guess and fallback.
    assert conf("127.0.0.1:29400") == "--rdzv-conf=join_timeout=60"
    assert conf("192.0.2.1:29400") == "--rdzv-conf=join_timeout=60"  # TEST-NET-1, not ours
    assert conf("no-such-host.invalid:29400") == "--rdzv-conf=join_timeout=60"
    own = _own_address()
    if own is None or own.startswith("127."):
        pytest.skip("this machine has no routable address to test with")
    assert conf(f"{own}:29400") == "--rdzv-conf=join_timeout=60,is_host=1"
