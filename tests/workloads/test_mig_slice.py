"""A MIG slice's matmul and memory bandwidth: judged against the slices of its profile, never
against the whole GPU's spec peak (a healthy 3g slice is ~40 % of an A100)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from checks.hw.scenario_file import load_scenario
from checks.node.suite.compute import MIG_SLICE


@pytest.mark.parametrize("name,profile", [
    ("NVIDIA A100-SXM4-80GB MIG 3g.40gb", "3g.40gb"),
    ("NVIDIA A100-SXM4-80GB MIG 1g.10gb", "1g.10gb"),
    ("NVIDIA H100 80GB HBM3 MIG 1g.10gb+me", "1g.10gb+me"),
    ("NVIDIA A100-SXM4-80GB", None),
    ("NVIDIA A100-SXM4-80GB MIGRATED", None),
])
def test_slice_profile_from_the_cuda_device_name(name: str, profile: str | None) -> None:
    found = MIG_SLICE.search(name)
    assert (found.group(1) if found else None) == profile


def _results(report: dict[str, Any], check: str) -> list[dict[str, Any]]:
    (found,) = [c for c in report["checks"] if c["id"] == check]
    return [r for r in found["results"] if r["status"] != "SKIP"]


def test_healthy_slice_passes_with_its_profile_named(run_cli: Any) -> None:
    code, report = run_cli("--simulate", "node-mig-slice-a100-3g", "--only",
                           "gpu-matmul,gpu-membw")
    assert code == 0
    for check in ("gpu-matmul", "gpu-membw"):
        (result,) = _results(report, check)
        assert result["status"] == "PASS", result["message"]
        assert result["details"]["mig_slice"] == "3g.40gb"
        assert "judged only against the other slices" in result["message"]


def test_same_figures_without_the_slice_name_fail_the_whole_gpu_floor(
        run_cli: Any, tmp_path: Path) -> None:
    """What the checks did before reading the device name: the whole A100's floors."""
    path = tmp_path / "unnamed.yaml"
    path.write_text(yaml.safe_dump({
        "description": "test: the slice's figures on a device CUDA does not name a slice",
        "extends": str(load_scenario("node-mig-slice-a100-3g")["_path"]),
        "measurements": {"matmul": {"default": {"bf16": 97.0, "device_name": ""}},
                         "membw": {"default": {"copy_gbs": 610.0, "device_name": ""}}}}))
    code, report = run_cli("--simulate", str(path), "--only", "gpu-matmul,gpu-membw")
    assert code == 1
    (matmul,) = _results(report, "gpu-matmul")
    (membw,) = _results(report, "gpu-membw")
    assert matmul["status"] == membw["status"] == "FAIL"
    assert "below 156" in matmul["message"] and "below 1173" in membw["message"]
