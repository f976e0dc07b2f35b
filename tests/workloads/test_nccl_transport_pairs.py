"""nccl-transport on cards paired by NVLink bridges (issue 44): each pair of ranks is judged by
the path between its GPUs. A bridged pair over SHM is a FAIL; a pair that only PCIe joins (the
next pair in the socket, a pair across sockets) may use SHM. The node is
node-a100-pcie-8x-bridged-pairs (NVIDIA/nccl-tests#178: NV12 pairs, NODE and SYS between them),
the shape of 4 or 8 H100/H200 NVL cards with 2-way bridges."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from checks.hw.measure.nccl_log import parse
from checks.hw.scenario_file import load_scenario
from checks.model import Status
from checks.node.suite.fabric_transport import TransportExpectation, judge_transport

BRIDGED = "node-a100-pcie-8x-bridged-pairs"
ONLY = ("--level", "standard", "--only", "nccl-allreduce,nccl-transport")


def transport(report: dict[str, Any] | None) -> dict[str, Any]:
    assert report is not None
    (found,) = [c for c in report["checks"] if c["id"] == "nccl-transport"]
    return found


def line(src: int, dst: int, via: str, channel: int = 0) -> str:
    return (f"a100x8:{41200 + src}:{41260 + src} [{src}] NCCL INFO Channel {channel:02d}/0 : "
            f"{src}[{src}] -> {dst}[{dst}] via {via}\n")


def variant(tmp_path: Path, name: str, base: str = BRIDGED, log: str | None = None,
            **patch: Any) -> str:
    """A scenario over `base`: another NCCL log, other host/gpu keys."""
    data: dict[str, Any] = {"description": f"test: {base} with {name} (NVIDIA/nccl-tests#178)",
                            "extends": str(Path(load_scenario(base)["_path"])), **patch}
    if log is not None:
        data["measurements"] = {"collectives": {"nccl_log": log}}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def shipped_log() -> str:
    return str(load_scenario(BRIDGED)["measurements"]["collectives"]["nccl_log"])


def test_bridged_pairs_with_shm_between_them_pass(run_cli) -> None:
    """The shipped node: P2P over each bridge, SHM between unbridged pairs (NODE and SYS).
    The old rule (any NVLink on the node: every in-node connection must be P2P) failed it."""
    _, report = run_cli("--simulate", BRIDGED, *ONLY)
    found = transport(report)
    assert found["status"] == "PASS", found["results"]
    (result,) = found["results"]
    assert "P2P x8, SHM x8" in result["message"]
    expected = result["details"]["expected"]
    assert expected["nvlink_pairs"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    # GPU3 (NUMA 0) - GPU4 (NUMA 1) crosses the sockets; GPU1 - GPU2 stays in one (NODE).
    assert [3, 4] in expected["pcie_pairs"] and [1, 2] in expected["pcie_pairs"]


def test_bridged_pair_over_shm_fails_naming_the_pair(run_cli, tmp_path: Path) -> None:
    log = shipped_log().replace("0[0] -> 1[1] via P2P/IPC/read", "0[0] -> 1[1] via SHM/direct/direct")
    _, report = run_cli("--simulate", variant(tmp_path, "pair-over-shm", log=log), *ONLY)
    found = transport(report)
    assert found["status"] == "FAIL", found["results"]
    message = found["results"][0]["message"]
    assert "rank 0 (GPU0) - rank 1 (GPU1)" in message and "NVLink joins" in message
    assert "rank 3" not in message  # the cross-socket SHM pair is not blamed


def test_unbridged_cross_socket_pair_over_shm_passes_and_over_p2p_too(run_cli,
                                                                     tmp_path: Path) -> None:
    for via in ("SHM/direct/direct", "P2P/IPC"):
        log = line(3, 4, via) + line(4, 3, via, 1) + line(0, 1, "P2P/IPC/read")
        _, report = run_cli("--simulate", variant(tmp_path, f"cross-{via[:3]}", log=log), *ONLY)
        assert transport(report)["status"] == "PASS", (via, transport(report)["results"])


def test_ranks_are_the_visible_gpus_in_order(run_cli, tmp_path: Path) -> None:
    """CUDA_VISIBLE_DEVICES=1,2: ranks 0 and 1 run on GPU1 and GPU2, which no bridge joins,
    so SHM between them passes; =0,1 puts them on a bridged pair, where SHM fails."""
    log = line(0, 1, "SHM/direct/direct") + line(1, 0, "SHM/direct/direct", 1)
    env = {"CUDA_VISIBLE_DEVICES": "1,2"}
    _, report = run_cli("--simulate", variant(tmp_path, "cvd-12", log=log, host={"env": env}),
                        *ONLY, "--nproc", "2")
    assert transport(report)["status"] == "PASS", transport(report)["results"]
    env = {"CUDA_VISIBLE_DEVICES": "0,1"}
    _, report = run_cli("--simulate", variant(tmp_path, "cvd-01", log=log, host={"env": env}),
                        *ONLY, "--nproc", "2")
    found = transport(report)
    assert found["status"] == "FAIL" and "rank 0 (GPU0) - rank 1 (GPU1)" in \
        found["results"][0]["message"]


def test_peers_nvml_does_not_name_are_a_warn_not_a_guess(run_cli, tmp_path: Path) -> None:
    """Links up but no remote PCI address or NVLink P2P status: on eight GPUs the pairs cannot
    be told, so SHM between two of them is a WARN that says so (neither a FAIL on a guess nor a
    PASS)."""
    unnamed = [{k: v for k, v in g.items() if k != "nvlink"}
               for g in load_scenario(BRIDGED)["gpus"]]
    path = variant(tmp_path, "unnamed", log=shipped_log(), gpus=unnamed,
                   gpu_defaults={"nvlink": {"links": 12, "inactive": []}})
    _, report = run_cli("--simulate", path, *ONLY)
    found = transport(report)
    assert found["status"] == "WARN", found["results"]
    assert "whether a bridge joins them is unknown" in found["results"][0]["message"]
    assert found["results"][0]["remedy"]


def test_two_cards_whose_links_name_no_peer_are_each_others_pair(run_cli, tmp_path: Path) -> None:
    """node-h100-nvl-pair: the only two GPUs with active links are bridged to each other even
    when NVML names no far end, so SHM between them stays a FAIL (as before)."""
    shm = line(0, 1, "SHM/direct/direct") + line(1, 0, "SHM/direct/direct", 1)
    _, report = run_cli("--simulate", variant(tmp_path, "nvl-shm", "node-h100-nvl-pair", shm),
                        *ONLY)
    assert transport(report)["status"] == "FAIL", transport(report)["results"]
    p2p = shm.replace("SHM/direct/direct", "P2P/CUMEM/read")
    _, report = run_cli("--simulate", variant(tmp_path, "nvl-p2p", "node-h100-nvl-pair", p2p),
                        *ONLY)
    assert transport(report)["status"] == "PASS", transport(report)["results"]


def test_judge_by_pair_and_the_old_every_pair_rule() -> None:
    log = parse(line(0, 1, "P2P/IPC/read") + line(1, 2, "SHM/direct/direct"))
    per_pair = TransportExpectation(False, (), True, False, frozenset({(0, 1), (2, 3)}),
                                    frozenset({(1, 2), (0, 2), (0, 3), (1, 3)}))
    assert judge_transport(log, per_pair).status is Status.PASS
    # Without pairs (an NVSwitch node): every in-node connection must be P2P.
    assert judge_transport(log, TransportExpectation(False, (), True, False)).status \
        is Status.FAIL
    unknown = TransportExpectation(False, (), True, False, frozenset({(0, 1)}), frozenset())
    assert judge_transport(log, unknown).status is Status.WARN


def test_the_all_reduce_floor_of_bridged_pairs_is_the_pcie_hop(run_cli, tmp_path: Path) -> None:
    """nccl-allreduce's derived floor: a ring over several bridged pairs crosses PCIe between them
    (nccl-tests#178: 208 GB/s inside a pair, ~20 across), so its pace is the PCIe hop's, not 12
    NV12 links' (the old floor, 210 GB/s, failed this healthy node at 20). Two ranks on one pair
    still ride the bridge, and are still held to the NVLink floor."""
    _, report = run_cli("--simulate", BRIDGED, *ONLY)
    assert report is not None
    (allreduce,) = [c for c in report["checks"] if c["id"] == "nccl-allreduce"]
    (result,) = allreduce["results"]
    assert allreduce["status"] == "PASS", result
    assert "derived: PCIe Gen4 x16" in result["expected"], result
    from checks.hw.fixture import FixtureBackend
    from checks.node.context import Context, Options
    from checks.node.node_cli import choose_profile
    from checks.node.suite.collective import derived_threshold

    hw = FixtureBackend.from_file(BRIDGED)
    ctx = Context(hw, choose_profile(hw, None), Options())
    pair = derived_threshold(ctx, 2)
    assert pair is not None and "NVLinks" in pair.source and pair.value > 100
    ring = derived_threshold(ctx, 8)
    assert ring is not None and "PCIe" in ring.source and ring.value < 20
