"""P2P pairs judged within their path class: classification from what the hardware layer gives,
per-class straggler rule and floors, and the shipped two-socket PCIe scenarios end to end."""

from __future__ import annotations

from typing import Any

import pytest

from checks.model import Status
from checks.node import rules, topology
from checks.node.suite.p2p import judge_p2p
from checks.node.topology import GpuPlace

SW0 = ("0000:16:02.0", "0000:17:00.0", "0000:18:00.0")
SW0B = ("0000:16:02.0", "0000:17:00.0", "0000:18:04.0")
ROOT1 = ("0000:3a:02.0",)


@pytest.mark.parametrize("a,b,nvswitch,expected", [
    # NVSwitch system: both GPUs with active links
    (GpuPlace("0000:18:00.0", SW0, 0, 18), GpuPlace("0000:9a:00.0", ROOT1, 1, 18), True,
     topology.NVLINK),
    # links active but no NVSwitch and no remote end known: the PCIe path decides
    (GpuPlace("0000:18:00.0", SW0, 0, 12), GpuPlace("0000:1c:00.0", SW0B, 0, 12), False,
     topology.SWITCH),
    # an NVLink bridge: a link of one GPU names the other as its remote end
    (GpuPlace("0000:18:00.0", SW0, 0, 4, ("0000:3b:00.0",) * 4),
     GpuPlace("0000:3b:00.0", ROOT1, 1, 4, ("0000:18:00.0",) * 4), False, topology.NVLINK),
    # one switch: a common bridge below the root port
    (GpuPlace("0000:1b:00.0", SW0, 0), GpuPlace("0000:1c:00.0", SW0B, 0), False,
     topology.SWITCH),
    # same root port only is not enough to be a switch; same NUMA node
    (GpuPlace("0000:1b:00.0", ("0000:16:02.0",), 0),
     GpuPlace("0000:3b:00.0", ("0000:16:03.0",), 0), False, topology.SOCKET),
    (GpuPlace("0000:1b:00.0", SW0, 0), GpuPlace("0000:b1:00.0", ROOT1, 1), False,
     topology.CROSS),
    # sysfs numa_node -1 on both: one memory node
    (GpuPlace("0000:1b:00.0", (), -1), GpuPlace("0000:b1:00.0", (), -1), False,
     topology.SOCKET),
    (GpuPlace("0000:1b:00.0"), GpuPlace("0000:b1:00.0"), False, topology.UNKNOWN),
    # the driver's P2P status names the peer (nvmlDeviceGetP2PStatus, NVLink caps index), even
    # with no link answering: the pair should be NVLink, whatever it runs at now
    (GpuPlace("0000:33:00.0", (), 0, 0, nvlink_p2p=("0000:8b:00.0",)),
     GpuPlace("0000:8b:00.0", (), 1), False, topology.NVLINK),
    # one completed fabric clique (GB200 tray, HGX B200): NVLink; another clique: not
    (GpuPlace("0000:01:00.0", (), 0, fabric_clique="9c6f/4026"),
     GpuPlace("0008:01:00.0", (), 0, fabric_clique="9c6f/4026"), False, topology.NVLINK),
    (GpuPlace("0000:01:00.0", (), 0, fabric_clique="9c6f/4026"),
     GpuPlace("0008:01:00.0", (), 1, fabric_clique="9c6f/4027"), False, topology.CROSS),
])
def test_pair_class_from_hardware_facts(a: GpuPlace, b: GpuPlace, nvswitch: bool,
                                        expected: str) -> None:
    assert topology.pair_class(a, b, nvswitch=nvswitch) == expected
    assert topology.pair_class(b, a, nvswitch=nvswitch) == expected


