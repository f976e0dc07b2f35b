"""The workload checks through `main(argv)` on shipped scenarios: the healthy node raises
nothing at quick or standard level, and each workload fault is caught by the right check."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest

from checks.report_schema import schema

WORKLOAD_IDS = {"nccl-allreduce", "p2p-bandwidth", "gpu-matmul", "gpu-membw",
                "dataloader-workers", "dataloader-shm", "dataloader-scaling",
                "dataloader-worker-death"}


RunCli = Any


def by_id(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["id"]: c for c in report["checks"]}


def problems(report: dict[str, Any]) -> dict[str, str]:
    return {c["id"]: c["status"] for c in report["checks"] if c["status"] not in ("PASS", "SKIP")}


@pytest.mark.parametrize("level", ["quick", "standard", "burn-in"])
def test_healthy_h100_node_raises_nothing(run_cli: RunCli, level: str) -> None:
    code, report = run_cli("--simulate", "h100-sxm-8x-healthy", "--level", level)
    assert report is not None
    assert problems(report) == {}
    assert code == 0
    jsonschema.validate(report, schema())
    checks = by_id(report)
    if level != "quick":
        assert {i for i in WORKLOAD_IDS if checks[i]["status"] == "PASS"} == WORKLOAD_IDS


def test_healthy_figures_follow_the_report_conventions(run_cli: RunCli) -> None:
    _, report = run_cli("--simulate", "h100-sxm-8x-healthy", "--only", "workload")
    checks = by_id(report)
    (col,) = checks["nccl-allreduce"]["results"]
    assert col["device"] is None
    assert col["details"]["figures"]["allreduce_busbw_gbs"] == pytest.approx(478, abs=1)
    assert set(col["details"]["ops"]) == {"all_reduce", "all_gather", "reduce_scatter",
                                          "broadcast"}
    assert {"bytes", "time_us", "algbw_gbs", "busbw_gbs"} <= set(col["details"]["curve"][0])
    assert "busbw" in col["details"]["table"]
    assert col["expected"].startswith(">= 400 GB/s (profile h100-sxm")
    matmul = checks["gpu-matmul"]["results"]
    assert len(matmul) == 8
    assert [r["device"]["pci"] for r in matmul][:2] == ["0000:18:00.0", "0000:2a:00.0"]
    assert set(matmul[0]["details"]["figures"]) == {
        "matmul_bf16_tflops", "matmul_fp16_tflops", "matmul_tf32_tflops", "matmul_fp32_tflops"}
    assert checks["gpu-membw"]["results"][2]["details"]["figures"] == {"membw_copy_gbs": 2953.2}
    scaling = checks["dataloader-scaling"]["results"][0]["details"]
    assert scaling["curve"][0] == {"workers": 0, "samples_per_s": 95.0}


def test_slow_gpu_fails_on_its_own_row(run_cli: RunCli) -> None:
    code, report = run_cli("--simulate", "workload-straggler-gpu", "--level", "standard")
    assert code == 1
    assert problems(report) == {"gpu-matmul": "FAIL"}
    rows = by_id(report)["gpu-matmul"]["results"]
    assert [r["device"]["index"] for r in rows if r["status"] == "FAIL"] == [3]
    failed = rows[3]
    assert failed["fault_code"] == "CMP001" and failed["remedy"]
    assert "straggler" in failed["message"]


def test_straggler_rule_fails_a_gpu_a_loose_profile_would_pass(run_cli: RunCli) -> None:
    # The generic profile has no spec peaks: no absolute threshold, only the peer rule.
    code, report = run_cli("--simulate", "workload-straggler-gpu", "--profile", "generic",
                           "--only", "gpu-matmul")
    assert code == 1
    rows = by_id(report)["gpu-matmul"]["results"]
    failed = [r for r in rows if r["status"] == "FAIL"]
    assert [r["device"]["index"] for r in failed] == [3]
    assert failed[0]["details"]["rule"] == "straggler"
    assert "67 % below the median of its peers" in failed[0]["message"]


def test_low_bus_bandwidth_fails_the_collective_check(run_cli: RunCli) -> None:
    code, report = run_cli("--simulate", "workload-low-busbw", "--level", "standard")
    assert code == 1
    assert problems(report) == {"nccl-allreduce": "FAIL"}
    (result,) = by_id(report)["nccl-allreduce"]["results"]
    assert result["value"] == pytest.approx(179.9, abs=0.5)
    assert "below 400 GB/s" in result["message"]
    assert result["details"]["env"]["NCCL_P2P_DISABLE"] == "1"
    assert "NCCL_P2P_DISABLE" in result["remedy"]


def test_collective_hang_names_the_rank(run_cli: RunCli) -> None:
    code, report = run_cli("--simulate", "workload-collective-hang", "--only", "nccl-allreduce")
    assert code == 1
    (result,) = by_id(report)["nccl-allreduce"]["results"]
    assert result["status"] == "FAIL" and result["value"] == [3]
    assert "rank 3" in result["message"] and "process group killed" in result["message"]


def test_burn_in_mismatch_names_the_gpu(run_cli: RunCli) -> None:
    code, report = run_cli("--simulate", "workload-burnin-mismatch", "--level", "burn-in")
    assert code == 1
    assert problems(report) == {"burn-in": "FAIL"}
    rows = by_id(report)["burn-in"]["results"]
    bad = [r for r in rows if r["status"] == "FAIL"]
    assert [r["device"]["pci"] for r in bad] == ["0000:ab:00.0"]
    assert "bit for bit" in bad[0]["message"] and bad[0]["fault_code"] == "BRN001"
    assert bad[0]["details"]["samples"][0]["pcie_gen_current"] == 5


@pytest.mark.parametrize("shm_bytes,status", [(67108864, "FAIL"), (3 << 30, "WARN"),
                                              (64 << 30, "PASS")])
def test_dataloader_shm_against_the_configured_loaders(run_cli: RunCli, tmp_path: Path,
                                                       shm_bytes: int, status: str) -> None:
    scenario = tmp_path / "shm.yaml"
    scenario.write_text(f"extends: h100-sxm-8x-healthy\nhost:\n  shm_bytes: {shm_bytes}\n")
    _, report = run_cli("--simulate", str(scenario), "--only", "dataloader-shm")
    (result,) = by_id(report)["dataloader-shm"]["results"]
    assert result["status"] == status
    if status != "PASS":
        assert "--shm-size" in result["remedy"] and "remount" in result["remedy"]
    if status == "FAIL":
        assert "bus error" in result["message"]


def test_shipped_64mb_shm_fault_also_fails_the_dataloader_check(run_cli: RunCli) -> None:
    _, report = run_cli("--simulate", "fault-shm-64mb", "--only", "dataloader-shm")
    assert by_id(report)["dataloader-shm"]["status"] == "FAIL"


def test_cpu_scenario_without_measurements_skips_with_reason(run_cli: RunCli) -> None:
    code, report = run_cli("--simulate", "cpu-only-healthy", "--only", "workload")
    assert code == 0
    checks = by_id(report)
    assert checks["nccl-allreduce"]["status"] == "SKIP"
    assert "measurements.collectives" in checks["nccl-allreduce"]["results"][0]["message"]
    assert checks["dataloader-shm"]["status"] == "PASS"  # needs no measurement


def test_gpu_host_with_broken_cuda_is_blocked_not_run_on_cpu(run_cli: RunCli,
                                                             tmp_path: Path) -> None:
    scenario = tmp_path / "nocuda.yaml"
    scenario.write_text("extends: h100-sxm-8x-healthy\ntorch: {cuda_available: false}\n")
    _, report = run_cli("--simulate", str(scenario), "--only", "nccl-allreduce,gpu-matmul")
    for chk in report["checks"]:
        assert chk["status"] == "SKIP"
        assert chk["results"][0]["message"].startswith("blocked")


def test_other_gpu_counts_get_a_threshold_derived_from_nvlink(run_cli: RunCli) -> None:
    # The profile's 400 GB/s is for 8 GPUs; 4 ranks are judged against their links.
    _, report = run_cli("--simulate", "h100-sxm-8x-healthy", "--only", "nccl-allreduce",
                        "--nproc", "4")
    (result,) = by_id(report)["nccl-allreduce"]["results"]
    assert result["status"] == "PASS"
    assert result["expected"] == ">= 315 GB/s (derived: 18 NVLinks x 25 GB/s = 450 GB/s x 0.7)"


def test_gpus_hidden_from_torch_are_skipped_not_failed(run_cli: RunCli, tmp_path: Path) -> None:
    scenario = tmp_path / "cvd.yaml"
    scenario.write_text("extends: h100-sxm-8x-healthy\nhost:\n  env: {CUDA_VISIBLE_DEVICES: '0,3'}\n")
    code, report = run_cli("--simulate", str(scenario), "--only", "gpu-matmul")
    assert code == 0
    rows = by_id(report)["gpu-matmul"]["results"]
    assert [r["device"]["index"] for r in rows if r["status"] == "PASS"] == [0, 3]
    assert {r["status"] for r in rows} == {"PASS", "SKIP"}
    assert "CUDA_VISIBLE_DEVICES" in rows[1]["message"]
