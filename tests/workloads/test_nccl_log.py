"""The NCCL INFO log parser and the transport verdict, on logs of several NCCL versions written
from public reports (each file's header names its source)."""

from __future__ import annotations

from pathlib import Path

import pytest

from checks.hw.measure import nccl_log
from checks.hw.measure.nccl_log import NcclLog, parse, parse_file
from checks.model import Status
from checks.node.suite.fabric_transport import TransportExpectation, judge_transport

LOGS = Path(__file__).parent / "nccl_logs"
IB_UP = ("mlx5_0:1", "mlx5_1:1")


def log(name: str) -> NcclLog:
    return parse_file(LOGS / name)


def cross(rdma_up: tuple[str, ...] = IB_UP, nvlink: bool = True, nvls: bool = False):
    return TransportExpectation(cross_host=True, rdma_up=rdma_up, nvlink=nvlink, nvls=nvls)


def single(nvlink: bool = True, nvls: bool = False):
    return TransportExpectation(cross_host=False, rdma_up=(), nvlink=nvlink, nvls=nvls)


def test_every_log_file_names_its_public_source() -> None:
    files = sorted(LOGS.glob("*.log"))
    assert len(files) >= 6
    for path in files:
        header = path.read_text().splitlines()[0]
        assert header.startswith("# Written for nodecert from the facts in "), path.name
        assert "#" in header.split("facts in ", 1)[1], path.name  # repo#issue


# --- parsing, per NCCL version ---------------------------------------------------------------
def test_nccl_2_5_ring_lines_ib_without_gdrdma() -> None:
    parsed = log("ib-no-gdrdma-2.5.6-nvpeermem56.log")
    assert parsed.versions == ["2.5.6"]
    assert parsed.ib_devices == ["mlx5_0:1/IB"]
    assert parsed.hosts == ["master_node", "secondary_node"]
    # Both ends log a connection: 2 inter-node connections (x2 directions logged) and 6 P2P.
    assert parsed.kinds == {"NET/IB": 2, "P2P": 6}
    assert all(not c.gdr for c in parsed.net)
    assert parsed.gdr_disabled == ["HCA 0"]  # the 2.4-2.6 wording "for GPU 0[0] / HCA 0"


def test_nccl_2_11_socket_network() -> None:
    parsed = log("socket-forced-2.11.4-nccl676.log")
    assert parsed.versions == ["2.11.4"]
    assert parsed.networks == ["Socket"]
    assert parsed.socket_interfaces[0] == "enp225s0f1:10.10.10.2<0>"
    assert {c.kind for c in parsed.connections} == {"NET/Socket"}
    assert {c.direction for c in parsed.connections} <= {"send", "receive"}
    assert len(parsed.socket) == 4  # channels 00/01 x two directions


def test_nccl_2_18_p2p_direct_pointer_and_zero_nvls_channels() -> None:
    parsed = log("h800-no-nvls-2.18.3-nccl892.log")
    assert parsed.versions == ["2.18.3"]
    assert parsed.kinds == {"P2P": 4}
    assert parsed.connections[0].via == "P2P/direct pointer"
    assert parsed.nvls_available == {0: False, 1: False, 7: False}
    assert parsed.nvls_channels == 0 and parsed.nvls_used is False


def test_cumem_p2p_and_ib_gdrdma_connections() -> None:
    parsed = log("h20-ib-gdrdma-cumem-nccl1189.log")
    assert parsed.versions == []  # the report quotes no version line: none is invented
    assert parsed.kinds == {"NET/IB+GDRDMA": 3, "P2P": 3}  # ch 07 0->2 logged by both ends
    assert {c.via for c in parsed.connections if c.transport == "P2P"} == {"P2P/CUMEM"}
    assert parsed.networks == ["IB"] and len(parsed.ib_devices) == 4