@pytest.mark.parametrize("a,b,nvswitch,links", [
    # through switches: every active link of the narrower GPU
    (GpuPlace("a", nvlinks_active=18), GpuPlace("b", nvlinks_active=16), True, 16),
    (GpuPlace("a", nvlinks_active=18, fabric_clique="c/1"),
     GpuPlace("b", nvlinks_active=18, fabric_clique="c/1"), False, 18),
    # a bridge named by the remote PCI info: the links that name the peer
    (GpuPlace("a", nvlinks_active=12, nvlink_remotes=("b",) * 12),
     GpuPlace("b", nvlinks_active=12), False, 12),
    # known from the P2P status only: the active links shared among the GPU's NVLink peers
    # (HGX H100 4-GPU, NV6 to each of three peers: NVIDIA/nccl#1617)
    (GpuPlace("a", nvlinks_active=18, nvlink_p2p=("b", "c", "d")),
     GpuPlace("b", nvlinks_active=18, nvlink_p2p=("a", "c", "d")), False, 6),
    (GpuPlace("a", nvlinks_active=12, nvlink_p2p=("b",)), GpuPlace("b"), False, 12),
    (GpuPlace("a"), GpuPlace("b"), False, 0),
])
def test_nvlinks_carrying_a_pair(a: GpuPlace, b: GpuPlace, nvswitch: bool, links: int) -> None:
    assert topology.nvlinks_between(a, b, nvswitch=nvswitch) == links
    assert topology.nvlinks_between(b, a, nvswitch=nvswitch) == links


def _matrix(n: int, values: dict[tuple[int, int], float]) -> dict[str, Any]:
    bw = [[None if i == j else values[(i, j)] for j in range(n)] for i in range(n)]
    return {"count": n, "access": [[True] * n for _ in range(n)], "bandwidth_gbs": bw}


# Two sockets, two GPUs per switch: same-switch 26 GB/s, cross-socket 22 GB/s (shape of
# NVIDIA/nvbandwidth#50), plus one slow same-switch pair at 21.
GROUP = {0: 0, 1: 0, 2: 1, 3: 1}
CLASSES = {(i, j): topology.SWITCH if GROUP[i] == GROUP[j] else topology.CROSS
           for i in range(4) for j in range(4) if i != j}
VALUES = {k: 26.0 if c == topology.SWITCH else 22.0 for k, c in CLASSES.items()}


def test_slow_switch_pair_fails_within_its_class_but_hides_among_all_pairs() -> None:
    values = {**VALUES, (0, 1): 21.0}
    (bad,) = judge_p2p(_matrix(4, values), CLASSES, {}, 10)
    assert bad.status is Status.FAIL
    assert "GPU0->GPU1 (pcie-switch) 21.0 GB/s is 19 % below" in bad.message
    assert bad.details["slow_pairs"] == ["GPU0-GPU1"]
    one_class = dict.fromkeys(CLASSES, topology.UNKNOWN)
    (missed,) = judge_p2p(_matrix(4, values), one_class, {}, 10)
    assert missed.status is Status.PASS  # why the rule compares within a class


def test_healthy_cross_socket_pairs_pass_and_classes_are_reported() -> None:
    (ok,) = judge_p2p(_matrix(4, VALUES), CLASSES, {}, 10)
    assert ok.status is Status.PASS
    assert ok.details["classes"]["pcie-switch"]["median_gbs"] == 26.0
    assert ok.details["classes"]["cross-socket"]["pairs"] == 8
    assert ok.details["figures"]["p2p_cross_socket_median_gbs"] == 22.0
    pair = next(p for p in ok.details["pairs"] if (p["src"], p["dst"]) == ("GPU0", "GPU2"))
    assert pair["class"] == "cross-socket" and pair["gbs"] == 22.0


def test_floor_applies_only_where_given() -> None:
    floor = rules.Threshold(24.0, "derived: PCIe Gen4 x16")
    thresholds = {k: floor if c == topology.SWITCH else None for k, c in CLASSES.items()}
    (ok,) = judge_p2p(_matrix(4, VALUES), CLASSES, thresholds, 10)
    assert ok.status is Status.PASS  # cross-socket 22 < 24 is not judged by a link floor
    (bad,) = judge_p2p(_matrix(4, {**VALUES, (2, 3): 23.0, (3, 2): 23.0}), CLASSES, thresholds, 10)
    assert bad.status is Status.FAIL and "GPU2->GPU3 (pcie-switch) 23.0 GB/s below 24.0" in bad.message


def test_missing_peer_access_fails_only_where_the_path_needs_it() -> None:
    m = _matrix(4, VALUES)
    m["access"][0][2] = False
    m["bandwidth_gbs"][0][2] = None
    (pcie,) = judge_p2p(m, CLASSES, {}, 10, access_expected=dict.fromkeys(CLASSES, False))
    assert pcie.status is Status.PASS and "copy through the host" in pcie.message
    (nv,) = judge_p2p(m, CLASSES, {}, 10, access_expected=dict.fromkeys(CLASSES, True))
    assert nv.status is Status.FAIL and "no peer access for GPU0->GPU2" in nv.message


