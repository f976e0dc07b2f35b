"""Per-rail cross-host runs (checks/node/rails.py, checks/fleet/crosshost_plan.py): the rail syntax, the
environment that pins a run to one rail, the plan, the per-rail judgement and the fleet view, on
recorded node reports. The same code runs for real over two rails of network namespaces in
test_crosshost_netns.py::test_slow_rail_of_one_host_is_named_with_its_rail."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from checks.fleet import crosshost_plan as crosshost
from checks.fleet import fleet_terminal as terminal
from checks.hw.fixture import FixtureBackend
from checks.node import crosshost_node as node_cli
from checks.node import node_cli as cli
from checks.node.rails import Rail, nearest_gpu, parse_rails, rail_env
from checks.render import html
from checks.report import load
from checks.report.aggregate import from_reports
from checks.report.fabric_summary import summarise

RAILS = "rail0=mlx5_0/ens1,rail1=mlx5_1/ens2"


def test_rail_syntax() -> None:
    rails = parse_rails("rail0=mlx5_0/ens1, rail1=mlx5_1/ens2@1,eth=-/data0")
    assert rails == [Rail("rail0", "mlx5_0", "ens1"), Rail("rail1", "mlx5_1", "ens2", 1),
                     Rail("eth", None, "data0")]
    assert rails[1].label == "rail1 (mlx5_1/ens2)" and rails[2].label == "eth (-/data0)"
    assert Rail.from_dict(rails[1].to_dict()) == rails[1]


@pytest.mark.parametrize("text, words", [
    ("", "no rail"), ("rail0", "NAME=HCA/IFNAME"), ("rail0=mlx5_0", "NAME=HCA/IFNAME"),
    ("r=mlx5_0/ens1@x", "NAME=HCA/IFNAME"), ("a=mlx5_0/ens1,a=mlx5_1/ens2", "name a"),
    ("a=mlx5_0/ens1,b=mlx5_1/ens1", "ifname ens1"), ("a=mlx5_0/ens1,b=mlx5_0/ens2", "HCA")])
def test_bad_rails_are_refused_naming_the_problem(text: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        parse_rails(text)


def test_rail_env_pins_nccl_and_gloo_to_the_rail() -> None:
    env = rail_env(Rail("rail1", "mlx5_1", "ens2"), gpu=3)
    # "=" makes NCCL match mlx5_1 exactly: plain "mlx5_1" is a prefix of mlx5_10..mlx5_17.
    assert env == {"NCCL_IB_HCA": "=mlx5_1", "NCCL_SOCKET_IFNAME": "ens2",
                   "GLOO_SOCKET_IFNAME": "ens2", "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                   "CUDA_VISIBLE_DEVICES": "3"}
    assert rail_env(Rail("eth", None, "data1"), gpu=None) == {
        "NCCL_SOCKET_IFNAME": "data1", "GLOO_SOCKET_IFNAME": "data1"}


def test_nearest_gpu_follows_the_pci_topology() -> None:
    """imbue's HGX H100 host (scenario fabric-hgx-h100-ib-imbue4): each compute HCA shares a PCIe
    switch with one GPU; the front-end CX-6 (mlx5_1, on a root port of socket 0) has none."""
    hw = FixtureBackend.from_file("fabric-hgx-h100-ib-imbue4")
    compute = ["mlx5_0", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_9", "mlx5_10", "mlx5_11"]
    assert [nearest_gpu(hw, n) for n in compute] == list(range(8))
    assert nearest_gpu(hw, "mlx5_99") is None


def test_plan_repeats_the_mode_once_per_rail() -> None:
    p = crosshost.plan(["a", "b", "c", "d"], "pairs", run_id="x", rails=parse_rails(RAILS))
    ids = [[g["id"] for g in groups] for groups in p["rounds"]]
    assert ids == [["rail0-r0g0", "rail0-r0g1"], ["rail0-r1g0", "rail0-r1g1"],
                   ["rail1-r0g0", "rail1-r0g1"], ["rail1-r1g0", "rail1-r1g1"]]
    ports = [g["port"] for groups in p["rounds"] for g in groups]
    assert len(set(ports)) == len(ports)
    assert p["rounds"][2][0]["rail"] == {"name": "rail1", "hca": "mlx5_1", "ifname": "ens2",
                                         "gpu": None}
    assert [a["rail"]["name"] for a in p["hosts"]["c"]] == ["rail0", "rail0", "rail1", "rail1"]
    assert p["rails"][0]["hca"] == "mlx5_0"
    assert "rails" not in crosshost.plan(["a", "b"], "all")  # without rails: unchanged


def test_plan_cli_takes_rails_and_refuses_bad_ones(capsys: pytest.CaptureFixture[str]) -> None:
    assert crosshost.main(["--hosts", "a,b", "--rails", RAILS]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [g["rail"]["name"] for groups in out["rounds"] for g in groups] == ["rail0", "rail1"]
    assert crosshost.main(["--hosts", "a,b", "--rails", "rail0=mlx5_0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: rail 'rail0=mlx5_0' is not NAME=HCA/IFNAME") and "\n" not in err


@pytest.mark.parametrize("extra, words", [
    (["--rail", "rail1"], "needs --ifname"),
    (["--hca", "mlx5_1"], "give --rail NAME too"),
    (["--rail-gpu", "1"], "give --rail NAME too")])
def test_node_refuses_an_incomplete_rail(extra: list[str], words: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    code = node_cli.main(["--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint",
                          "10.0.0.1:29400", "--rdzv-id", "x", *extra])
    err = capsys.readouterr().err.strip()
    assert code == 2 and words in err and "\n" not in err


def node_report(status: str, busbw: float, rail: dict[str, Any], group: str) -> dict[str, Any]:
    details = {"ranks": {}, "figures": {"xhost_allreduce_busbw_gbs": busbw}, "rail": rail,
               "group": group}
    result = {"status": status, "message": "collective ok", "value": None, "unit": None,
              "expected": None, "remedy": None, "device": None, "fault_code": None,
              "details": details}
    return {"checks": [{"id": "xhost-collective", "code": "XHOST001",
                        "title": "collectives across hosts", "level": "standard",
                        "tags": ["crosshost"], "status": status, "duration_s": 1.0,
                        "results": [result]}]}


def per_rail_run(tmp_path: Path, slow: dict[tuple[str, frozenset[str]], float]
                 ) -> tuple[crosshost.Analysis, Path]:
    """A recorded per-rail pairs run of hosts a-d on two rails; every group 40 GB/s unless
    `slow` gives (rail, hosts) another figure. Merged into host reports as the fleet report
    does."""
    run = tmp_path / "run"
    p = crosshost.plan(["a", "b", "c", "d"], "pairs", run_id="x", rails=parse_rails(RAILS))
    (run / "crosshost").mkdir(parents=True)
    base = tmp_path / "base.json"
    assert cli.main(["--simulate", "cpu-only-healthy", "--level", "quick", "--quiet", "--json",
                     str(base)]) == 0
    for host in "abcd":
        (run / f"{host}.json").write_text(json.dumps({**json.loads(base.read_text()),
                                                      "host": host}))
    (run / "crosshost" / "plan.json").write_text(json.dumps(p))
    for groups in p["rounds"]:
        for g in groups:
            gbs = slow.get((g["rail"]["name"], frozenset(g["hosts"])), 40.0)
            (run / "crosshost" / g["id"]).mkdir()
            for host in g["hosts"]:
                (run / "crosshost" / g["id"] / f"{host}.json").write_text(
                    json.dumps(node_report("PASS", gbs, g["rail"], g["id"])))
    analysis = crosshost.merge(run)
    assert analysis is not None
    return analysis, run


def statuses(run: Path, host: str) -> dict[str, list[str]]:
    report = json.loads((run / f"{host}.json").read_text())
    out: dict[str, list[str]] = {}
    for chk in report["checks"]:
        if chk["id"] != "xhost-collective":
            continue
        result = chk["results"][0]
        out.setdefault(result["details"]["rail"]["name"], []).append(chk["status"])
    return out


def test_slow_rail_of_one_host_is_named_with_host_and_rail(tmp_path: Path) -> None:
    analysis, run = per_rail_run(tmp_path, {("rail1", frozenset("cd")): 9.0,
                                            ("rail1", frozenset("bc")): 8.5})
    assert analysis.rail_suspects == [{"host": "c", "rail": "rail1", "hca": "mlx5_1",
                                       "ifname": "ens2"}]
    assert analysis.suspects == ["c"] and analysis.bad_links == [] and analysis.rail_links == []
    assert statuses(run, "c") == {"rail0": ["PASS", "PASS"], "rail1": ["FAIL", "FAIL"]}
    assert statuses(run, "d") == {"rail0": ["PASS", "PASS"], "rail1": ["WARN", "PASS"]}
    assert statuses(run, "a") == {"rail0": ["PASS", "PASS"], "rail1": ["PASS", "PASS"]}
    report = json.loads((run / "c.json").read_text())
    messages = [c["results"][0]["message"] for c in report["checks"] if c["status"] == "FAIL"]
    assert messages[0].startswith("c rail1 (mlx5_1/ens2) too slow: 9 GB/s vs best rail 40 GB/s")
    assert report["verdict"] == "FAIL"
    warned = json.loads((run / "d.json").read_text())["checks"]
    assert any("because of c" in c["results"][0]["message"] and "rail1 (mlx5_1/ens2)"
               in c["results"][0]["message"] for c in warned if c["status"] == "WARN")
    assert json.loads((run / "a.json").read_text())["verdict"] == "PASS"
    # Merged reports stay valid for the fleet loader (a victim's WARN carries a fault code).
    for host in "abcd":
        found = load.read(run / f"{host}.json", validate=load.validator())
        assert found is not None and found.report is not None, found


def test_slow_link_on_one_rail_is_named_with_the_rail(tmp_path: Path) -> None:
    analysis, run = per_rail_run(tmp_path, {("rail0", frozenset("ab")): 5.0})
    assert analysis.suspects == [] and analysis.rail_suspects == []
    assert analysis.rail_links == [{"hosts": ["a", "b"], "rail": "rail0", "hca": "mlx5_0",
                                    "ifname": "ens1"}]
    assert statuses(run, "a")["rail0"] == ["FAIL", "PASS"]
    assert statuses(run, "c") == {"rail0": ["PASS", "PASS"], "rail1": ["PASS", "PASS"]}


def test_fleet_views_show_each_hosts_rails(tmp_path: Path) -> None:
    _, run = per_rail_run(tmp_path, {("rail1", frozenset("cd")): 9.0,
                                     ("rail1", frozenset("bc")): 8.5})
    reports = [json.loads((run / f"{h}.json").read_text()) for h in "abcd"]
    fleet = from_reports(reports)
    rows = {r.host: r.rail_runs for r in summarise(fleet.hosts)}
    assert rows["c"] == "rail0 (mlx5_0/ens1) 40 GB/s PASS; rail1 (mlx5_1/ens2) 8.5 GB/s FAIL"
    assert rows["a"] == "rail0 (mlx5_0/ens1) 40 GB/s PASS; rail1 (mlx5_1/ens2) 40 GB/s PASS"
    out = io.StringIO()
    terminal.render(fleet, Console(file=out, width=400, color_system=None), verbose=True)
    assert "rail1 (mlx5_1/ens2) 8.5 GB/s FAIL" in out.getvalue()
    assert "rail1 (mlx5_1/ens2) 8.5 GB/s FAIL" in html.render(fleet)


NCCL_LOGS = Path(__file__).resolve().parents[1] / "workloads" / "nccl_logs"


@pytest.mark.parametrize(("log_name", "hca", "ifname", "status", "words"), [
    # NCCL 2.18 on an H20 pair lists four HCAs (nccl#1189): a run pinned to mlx5_1 saw them all
    ("h20-ib-gdrdma-cumem-nccl1189.log", "mlx5_1", "ib1", "FAIL", "pinned to mlx5_1 but NCCL used"),
    # NCCL 2.5.6 with one HCA (nv_peer_mem#56): pinned to it, nothing else used
    ("ib-no-gdrdma-2.5.6-nvpeermem56.log", "mlx5_0", "ib0", "PASS", None),
    # sockets only (nccl-tests#284): a plain-interface rail is proven by the socket list
    ("socket-two-nodes-nccltests284.log", None, "enp3s0", "PASS", None),
    ("socket-two-nodes-nccltests284.log", None, "eth1", "FAIL", "pinned to eth1"),
], ids=["four-hcas-pinned-to-one", "one-hca", "socket-rail", "socket-other-interface"])
def test_pinned_run_is_proven_by_the_devices_nccl_used(log_name: str, hca: str | None,
                                                       ifname: str, status: str,
                                                       words: str | None) -> None:
    from checks.hw.measure import nccl_log
    from checks.model import Result, Status

    log = nccl_log.parse_file(NCCL_LOGS / log_name)
    result = node_cli.pinned_rail_verdict(Result(Status.PASS, "exact"), log, hca, ifname)
    assert str(result.status) == status, result.message
    assert result.details["rail_devices"], "the devices NCCL used go into the details"
    if words:
        assert words in result.message and result.remedy