def test_nccl_2_24_plugin_network_and_nvls_available() -> None:
    parsed = log("hgx-ibext-sharp-nvls-2.24.3-nccl1584.log")
    assert parsed.versions == ["2.24.3"]  # printed behind the INFO prefix since 2.2x
    assert parsed.networks == ["IBext_v8"]
    assert parsed.ib_devices[0] == "ibp0:1/IB/SHARP" and len(parsed.ib_devices) == 8
    assert parsed.nvls_available == {0: True} and parsed.nvls_used is True
    assert parsed.nnodes == 1
    assert parsed.connections == []


def test_gdr_disabled_lines_name_the_hcas() -> None:
    parsed = log("gdr-disabled-peermem-rename-nccl1676.log")
    assert parsed.gdr_disabled == ["mlx5_0", "mlx5_1", "mlx5_2"]
    assert parsed.kinds == {"NET/IB": 2, "P2P": 1}


def test_pxn_proxy_rank_and_plugin_names_with_spaces() -> None:
    text = ("h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0(1)/GDRDMA\n"
            "h:1:2 [0] NCCL INFO Channel 01/0 : 0[0] -> 8[0] [send] via NET/AWS Libfabric/0/GDRDMA\n"
            "h:1:2 [0] NCCL INFO Channel 02 : 3[3] -> 4[4] via SHM/direct/direct\n")
    parsed = parse(text)
    assert [c.kind for c in parsed.connections] == ["NET/IB+GDRDMA",
                                                     "NET/AWS Libfabric+GDRDMA", "SHM"]


def test_lines_without_prefix_or_with_other_output_are_tolerated() -> None:
    text = ("2024-12-04T05:27:44.078Z\nsomething else entirely\n"
            "NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read\n"
            "Traceback (most recent call last):\n")
    parsed = parse(text)
    assert parsed.info_lines == 1 and parsed.kinds == {"P2P": 1} and parsed.hosts == []


def test_round_trip_through_the_report_dict() -> None:
    parsed = log("h20-ib-gdrdma-cumem-nccl1189.log")
    again = NcclLog.from_dict(parsed.to_dict())
    assert again.kinds == parsed.kinds and again.hosts == parsed.hosts
    assert again.summary()["transports"] == parsed.summary()["transports"]


# --- the verdict -------------------------------------------------------------------------------
def test_socket_fallback_while_ib_is_up_fails_naming_it() -> None:
    result = judge_transport(log("socket-forced-2.11.4-nccl676.log"), cross())
    assert result.status is Status.FAIL
    assert "NET/Socket" in result.message and "mlx5_0:1" in result.message
    assert "enp225s0f1" in result.message
    assert "2.11.4" in result.message


def test_socket_across_hosts_without_rdma_passes_with_the_reason() -> None:
    result = judge_transport(log("socket-two-nodes-nccltests284.log"), cross(rdma_up=()))
    assert result.status is Status.PASS
    assert "no RDMA port up" in result.message


def test_ib_without_gdrdma_fails_as_gpudirect_off() -> None:
    for name in ("ib-no-gdrdma-2.5.6-nvpeermem56.log", "gdr-disabled-peermem-rename-nccl1676.log"):
        result = judge_transport(log(name), cross())
        assert result.status is Status.FAIL, name
        assert "without GDRDMA" in result.message and "GPUDirect RDMA is off" in result.message
    result = judge_transport(log("gdr-disabled-peermem-rename-nccl1676.log"), cross())
    assert "mlx5_0, mlx5_1, mlx5_2" in result.message


def test_ib_with_gdrdma_and_p2p_in_node_passes() -> None:
    result = judge_transport(log("h20-ib-gdrdma-cumem-nccl1189.log"), cross())
    assert result.status is Status.PASS
    assert "NET/IB+GDRDMA x3" in result.message and "P2P x3" in result.message
    assert result.details["nccl"]["hosts"] == ["H20-GPU-05", "H20-GPU-06"]


