"""ib_write_bw: the parser on output in the format of public reports (perftest_logs/, each file
names its source), the real tool where it is installed (this machine has perftest but no RDMA
device: the failure path runs for real), and check rdma-write-bw through the CLI on scenarios
that replay recorded output through the fixture backend."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from checks.hw import perftest
from checks.hw.fixture import load_scenario

LOGS = Path(__file__).parent / "perftest_logs"
IMBUE = "fabric-hgx-h100-ib-imbue4"
# imbue4's compute NICs in GPU order (GPU k shares a PCIe switch with the k-th).
COMPUTE = ["mlx5_0", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_9", "mlx5_10", "mlx5_11"]


def log(name: str) -> str:
    return (LOGS / name).read_text()


@pytest.mark.parametrize("name, size, average, unit", [
    ("roce-postlist-duration-gbits-perftest273.txt", 8, 0.48, "Gb/sec"),
    ("ndr-gdr-duration-gbits-azure152.txt", 8388608, 399.70, "Gb/sec"),
    # 11004.92 MiB/s = 92.32 Gb/s
    ("cuda-a30-mbsec-perftest241.txt", 33554432, 11004.92 * 1048576 * 8 / 1e9, "MB/sec")])
def test_parser_reads_the_reports(name: str, size: int, average: float, unit: str) -> None:
    bw = perftest.parse_write_bw(log(name))
    assert (bw.bytes, bw.unit) == (size, unit)
    assert bw.average_gbps == pytest.approx(average, rel=1e-6)


def test_duration_mode_peak_is_not_a_measurement() -> None:
    bw = perftest.parse_write_bw(log("ndr-gdr-duration-gbits-azure152.txt"))
    assert bw.peak_gbps == 0.0 and bw.average_gbps > 399


def test_no_device_output_is_an_error_quoting_perftest() -> None:
    with pytest.raises(perftest.PerftestOutputError, match="Did not detect devices"):
        perftest.parse_write_bw(log("no-device-debian-6.06.txt"))


@pytest.mark.parametrize("text, words", [
    ("", "no bandwidth table"),
    (" #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n",
     "header but no row"),
    ("Couldn't connect to 127.0.0.1:18515\nUnable to open file descriptor for socket connection",
     "Couldn't connect"),
    (" #bytes  #iterations  BW peak[Tb/sec]  BW average[Tb/sec]  MsgRate[Mpps]\n 8 5 1.0 1.0 2.0",
     "unknown bandwidth unit")])
def test_output_without_a_bandwidth_row_is_refused(text: str, words: str) -> None:
    with pytest.raises(perftest.PerftestOutputError, match=words):
        perftest.parse_write_bw(text)


def test_warning_between_header_and_row_and_dual_port_columns() -> None:
    """perftest prints 'Conflicting CPU frequency values detected' (a string in its binary)
    between the header and the row when the CPU clocks differ; dual-port mode adds per-port
    columns. The last row of an -a sweep (the largest message) is the one reported."""
    header = " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]"
    text = (f"{header}\nConflicting CPU frequency values detected: 1500.000000 != 3300.016000. "
            "CPU Frequency is not max.\n 65536      560845           0.00               98.02"
            "                0.186950\n")
    assert perftest.parse_write_bw(text).average_gbps == 98.02
    sweep = f"{header}\n 2 5000 0.14 0.01 0.77\n 8388608 5000 394.72 394.61 0.005880 1.0 2.0\n"
    assert perftest.parse_write_bw(sweep).bytes == 8388608


def test_command_line() -> None:
    assert perftest.command("mlx5_3", 18516, gpu=1, size=8388608, duration_s=5,
                            server="127.0.0.1") == [
        "ib_write_bw", "-d", "mlx5_3", "-p", "18516", "-s", "8388608", "-D", "5", "-F",
        "--report_gbits", "--use_cuda=1", "127.0.0.1"]


@pytest.mark.skipif(shutil.which("ib_write_bw") is None, reason="perftest is not installed")
def test_real_ib_write_bw_without_a_device_reports_what_it_said() -> None:
    """The real tool: on this machine (no RDMA core in the kernel) both ends fail at once; the
    run returns perftest's words, ends in time and leaves no process behind."""
    info = perftest.tool_info()
    assert info is not None and info["path"].endswith("ib_write_bw")
    run = perftest.run_loopback("mlx5_0", port=18599, duration_s=1, timeout_s=20)
    assert run["returncode"] not in (0, None) and not run["timed_out"]
    with pytest.raises(perftest.PerftestOutputError, match="Did not detect devices"):
        perftest.parse_write_bw(run["output"])
    left = subprocess.run(["pgrep", "-f", "ib_write_bw -d mlx5_0 -p 18599"],
                          capture_output=True, text=True, check=False).stdout
    assert left == ""


