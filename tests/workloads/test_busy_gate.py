"""Workload checks on a GPU another process holds: they SKIP, naming who holds which GPU, through
the one gate gpu-occupied declares (registry gate / gated_by, honoured by the runner), instead of
measuring the other job, failing and advising an RMA."""

from __future__ import annotations

from pathlib import Path
from typing import Any

GATED = ["gpu-matmul", "gpu-membw", "nccl-allreduce", "p2p-bandwidth", "reference-digest"]
HELD = ("extends: h100-sxm-8x-healthy\n"
        "gpu_defaults: {memory_used_bytes: 0, compute_processes: []}\n"
        "gpu_overrides:\n"
        "  3: {memory_used_bytes: 32212254720,\n"
        "      compute_processes: [{pid: 4242, name: python, used_memory_bytes: 32212254720}]}\n")


def _scenario(tmp_path: Path, extra: str = "") -> str:
    path = tmp_path / "held.yaml"
    path.write_text(HELD + extra)
    return str(path)


def _by_id(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["id"]: c for c in report["checks"]}


def test_workload_checks_skip_a_gpu_another_process_holds(run_cli: Any, tmp_path: Path) -> None:
    _, report = run_cli("--simulate", _scenario(tmp_path), "--level", "standard")
    checks = _by_id(report)
    assert checks["gpu-occupied"]["status"] == "FAIL"
    for check_id in GATED:
        (result,) = checks[check_id]["results"]
        assert result["status"] == "SKIP", (check_id, result["message"])
        assert "GPU3 (0000:5d:00.0) held by pid 4242 (python, 30720 MiB)" in result["message"]
    # the verdict names the true cause once: the occupied GPU, not a slow one
    assert {c["id"] for c in report["checks"] if c["status"] in ("FAIL", "ERROR")} == \
        {"gpu-occupied"}


def test_the_gate_is_asked_when_gpu_occupied_is_not_selected(run_cli: Any, tmp_path: Path
                                                             ) -> None:
    _, report = run_cli("--simulate", _scenario(tmp_path), "--only", "gpu-matmul")
    checks = _by_id(report)
    assert "gpu-occupied" not in checks  # asked, not reported
    (result,) = checks["gpu-matmul"]["results"]
    assert result["status"] == "SKIP" and "pid 4242" in result["message"]


def test_a_held_gpu_the_launch_does_not_use_gates_nothing(run_cli: Any, tmp_path: Path) -> None:
    scenario = _scenario(tmp_path, "host:\n  env: {CUDA_VISIBLE_DEVICES: '0,1,2'}\n")
    _, report = run_cli("--simulate", scenario, "--only", "gpu-matmul")
    results = _by_id(report)["gpu-matmul"]["results"]
    assert [r["status"] for r in results][:3] == ["PASS"] * 3  # GPUs 0-2; the rest not measured
    assert not any("held by" in r["message"] for r in results)