def by_id(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["id"]: c for c in report["checks"]}


def test_healthy_two_socket_pcie_server_passes(run_cli: Any) -> None:
    code, report = run_cli("--simulate", "workload-pcie-two-socket-healthy", "--level",
                           "standard")
    assert code == 0
    bad = {c["id"]: c["status"] for c in report["checks"] if c["status"] in ("FAIL", "ERROR")}
    assert bad == {}
    (p2p,) = by_id(report)["p2p-bandwidth"]["results"]
    assert p2p["status"] == "PASS"
    classes = p2p["details"]["classes"]
    assert set(classes) == {"pcie-switch", "cross-socket"}
    assert classes["pcie-switch"]["pairs"] == 12 and classes["cross-socket"]["pairs"] == 18
    assert classes["pcie-switch"]["floor_gbs"] == pytest.approx(1.969 * 16 * 0.5, abs=0.01)
    assert classes["cross-socket"]["floor_gbs"] is None


def test_slow_pair_inside_a_switch_fails_naming_it(run_cli: Any) -> None:
    code, report = run_cli("--simulate", "workload-p2p-slow-switch-pair", "--only",
                           "p2p-bandwidth")
    assert code == 1
    (p2p,) = by_id(report)["p2p-bandwidth"]["results"]
    assert p2p["status"] == "FAIL" and p2p["fault_code"] == "COL002"
    assert p2p["details"]["slow_pairs"] == ["GPU1-GPU2"]
    assert "GPU1->GPU2 (pcie-switch) 20.9 GB/s is 21 % below" in p2p["message"]


def test_nvswitch_node_pairs_are_nvlink_with_a_derived_floor(run_cli: Any) -> None:
    _, report = run_cli("--simulate", "h100-sxm-8x-healthy", "--only", "p2p-bandwidth",
                        "--profile", "generic")
    (p2p,) = by_id(report)["p2p-bandwidth"]["results"]
    assert p2p["status"] == "PASS"
    assert set(p2p["details"]["classes"]) == {"nvlink"}
    # generic knows H100's per-link figure by compute capability: 18 x 25 GB/s x 0.6
    assert p2p["details"]["classes"]["nvlink"]["floor_gbs"] == 270.0


# --- NVLink without PCI-visible NVSwitches, and bridged pairs --------------------------------------
def test_links_to_a_switch_make_an_nvlink_pair_without_switches_on_the_pci_bus() -> None:
    # HGX B200: NVML says each link's far end is an NVSwitch; nothing 10de:xxxx on the bus.
    a = GpuPlace("0000:18:00.0", SW0, 0, 18, nvlink_to_switch=True)
    b = GpuPlace("0000:9a:00.0", ROOT1, 1, 18, nvlink_to_switch=True)
    assert topology.pair_class(a, b, nvswitch=False) == topology.NVLINK
    # one GPU whose links do not run to a switch: the PCIe path decides
    c = GpuPlace("0000:9a:00.0", ROOT1, 1, 18)
    assert topology.pair_class(a, c, nvswitch=False) == topology.CROSS


def test_b200_at_half_its_nvlink_floor_fails_as_nvlink(run_cli: Any) -> None:
    code, report = run_cli("--simulate", "blackwell-b200-p2p-half-nvlink", "--only",
                           "p2p-bandwidth")
    assert code == 1
    (p2p,) = by_id(report)["p2p-bandwidth"]["results"]
    assert p2p["status"] == "FAIL" and p2p["fault_code"] == "COL002"
    assert set(p2p["details"]["classes"]) == {"nvlink"}
    assert p2p["details"]["classes"]["nvlink"] == {"pairs": 56, "min_gbs": 306.0,
                                                   "median_gbs": 306.0, "floor_gbs": 613.0}
    assert "GPU0->GPU1 (nvlink) 306.0 GB/s below 613.0" in p2p["message"]


def test_b200_profile_alone_says_nvswitch_when_nvml_gives_no_remote_type(
        run_cli: Any, tmp_path: Any) -> None:
    """A driver that answers no remote device type: the b200 profile's topology still classes
    every pair NVLink (the healthy B200 scenario's links carry no remote type)."""
    import yaml

    from checks.hw.scenario_file import load_scenario
    base = load_scenario("blackwell-b200-p2p-half-nvlink")["_path"]
    path = tmp_path / "b200-no-remote-type.yaml"
    path.write_text(yaml.safe_dump({"description": "test: no remote device type",
                                    "extends": str(base),
                                    "gpu_defaults": {"nvlink": {"links": 18}}}))
    code, report = run_cli("--simulate", str(path), "--only", "p2p-bandwidth")
    (p2p,) = by_id(report)["p2p-bandwidth"]["results"]
    assert code == 1 and p2p["status"] == "FAIL"
    assert set(p2p["details"]["classes"]) == {"nvlink"}