# --- check rdma-write-bw on scenarios ---------------------------------------------------------
def row(gbps: float) -> str:
    """ib_write_bw output of one 8 MiB duration run at `gbps` (the azure152 file's layout)."""
    text = log("ndr-gdr-duration-gbits-azure152.txt")
    return text.replace(" 8388608    59571            0.00               399.70",
                        f" 8388608    59571            0.00               {gbps:.2f}")


def scenario(tmp_path: Path, perftest_info: dict[str, Any] | None,
             outputs: dict[str, Any] | None, base: str = IMBUE) -> str:
    data: dict[str, Any] = {"description": "test: recorded ib_write_bw output",
                            "extends": str(Path(load_scenario(base)["_path"]))}
    if perftest_info is not None:
        data["host"] = {"perftest": perftest_info}
    if outputs is not None:
        data["measurements"] = {"ib_write_bw": outputs}
    path = tmp_path / "write-bw.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def write_bw(run_cli, path: str) -> tuple[str, list[dict[str, Any]]]:
    _, report = run_cli("--simulate", path, "--level", "standard", "--only", "rdma-write-bw")
    assert report is not None
    chk = next(c for c in report["checks"] if c["id"] == "rdma-write-bw")
    return chk["status"], chk["results"]


def test_every_gpu_nic_pair_is_measured_and_a_slow_pair_fails(run_cli, tmp_path: Path) -> None:
    """GPU3's NIC (mlx5_5) at 180 Gb/s on a 400 Gb/s port fails; mlx5_9's run found no device:
    an ERROR quoting perftest, never a PASS; the other six pass at 399.7."""
    outputs = {"default": log("ndr-gdr-duration-gbits-azure152.txt"),
               "mlx5_5": row(180.0),
               "mlx5_9": {"output": log("no-device-debian-6.06.txt"), "returncode": 1}}
    status, results = write_bw(run_cli, scenario(tmp_path, {"cuda": True}, outputs))
    assert status == "FAIL" and len(results) == 8
    by_nic = {r["details"]["nic"]: r for r in results}
    assert sorted(by_nic) == sorted(COMPUTE)
    assert by_nic["mlx5_5"]["status"] == "FAIL" and "180.0 Gb/s" in by_nic["mlx5_5"]["message"]
    assert "below 0.9 x line rate (360 Gb/s)" in by_nic["mlx5_5"]["message"]
    assert by_nic["mlx5_5"]["device"]["name"].startswith("GPU3 ")
    assert by_nic["mlx5_9"]["status"] == "ERROR"
    assert "Did not detect devices" in by_nic["mlx5_9"]["message"]
    passed = [n for n, r in by_nic.items() if r["status"] == "PASS"]
    assert sorted(passed) == sorted(set(COMPUTE) - {"mlx5_5", "mlx5_9"})
    assert by_nic["mlx5_0"]["details"]["gpu"] == 0 and by_nic["mlx5_11"]["details"]["gpu"] == 7
    assert by_nic["mlx5_0"]["value"] == 399.7


def test_without_perftest_it_skips_with_the_reason(run_cli, tmp_path: Path) -> None:
    status, results = write_bw(run_cli, scenario(tmp_path, None, None))
    assert status == "SKIP" and "perftest is not installed" in results[0]["message"]


def test_without_rdma_devices_it_skips(run_cli, tmp_path: Path) -> None:
    path = scenario(tmp_path, {"cuda": True}, {"default": row(399.7)}, base="h100-sxm-8x-healthy")
    status, results = write_bw(run_cli, path)
    assert status == "SKIP" and "no RDMA devices" in results[0]["message"]


def test_perftest_without_cuda_on_a_gpu_host_says_the_gpu_path_is_not_measured(
        run_cli, tmp_path: Path) -> None:
    status, results = write_bw(run_cli, scenario(tmp_path, {"cuda": False},
                                                 {"default": row(399.7)}))
    assert status == "PASS"
    assert results[0]["status"] == "SKIP" and "GPU-NIC path is not measured" in results[0]["message"]
    measured = results[1:]
    assert sorted(r["details"]["nic"] for r in measured) == sorted(COMPUTE)
    assert all(r["details"]["gpu"] is None and "host memory" in r["message"] for r in measured)


def test_no_recorded_output_is_a_skip_not_a_pass(run_cli, tmp_path: Path) -> None:
    status, results = write_bw(run_cli, scenario(tmp_path, {"cuda": True}, {"mlx5_0": row(399)}))
    assert status == "PASS"  # mlx5_0 measured; the rest say they were not
    assert sum(r["status"] == "PASS" for r in results) == 1
    assert all("records no ib_write_bw output" in r["message"]
               for r in results if r["status"] == "SKIP")


