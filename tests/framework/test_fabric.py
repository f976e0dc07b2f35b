"""Multi-node readiness checks (checks/node/suite/fabric_*.py) through the CLI on the fabric-* scenarios,
unit cases on in-memory scenarios, and the sysfs reader (checks/hw/rdma.py) on a fake tree."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from checks.hw import rdma
from checks.hw.base import HardwareError
from checks.hw.fixture import FixtureBackend, load_scenario
from checks.model import Status
from checks.node.context import Context, Options
from checks.node.suite import fabric_links, fabric_paths, fabric_transport
from checks.profiles import load

FABRIC = ("rdma-ports", "rdma-firmware", "rdma-counters", "rdma-rails", "gpudirect-rdma",
          "pcie-acs", "nccl-env")
IMBUE = "fabric-hgx-h100-ib-imbue4"


def results(report: dict[str, Any], check_id: str) -> list[dict[str, Any]]:
    return next(c for c in report["checks"] if c["id"] == check_id)["results"]


def status(report: dict[str, Any], check_id: str) -> str:
    return next(c for c in report["checks"] if c["id"] == check_id)["status"]


def run_checks(scenario: dict[str, Any], profile: str = "h100-sxm",
               **extra: Any) -> dict[str, list[Any]]:
    """Run the fabric checks on an in-memory scenario; {check id: [Result, ...]}."""
    hw = FixtureBackend(scenario)
    ctx = Context(hw, load(profile), Options(level="quick", extra=extra))
    out = {}
    for name in FABRIC:
        fn = name.replace("-", "_")
        module = next(m for m in (fabric_links, fabric_paths, fabric_transport) if hasattr(m, fn))
        produced = getattr(module, fn)(ctx)
        out[name] = produced if isinstance(produced, list) else [produced]
    return out


@pytest.fixture
def imbue() -> dict[str, Any]:
    return load_scenario(IMBUE)


# --- shipped scenarios through the CLI ---------------------------------------------------------
def test_host_without_rdma_skips_with_the_reason(run_cli) -> None:
    code, report, _ = run_cli("--simulate", "h100-sxm-8x-healthy", "--level", "quick")
    assert code == 0
    for check_id in FABRIC[:-1]:
        assert status(report, check_id) == "SKIP", check_id
        assert "no RDMA devices" in results(report, check_id)[0]["message"]
    assert status(report, "nccl-env") == "PASS"


def test_multinode_ready_hgx_h100(run_cli) -> None:
    code, report, _ = run_cli("--simulate", IMBUE, "--level", "quick")
    assert code == 0
    for check_id in ("rdma-firmware", "rdma-rails", "gpudirect-rdma", "pcie-acs", "nccl-env"):
        assert status(report, check_id) == "PASS", check_id
    ports = results(report, "rdma-ports")
    assert {r["device"]["name"] for r in ports if r["status"] == "PASS"} >= {
        f"mlx5_{n}:1" for n in (0, 3, 4, 5, 6, 9, 10, 11)}
    # The uncabled second ports of the front-end CX-6 cards are shown, not failed.
    assert {r["device"]["name"] for r in ports if r["status"] == "WARN"} == {"mlx5_2:1",
                                                                            "mlx5_8:1"}
    rails = results(report, "rdma-rails")[0]["details"]["rails"]
    assert rails["GPU0 0000:18:00.0"] == {"nic": "mlx5_0", "affinity": "pcie-switch"}
    assert rails["GPU7 0000:db:00.0"] == {"nic": "mlx5_11", "affinity": "pcie-switch"}
    counters = [r["status"] for r in results(report, "rdma-counters")]
    assert counters.count("PASS") == 8 and counters.count("SKIP") == 4  # RoCE: no IB counters


def test_port_polling_fails_naming_the_port(run_cli) -> None:
    code, report, _ = run_cli("--simulate", "fabric-hgx-h100-port-polling-gpud482",
                              "--level", "quick")
    assert code == 1
    failed = [r for r in results(report, "rdma-ports") if r["status"] == "FAIL"]
    assert [r["device"]["name"] for r in failed] == ["mlx5_10:1"]
    assert "DOWN/Polling" in failed[0]["message"] and failed[0]["fault_code"] == "NET001"


def test_six_nics_for_eight_gpus_fails_unless_expected(run_cli) -> None:
    code, report, _ = run_cli("--simulate", "fabric-hgx-h100-6nics-nccl1591", "--level", "quick")
    assert code == 1 and status(report, "rdma-rails") == "FAIL"
    assert "6 compute NIC(s), expected 8" in results(report, "rdma-rails")[0]["message"]
    code, report, _ = run_cli("--simulate", "fabric-hgx-h100-6nics-nccl1591", "--level", "quick",
                              "--expect-rdma-nics", "6")
    assert status(report, "rdma-rails") == "PASS"
    rails = results(report, "rdma-rails")[0]["details"]["rails"]
    assert rails["GPU2 0000:3a:00.0"] == {"nic": "mlx5_1", "affinity": "pcie-switch"}
    assert rails["GPU1 0000:2a:00.0"]["affinity"] == "numa"


def test_real_nccl_variables_of_nccl_tests_228_raise_no_alarm(run_cli) -> None:
    _, report, _ = run_cli("--simulate", "fabric-a100-ib-hca-nccltests228", "--level", "quick")
    assert status(report, "nccl-env") == "PASS"
    assert "NCCL_IB_HCA=mlx5_2:1,mlx5_0:1" in results(report, "nccl-env")[0]["message"]
    assert status(report, "rdma-ports") == "PASS"  # HDR 200 meets the A100 profile's 200


def test_expect_rdma_rate_option(run_cli) -> None:
    code, report, _ = run_cli("--simulate", IMBUE, "--level", "quick", "--only", "rdma-ports",
                              "--expect-rdma-rate", "800")
    assert code == 1
    text = results(report, "rdma-ports")[0]["message"]
    assert "below the expected 800" in text and "--expect-rdma-rate" in text
    code, _, err = run_cli("--simulate", IMBUE, "--expect-rdma-nics", "0")
    assert code == 2 and "--expect-rdma-nics must be positive" in err


# --- unit cases on in-memory scenarios ---------------------------------------------------------
def _port(scenario: dict[str, Any], device: str) -> dict[str, Any]:
    return next(d for d in scenario["rdma"]["devices"] if d["name"] == device)["ports"][0]


def test_half_rate_port_fails(imbue) -> None:
    _port(imbue, "mlx5_4")["rate"] = "200 Gb/sec (4X HDR)"
    failed = [r for r in run_checks(imbue)["rdma-ports"] if r.status is Status.FAIL]
    assert len(failed) == 1 and "runs at 200 Gb/s, below the expected 400" in failed[0].message
    assert run_checks(imbue, expect_rdma_rate=200)["rdma-ports"][0].status is Status.PASS


def test_roce_port_without_v2_gid_fails(imbue) -> None:
    _port(imbue, "mlx5_1")["gids"] = [{"index": 0, "gid": "fe80:0000:0000:0000:5aa2:e1ff:fe00:1",
                                       "type": "IB/RoCE v1"}]
    roce = next(r for r in run_checks(imbue)["rdma-ports"] if r.device.name == "mlx5_1:1")
    assert roce.status is Status.FAIL and "no RoCE v2 GID" in roce.message


def test_low_mtu_warns_and_unread_mtu_is_said(imbue) -> None:
    _port(imbue, "mlx5_0")["active_mtu"] = 2048
    _port(imbue, "mlx5_3").pop("active_mtu")
    by_name = {r.device.name: r for r in run_checks(imbue)["rdma-ports"]}
    assert by_name["mlx5_0:1"].status is Status.WARN and "MTU 2048" in by_name["mlx5_0:1"].message
    assert "MTU not read" in by_name["mlx5_3:1"].message


def test_mixed_firmware_fails_naming_the_odd_hca(imbue) -> None:
    next(d for d in imbue["rdma"]["devices"] if d["name"] == "mlx5_9")["fw_ver"] = "28.36.1010"
    fw = run_checks(imbue)["rdma-firmware"]
    bad = [r for r in fw if r.status is Status.FAIL]
    assert len(bad) == 1 and "mlx5_9 on 28.36.1010" in bad[0].message
    assert "7 HCA(s) on 28.39.1002" in bad[0].message


@pytest.mark.parametrize("downed,expected", [(0, Status.PASS), (2, Status.WARN),
                                             (7, Status.FAIL)])
def test_link_flaps(imbue, downed: int, expected: Status) -> None:
    _port(imbue, "mlx5_5")["counters"]["link_downed"] = downed
    result = next(r for r in run_checks(imbue)["rdma-counters"] if r.device.name == "mlx5_5:1")
    assert result.status is expected
    if downed:
        assert f"went down {downed} time(s)" in result.message


def test_ib_port_exposing_no_counters_is_an_error(imbue) -> None:
    _port(imbue, "mlx5_6")["counters"] = {}
    result = next(r for r in run_checks(imbue)["rdma-counters"] if r.device.name == "mlx5_6:1")
    assert result.status is Status.ERROR


def test_cross_socket_nearest_nic_warns(imbue) -> None:
    # Keep only the socket-1 HCAs: socket-0 GPUs' nearest NIC is across the socket.
    imbue["rdma"]["devices"] = [d for d in imbue["rdma"]["devices"]
                                if d["name"] in ("mlx5_6", "mlx5_9", "mlx5_10", "mlx5_11")]
    rails = run_checks(imbue, expect_rdma_nics=4)["rdma-rails"]
    assert [r.status for r in rails] == [Status.WARN]
    assert "4 GPU(s) have their nearest NIC across the socket" in rails[0].message


@pytest.mark.parametrize("modules,peers,proc,kernel,expected", [
    (["nvidia", "nvidia_peermem"], ["nv_mem"], None, "5.15.0-119-generic", Status.PASS),
    # nccl#1939: loaded, memory_peers missing, proprietary module: no GPUDirect path
    (["nvidia", "nvidia_peermem"], None, "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550",
     "6.8.0-90-generic", Status.FAIL),
    (["nvidia", "nvidia_peermem"], None, None, "6.8.0-90-generic", Status.WARN),  # open: dma-buf?
    (["nvidia"], None, None, "6.8.0-90-generic", Status.PASS),  # dma-buf
    (["nvidia"], None, None, "5.4.0-150-generic", Status.FAIL),  # too old for dma-buf
])
def test_gpudirect(imbue, modules, peers, proc, kernel, expected) -> None:
    imbue["host"].update(modules=modules, memory_peers=peers, kernel=kernel)
    if proc:
        imbue["driver"]["proc_version"] = proc
    result = run_checks(imbue)["gpudirect-rdma"][0]
    assert result.status is expected, result.message


def test_acs_redirect_between_gpu_and_nic(imbue) -> None:
    switch_port = "0000:19:00.0"  # downstream port above mlx5_0 (GPU0's switch)
    imbue["host"]["acs"] = {switch_port: 0x1D}  # SrcValid ReqRedir CmpltRedir UpstreamFwd
    acs = run_checks(imbue)["pcie-acs"]
    bad = [r for r in acs if r.status is Status.FAIL]
    assert len(bad) == 1 and bad[0].device.pci == "0000:18:00.0"
    assert switch_port in bad[0].message and "ReqRedir" in bad[0].message
    imbue["host"]["virtualization"] = "kvm"
    assert all(r.status is Status.PASS for r in run_checks(imbue)["pcie-acs"])
    imbue["host"]["acs"] = {switch_port: {"error": "Permission denied"}}
    errors = [r for r in run_checks(imbue)["pcie-acs"] if r.status is Status.ERROR]
    assert len(errors) == 1 and "not readable" in errors[0].message


def test_unreadable_rdma_class_is_an_error_not_a_skip(imbue) -> None:
    imbue["rdma"] = {"error": "Permission denied"}
    hw = FixtureBackend(imbue)
    ctx = Context(hw, load("h100-sxm"), Options(level="quick"))
    with pytest.raises(HardwareError):
        fabric_links.rdma_ports(ctx)  # the runner turns this into ERROR "could not measure"


@pytest.mark.parametrize("env,expected,words", [
    ({"NCCL_P2P_DISABLE": "1"}, Status.FAIL, "peer-to-peer"),
    ({"NCCL_P2P_LEVEL": "LOC"}, Status.FAIL, "nccl-tests#228"),
    ({"NCCL_IB_DISABLE": "1"}, Status.FAIL, "TCP sockets"),
    ({"NCCL_NET": "Socket"}, Status.FAIL, "TCP socket"),
    ({"NCCL_SHM_DISABLE": "1"}, Status.WARN, "shared-memory"),
    ({"NCCL_NVLS_ENABLE": "0"}, Status.WARN, "NVLink SHARP"),
    ({"NCCL_SOCKET_IFNAME": "bond0"}, Status.FAIL, "selects no interface"),
    ({"NCCL_SOCKET_IFNAME": "=ibp2"}, Status.FAIL, "selects no interface"),  # exact: no ibp2
    ({"NCCL_SOCKET_IFNAME": "enp27"}, Status.PASS, ""),  # prefix match
    ({"NCCL_SOCKET_IFNAME": "^docker,lo"}, Status.PASS, ""),  # exclusion list
    ({"NCCL_IB_HCA": "mlx5_20,mlx5_21"}, Status.FAIL, "selects none of the HCAs"),
    ({"NCCL_IB_HCA": "=mlx5_1"}, Status.PASS, ""),
    ({"NCCL_IB_DISABLE": "0", "NCCL_DEBUG": "INFO"}, Status.PASS, ""),
])
def test_nccl_env(imbue, env, expected, words) -> None:
    imbue["host"]["env"] = env
    found = run_checks(imbue)["nccl-env"]
    assert [r.status for r in found] == [expected], [r.message for r in found]
    assert words in found[0].message


def test_ib_variables_are_harmless_without_rdma(imbue) -> None:
    imbue.pop("rdma")
    imbue["host"]["env"] = {"NCCL_IB_DISABLE": "1", "NCCL_P2P_DISABLE": "1"}
    found = run_checks(imbue)["nccl-env"]
    assert {r.status for r in found} == {Status.PASS, Status.FAIL}
    assert any("harmless here" in r.message for r in found)


# --- proof of transport through the collective check -------------------------------------------
def _with_log(tmp_path: Path, log_text: str, base: str = IMBUE) -> str:
    rows = [{"bytes": 1 << p, "busbw_gbs": bw} for p, bw in ((20, 60.0), (28, 470.0))]
    scenario = {"description": "test: the collective with an NCCL INFO log",
                "extends": str(Path(load_scenario(base)["_path"])),
                "measurements": {"collectives": {"ops": {"all_reduce": rows},
                                                 "nccl_log": log_text}}}
    path = tmp_path / "with-log.yaml"
    path.write_text(yaml.safe_dump(scenario))
    return str(path)


def test_transport_check_reads_the_log_of_the_collective(run_cli, tmp_path: Path) -> None:
    p2p = "".join(f"h:1:2 [{i}] NCCL INFO Channel 00/0 : {i}[{i}] -> {(i + 1) % 8}[{i}] via "
                  "P2P/CUMEM/read\n" for i in range(8))
    nvls = "h:1:2 [0] NCCL INFO 16 coll channels, 16 nvls channels, 32 p2p channels\n"
    code, report, _ = run_cli("--simulate", _with_log(tmp_path, p2p + nvls), "--only",
                              "nccl-allreduce,nccl-transport")
    assert status(report, "nccl-transport") == "PASS", results(report, "nccl-transport")
    assert results(report, "nccl-allreduce")[0]["details"]["transports"] == {"P2P": 8}
    shm = p2p.replace("P2P/CUMEM/read", "SHM/direct/direct")
    code, report, _ = run_cli("--simulate", _with_log(tmp_path, shm + nvls), "--only",
                              "nccl-allreduce,nccl-transport")
    assert code == 1 and status(report, "nccl-transport") == "FAIL"
    assert "in-node traffic via SHM" in results(report, "nccl-transport")[0]["message"]
    code, report, _ = run_cli("--simulate", _with_log(tmp_path, p2p), "--only",
                              "nccl-allreduce,nccl-transport")
    # NVSwitch Hopper node and the log does not show NVLS channels: cannot say it was used,
    # so no WARN either (nvls_used is None), and the P2P transport passes.
    assert status(report, "nccl-transport") == "PASS"


def test_transport_check_without_a_log_skips_with_the_reason(run_cli) -> None:
    _, report, _ = run_cli("--simulate", "workload-low-busbw", "--only", "nccl-transport")
    assert "nccl-allreduce did not run" in results(report, "nccl-transport")[0]["message"]
    _, report, _ = run_cli("--simulate", "workload-low-busbw", "--only",
                              "nccl-allreduce,nccl-transport")
    assert status(report, "nccl-transport") == "SKIP"
    assert "records no NCCL log" in results(report, "nccl-transport")[0]["message"]


def test_transport_check_skips_on_this_cpu_host_with_the_reason(run_cli) -> None:
    """The real backend on a machine without GPUs: gloo ranks, no NCCL transport to prove."""
    _, report, _ = run_cli("--only", "nccl-allreduce,nccl-transport", "--nproc", "2")
    if status(report, "nccl-allreduce") != "PASS":
        pytest.skip("the gloo collective did not run here: "
                    f"{results(report, 'nccl-allreduce')[0]['message']}")
    assert status(report, "nccl-transport") == "SKIP"
    assert "gloo" in results(report, "nccl-transport")[0]["message"]
    assert "nccl_log" not in results(report, "nccl-allreduce")[0]["details"]


# --- the sysfs reader --------------------------------------------------------------------------
def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def fake_sys(root: Path) -> tuple[Path, Path]:
    """/sys/class/infiniband with one IB HCA and one RoCE NIC, devices under a PCI tree."""
    pci = root / "devices/pci0000:00/0000:00:01.0/0000:01:00.0"
    ib, net = root / "class/infiniband", root / "class/net"
    for name, bdf, layer in (("mlx5_0", "0000:02:00.0", "InfiniBand"),
                             ("mlx5_1", "0000:03:00.0", "Ethernet")):
        device = pci / bdf
        _write(device / "numa_node", "1")
        base = ib / name
        _write(base / "fw_ver", "28.39.1002")
        _write(base / "hca_type", "MT4129")
        os.symlink(device, base / "device")
        port = base / "ports/1"
        _write(port / "state", "4: ACTIVE")
        _write(port / "phys_state", "5: LinkUp")
        _write(port / "link_layer", layer)
        _write(port / "rate", "400 Gb/sec (4X NDR)" if layer == "InfiniBand"
               else "100 Gb/sec (4X EDR)")
        _write(port / "gids/0", "fe80:0000:0000:0000:5aa2:e1ff:fe00:0001")
        _write(port / "gids/1", "0000:0000:0000:0000:0000:0000:0000:0000")
        if layer == "InfiniBand":
            _write(port / "counters/symbol_error", "3")
            _write(port / "counters/link_downed", "1")
        else:
            _write(port / "gids/3", "0000:0000:0000:0000:0000:ffff:0a00:0105")
            _write(port / "gid_attrs/types/0", "IB/RoCE v1")
            _write(port / "gid_attrs/types/3", "RoCE v2")
            _write(port / "gid_attrs/ndevs/3", "enp3s0np0")
            _write(net / "enp3s0np0/mtu", "9000")
    return ib, net


def test_sysfs_reader(tmp_path: Path) -> None:
    ib, net = fake_sys(tmp_path)
    devices = rdma.read_devices(ib, net, mtus={("mlx5_0", 1): 4096})
    by_name = {d.name: d for d in devices}
    hca = by_name["mlx5_0"]
    assert (hca.fw_ver, hca.hca_type, hca.pci_address, hca.numa_node) == (
        "28.39.1002", "MT4129", "0000:02:00.0", 1)
    assert hca.pci_path == ("0000:00:01.0", "0000:01:00.0")
    port = hca.ports[0]
    assert (port.state, port.phys_state, port.rate_gbps, port.width, port.speed) == (
        "ACTIVE", "LinkUp", 400.0, "4X", "NDR")
    assert port.counters == {"link_downed": 1, "symbol_error": 3}
    assert port.active_mtu == 4096 and len(port.gids) == 1  # the all-zero GID is skipped
    roce = by_name["mlx5_1"].ports[0]
    assert roce.link_layer == "Ethernet" and roce.netdev == "enp3s0np0"
    assert [g["type"] for g in roce.gids] == ["IB/RoCE v1", "RoCE v2"]
    assert roce.active_mtu == 4096  # from the 9000-byte Ethernet MTU
    assert rdma.read_devices(tmp_path / "absent", net, mtus={}) == []


def test_ibv_devinfo_parsing_and_rates() -> None:
    text = ("hca_id:\tmlx5_0\n\ttransport:\t\t\tInfiniBand (0)\n\t\tport:\t1\n"
            "\t\t\tstate:\t\t\tPORT_DOWN (1)\n\t\t\tmax_mtu:\t\t4096 (5)\n"
            "\t\t\tactive_mtu:\t\t4096 (5)\n\nhca_id:\tmlx5_1\n\t\tport:\t1\n"
            "\t\t\tactive_mtu:\t\t1024 (3)\n")
    assert rdma.parse_ibv_devinfo(text) == {("mlx5_0", 1): 4096, ("mlx5_1", 1): 1024}
    assert rdma.parse_rate("10 Gb/sec (4X SDR)") == (10.0, "4X", "SDR")
    assert rdma.parse_rate("40 Gb/sec (4X)") == (40.0, "4X", None)
    assert rdma.parse_rate("garbage") == (None, None, None)
    assert rdma.roce_mtu("1500") == 1024 and rdma.roce_mtu("9000") == 4096


def _config(acs_control: int | None) -> bytes:
    """4 KiB config space: AER at 0x100 -> (ACS at 0x148 with this control)."""
    data = bytearray(4096)
    nxt = 0x148 if acs_control is not None else 0
    data[0x100:0x104] = (0x0001 | (1 << 16) | (nxt << 20)).to_bytes(4, "little")
    if acs_control is not None:
        data[0x148:0x14C] = (0x000D | (1 << 16)).to_bytes(4, "little")
        data[0x14E:0x150] = acs_control.to_bytes(2, "little")
    return bytes(data)


def test_acs_from_config_space(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert rdma.acs_from_config(_config(0x1D)) == 0x1D
    assert rdma.acs_from_config(_config(None)) is None
    with pytest.raises(ValueError):
        rdma.acs_from_config(bytes(64))  # what a non-root read returns
    (tmp_path / "0000:01:00.0").mkdir()
    (tmp_path / "0000:01:00.0/config").write_bytes(_config(0x0))
    assert rdma.read_acs("0000:01:00.0", tmp_path) == 0
    (tmp_path / "0000:01:00.0/config").write_bytes(bytes(64))
    monkeypatch.setattr(rdma.shutil, "which", lambda name: None)
    with pytest.raises(HardwareError, match="needs root"):
        rdma.read_acs("0000:01:00.0", tmp_path)


def test_scenario_rdma_key_is_validated(tmp_path: Path) -> None:
    from checks.hw.fixture import ScenarioError

    bad = copy.deepcopy({"description": "x", "rdma": {"devices": [{"fw_ver": "1"}]}})
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(ScenarioError, match="has no name"):
        load_scenario(str(path))
    path.write_text(yaml.safe_dump({"description": "x", "rdma": {"devices": [
        {"name": "mlx5_0", "ports": [{"speed": 1}]}]}}))
    with pytest.raises(ScenarioError, match="unknown key"):
        load_scenario(str(path))


# --- the fleet views ----------------------------------------------------------------------------
def test_fleet_shows_rails_and_transports_per_host(run_cli, tmp_path: Path) -> None:
    import io

    from rich.console import Console

    from checks.fleet import fleet_terminal as terminal
    from checks.render import html
    from checks.report.aggregate import from_reports

    p2p = "".join(f"h:1:2 [{i}] NCCL INFO Channel 00/0 : {i}[{i}] -> {(i + 1) % 8}[{i}] via "
                  "P2P/CUMEM/read\n" for i in range(8))
    _, with_transport, _ = run_cli("--simulate", _with_log(tmp_path, p2p), "--level", "standard",
                                   "--only", "rdma-rails,nccl-allreduce,nccl-transport")
    _, without, _ = run_cli("--simulate", "h100-sxm-8x-healthy", "--only", "rdma-rails")
    with_transport["host"], without["host"] = "gpu-a", "gpu-b"
    fleet = from_reports([with_transport, without])
    out = io.StringIO()
    terminal.render(fleet, Console(file=out, width=400, color_system=None), verbose=True)
    text = out.getvalue()
    assert "multi-node fabric" in text
    assert "GPU0->mlx5_0 (pcie-switch)" in text and "nccl-allreduce: P2P x8 [PASS]" in text
    assert "gpu-b" not in text.split("multi-node fabric")[1]  # no RDMA, no transports: no row
    page = html.render(fleet)
    assert "Multi-node fabric" in page and "GPU7-&gt;mlx5_11 (pcie-switch)" in page


def _p2p_ring_without_nvls(ranks: int) -> str:
    """An NCCL INFO log of a P2P ring over `ranks` GPUs that set up 0 NVLS channels."""
    return "".join(f"h:1:2 [{i}] NCCL INFO Channel 00/0 : {i}[{i}] -> {(i + 1) % ranks}[{i}] via "
                   "P2P/CUMEM/read\n" for i in range(ranks)) + (
        "h:1:2 [0] NCCL INFO 16 coll channels, 0 nvls channels, 32 p2p channels\n")


def _transport(run_cli, tmp_path: Path, log: str, base: str) -> dict:
    _, report, _ = run_cli("--simulate", _with_log(tmp_path, log, base=base),
                           "--only", "nccl-allreduce,nccl-transport")
    (found,) = results(report, "nccl-transport")
    return found


def test_b200_without_nvls_does_not_pass_transport(run_cli, tmp_path: Path) -> None:
    """HGX B200 keeps its NVSwitches off the PCI bus: NVLS is still expected (the b200 profile
    says NVSwitch), so a log with 0 nvls channels WARNs instead of passing."""
    found = _transport(run_cli, tmp_path, _p2p_ring_without_nvls(8), "blackwell-b200-8x-healthy")
    assert found["status"] == "WARN", found
    assert found["details"]["expected"]["nvls"] is True
    assert "NVLS not used" in found["message"]


def test_direct_nvlink_mesh_of_an_nvswitch_model_expects_no_nvls(run_cli, tmp_path: Path) -> None:
    """HGX H100 4-GPU (NVIDIA/nccl#1617): the H100 SXM profile describes the NVSwitch board, but
    every NVML link names a GPU as its far end, so no NVSwitch and no NVLS is expected; the same
    log on the 8-GPU NVSwitch node still WARNs."""
    found = _transport(run_cli, tmp_path, _p2p_ring_without_nvls(4), "node-hgx-h100-4gpu-nvlink-mesh")
    # No NVSwitch: judged pair by pair, and every pair of the mesh is an NVLink pair.
    assert found["details"]["expected"] == {"cross_host": False, "rdma_up": [], "nvlink": True,
                                            "nvls": False, "pcie_pairs": [],
                                            "nvlink_pairs": [[0, 1], [0, 2], [0, 3], [1, 2],
                                                             [1, 3], [2, 3]]}, found
    assert found["status"] == "PASS", found
    found = _transport(run_cli, tmp_path, _p2p_ring_without_nvls(4), "h100-sxm-8x-healthy")
    assert found["details"]["expected"]["nvls"] is True and found["status"] == "WARN", found