def test_direct_nvlink_mesh_judged_by_the_links_to_each_peer(run_cli: Any, tmp_path: Any) -> None:
    """HGX H100 4-GPU (NV6 to each peer, no NVSwitch): the H100 SXM profile's NVSwitch does not
    make every pair an 18-link pair (floor 270 GB/s, a false FAIL at a healthy 125); the links
    name GPUs, the P2P status names the peers, so the floor is 6 links x 25 x 0.6 = 90. One
    pair at PCIe speed still FAILs against it."""
    import yaml

    from checks.hw.scenario_file import load_scenario
    code, report = run_cli("--simulate", "node-hgx-h100-4gpu-nvlink-mesh", "--only",
                           "p2p-bandwidth")
    (p2p,) = by_id(report)["p2p-bandwidth"]["results"]
    assert code == 0 and p2p["status"] == "PASS", p2p["message"]
    assert p2p["details"]["classes"] == {"nvlink": {"pairs": 12, "min_gbs": 125.0,
                                                    "median_gbs": 125.0, "floor_gbs": 90.0}}
    base = load_scenario("node-hgx-h100-4gpu-nvlink-mesh")["_path"]
    path = tmp_path / "mesh-one-slow-pair.yaml"
    path.write_text(yaml.safe_dump({"description": "test: one pair at PCIe speed",
                                    "extends": str(base),
                                    "measurements": {"p2p": {"pairs": {"0-2": 52.0}}}}))
    code, report = run_cli("--simulate", str(path), "--only", "p2p-bandwidth")
    (p2p,) = by_id(report)["p2p-bandwidth"]["results"]
    assert code == 1 and p2p["status"] == "FAIL"
    assert "GPU0->GPU2 (nvlink) 52.0 GB/s below 90.0" in p2p["message"]


def test_bridged_pair_known_only_from_the_drivers_p2p_status(run_cli: Any, tmp_path: Any) -> None:
    """A driver that answers no remote end for any link, only NVLink P2P status for the pair:
    the bridged H100 NVL pair at PCIe speed is still an NVLink pair below its floor (12 links
    to its one peer)."""
    import yaml

    from checks.hw.scenario_file import load_scenario
    base = load_scenario("node-h100-nvl-pair-pcie-speed")["_path"]
    path = tmp_path / "nvl-p2p-status-only.yaml"
    link = {"links": 18, "inactive": [4, 5, 10, 11, 16, 17]}
    path.write_text(yaml.safe_dump({
        "description": "test: P2P status only", "extends": str(base),
        "gpus": [{"pci_bus_id": "0000:33:00.0", "nvlink": link,
                  "nvlink_p2p_peers": ["0000:8b:00.0"]},
                 {"pci_bus_id": "0000:8b:00.0", "nvlink": link,
                  "nvlink_p2p_peers": ["0000:33:00.0"]}]}))
    code, report = run_cli("--simulate", str(path), "--only", "p2p-bandwidth")
    (p2p,) = by_id(report)["p2p-bandwidth"]["results"]
    assert code == 1 and p2p["status"] == "FAIL"
    assert p2p["details"]["classes"]["nvlink"]["floor_gbs"] == 180.0


def test_bridged_h100_nvl_pair_at_pcie_speed_fails_against_its_nvlink_floor(
        run_cli: Any) -> None:
    code, report = run_cli("--simulate", "node-h100-nvl-pair-pcie-speed", "--only",
                           "p2p-bandwidth")
    assert code == 1
    (p2p,) = by_id(report)["p2p-bandwidth"]["results"]
    assert p2p["status"] == "FAIL"
    assert set(p2p["details"]["classes"]) == {"nvlink"}
    # 12 bridge links x 25 GB/s x the nvlink fraction 0.6
    assert p2p["details"]["classes"]["nvlink"]["floor_gbs"] == 180.0
    assert "GPU0->GPU1 (nvlink) 52.0 GB/s below 180.0" in p2p["message"]