def test_cross_host_run_without_net_connections_is_not_a_pass() -> None:
    result = judge_transport(log("h800-no-nvls-2.18.3-nccl892.log"), cross())
    assert result.status is Status.FAIL and "no inter-node" in result.message


def test_missing_nvls_on_an_nvswitch_hopper_node_warns() -> None:
    result = judge_transport(log("h800-no-nvls-2.18.3-nccl892.log"), single(nvls=True))
    assert result.status is Status.WARN and "NVLS not used" in result.message
    assert judge_transport(log("h800-no-nvls-2.18.3-nccl892.log"),
                           single(nvls=False)).status is Status.PASS


def test_shm_in_node_on_an_nvlink_node_fails() -> None:
    text = "h:1:2 [3] NCCL INFO Channel 00 : 3[3] -> 4[4] via SHM/direct/direct\n"
    assert judge_transport(parse(text), single(nvlink=True)).status is Status.FAIL
    # PCIe GPUs on two sockets legitimately go through host memory.
    assert judge_transport(parse(text), single(nvlink=False)).status is Status.PASS


def test_a_log_that_cannot_tell_is_an_error_never_a_pass() -> None:
    assert judge_transport(parse(""), single()).status is Status.ERROR
    init_only = log("hgx-ibext-sharp-nvls-2.24.3-nccl1584.log")
    result = judge_transport(init_only, single(nvls=True))
    assert result.status is Status.ERROR and "no channel connection" in result.message


def test_debug_env_and_cli(capsys: pytest.CaptureFixture[str]) -> None:
    assert nccl_log.debug_env() == {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET,GRAPH"}
    assert nccl_log.main([str(LOGS / "socket-forced-2.11.4-nccl676.log")]) == 0
    assert '"NET/Socket": 4' in capsys.readouterr().out
    assert nccl_log.main(["/nonexistent/nccl.log"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1
    assert nccl_log.main([]) == 2


def test_capture_reads_the_launch_log_and_cleans_up(tmp_path: Path) -> None:
    with nccl_log.capture(None, active=True) as cap:
        directory = Path(cap.workdir)
        (directory / nccl_log.LAUNCH_LOG).write_text(
            (LOGS / "h20-ib-gdrdma-cumem-nccl1189.log").read_text())
        parsed = cap.parse({"ok": True, "workdir": None})
    assert parsed is not None and parsed.kinds["NET/IB+GDRDMA"] == 3
    assert not directory.exists()  # a clean run leaves nothing behind
    with nccl_log.capture(str(tmp_path), active=True) as cap:
        assert cap.parse({"ok": False}).info_lines == 0  # no log file: empty, judged ERROR
    with nccl_log.capture(None, active=False) as cap:
        assert cap.workdir is None and cap.parse({"ok": True}) is None
    with nccl_log.capture(None, active=True) as cap:
        assert cap.parse({"ok": True}, simulated=True) is None


def test_cross_host_stage_fails_a_finished_run_that_used_sockets() -> None:
    from checks.model import passed
    from checks.node.crosshost_node import transport_verdict

    result = transport_verdict(passed("4 ranks nccl: exact; busbw 21 GB/s"),
                               log("socket-forced-2.11.4-nccl676.log"), IB_UP)
    assert result.status is Status.FAIL
    assert result.message.startswith("4 ranks nccl") and "transport: " in result.message
    assert result.details["transports"] == {"NET/Socket": 4}
    assert result.details["nccl_transport"]["status"] == "FAIL"
    ok = transport_verdict(passed("fine"), log("h20-ib-gdrdma-cumem-nccl1189.log"), IB_UP)
    assert ok.status is Status.PASS and ok.details["transports"]["NET/IB+GDRDMA"] == 3
    # Hosts without RDMA ports: sockets are all there is.
    assert transport_verdict(passed("fine"), log("socket-two-nodes-nccltests284.log"),
                             ()).status is Status.PASS