def test_cuda_ordinal_is_the_rank_among_the_gpus_this_process_has() -> None:
    # A container given the GPUs at 0000:5d and 0000:bb of eight: --use_cuda counts only those.
    mine = ["0000:bb:00.0", "0000:5D:00.0"]
    assert perftest.cuda_ordinal("0000:5d:00.0", mine) == 0
    assert perftest.cuda_ordinal("0000:BB:00.0", mine) == 1
    assert perftest.cuda_ordinal("0000:1b:00.0", mine) is None
    env = perftest.loopback_env({"CUDA_VISIBLE_DEVICES": "3,1", "PATH": "/usr/bin"})
    assert env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "PATH": "/usr/bin"}


def test_container_with_two_of_eight_gpus_measures_its_own_by_their_cuda_ordinal(
        run_cli, tmp_path: Path) -> None:
    """sysfs lists all eight GPUs, NVML (so CUDA) only GPUs 2 and 5: those two are measured
    with --use_cuda=0 and 1, not 2 and 5 (which would name no GPU, or another's); the six
    GPUs of other tenants are SKIPped with the reason."""
    path = Path(scenario(tmp_path, {"cuda": True},
                         {"default": log("ndr-gdr-duration-gbits-azure152.txt")}))
    data = yaml.safe_load(path.read_text())
    data["host"]["device_nodes"] = [2, 5]
    data["gpu_overrides"] = {k: {"nvml_visible": False} for k in (0, 1, 3, 4, 6, 7)}
    path.write_text(yaml.safe_dump(data))
    status, results = write_bw(run_cli, str(path))
    measured = {r["device"]["name"].split()[0]: r["details"]["gpu"] for r in results
                if r["status"] == "PASS"}
    assert measured == {"GPU2": 0, "GPU5": 1}
    skipped = [r for r in results if r["status"] == "SKIP"]
    assert len(skipped) == 6 and all("not one of the GPUs" in r["message"] for r in skipped)
    assert status == "PASS"


def test_exclusive_process_puts_the_loopback_server_on_another_gpu(run_cli, tmp_path: Path
                                                                    ) -> None:
    """Every GPU in compute mode EXCLUSIVE_PROCESS: ib_write_bw's server and client are two
    processes, and two contexts on one such GPU fail (the second one's ERROR). Each pair's
    server opens another GPU; the client keeps the rail's GPU."""
    path = Path(scenario(tmp_path, {"cuda": True},
                         {"default": log("ndr-gdr-duration-gbits-azure152.txt")}))
    data = yaml.safe_load(path.read_text())
    data["gpu_defaults"] = {"compute_mode": "exclusive_process"}
    path.write_text(yaml.safe_dump(data))
    status, results = write_bw(run_cli, str(path))
    assert status == "PASS" and len(results) == 8
    for r in results:
        assert r["details"]["server_gpu"] is not None
        assert r["details"]["server_gpu"] != r["details"]["gpu"], r["device"]
        assert "EXCLUSIVE_PROCESS" in r["message"]


def test_one_exclusive_gpu_skips_with_the_reason(run_cli, tmp_path: Path) -> None:
    """A container given one EXCLUSIVE_PROCESS GPU of eight: no second GPU for the server."""
    path = Path(scenario(tmp_path, {"cuda": True},
                         {"default": log("ndr-gdr-duration-gbits-azure152.txt")}))
    data = yaml.safe_load(path.read_text())
    data["host"]["device_nodes"] = [2]
    data["gpu_overrides"] = {k: {"nvml_visible": False} for k in (0, 1, 3, 4, 5, 6, 7)}
    data["gpu_defaults"] = {"compute_mode": "exclusive_process"}
    path.write_text(yaml.safe_dump(data))
    status, results = write_bw(run_cli, str(path))
    (gpu2,) = [r for r in results if r["device"]["name"].startswith("GPU2")]
    assert gpu2["status"] == "SKIP" and "EXCLUSIVE_PROCESS" in gpu2["message"]
    assert "cannot both open this GPU" in gpu2["message"]
    assert status == "SKIP"


def test_run_loopback_gives_the_server_its_own_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The server's --use_cuda is server_gpu, the client's gpu."""
    started: list[list[str]] = []

    class Server:
        returncode = 0

        def poll(self) -> int:
            return 0

        def communicate(self) -> tuple[str, str]:
            return "", ""

    def start(argv: list[str], **kw: Any) -> Server:
        started.append(argv)
        return Server()

    monkeypatch.setattr(perftest.procs, "start", start)
    monkeypatch.setattr(perftest.procs, "kill_tree", lambda proc: None)
    monkeypatch.setattr(perftest.time, "sleep", lambda s: None)
    perftest.run_loopback("mlx5_0", gpu=3, server_gpu=4, duration_s=1, timeout_s=5)
    assert started[0][-1] == "--use_cuda=4"
    started.clear()
    perftest.run_loopback("mlx5_0", gpu=3, duration_s=1, timeout_s=5)
    assert started[0][-1] == "--use_cuda=3"
