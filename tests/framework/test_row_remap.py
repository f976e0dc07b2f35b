"""row-remap (GPU004) against NVIDIA's GPU memory error management guide: a remap takes effect at
the next GPU reset and workloads go on meanwhile (error containment), so a remap pending for
correctable errors only is a WARN (reset at the next idle window), one pending with uncorrectable
remaps counted a FAIL (reset the GPU), and a remapping failure a FAIL with RMA. Each case runs
through the CLI on the fixture backend (tests/hw/test_row_remap_nvml.py: the same through NVML)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

GPU = 3


def _row_remap(run_cli, tmp_path: Path, rows: dict[str, Any]) -> dict[str, Any]:
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump({
        "description": f"test: GPU {GPU} reports remapped rows {rows}",
        "extends": "h100-sxm-8x-healthy", "gpu_overrides": {GPU: {"remapped_rows": rows}}}))
    _, report, err = run_cli("--simulate", str(path), "--only", "row-remap")
    assert report is not None, err
    (check,) = [c for c in report["checks"] if c["id"] == "row-remap"]
    (result,) = [r for r in check["results"] if r["device"]["index"] == GPU]
    assert all(r["status"] == "PASS" for r in check["results"] if r is not result)
    return result


@pytest.mark.parametrize("rows,status,remedy", [
    # pending, correctable remaps only: the guide lets workloads go on until the next reset
    ({"correctable": 2, "uncorrectable": 0, "pending": True, "failed": False}, "WARN",
     "next idle window"),
    # pending with uncorrectable remaps counted (leptonai/gpud PR#80's nvidia-smi -q example)
    ({"correctable": 0, "uncorrectable": 4, "pending": True, "failed": False}, "FAIL",
     "reset it"),
    ({"correctable": 3, "uncorrectable": 1, "pending": True, "failed": False}, "FAIL",
     "reset it"),
    # a remapping failure: the bank's spare rows are used up, an RMA condition
    ({"correctable": 0, "uncorrectable": 9, "pending": False, "failed": True}, "FAIL", "RMA"),
    ({"correctable": 1, "uncorrectable": 0, "pending": True, "failed": True}, "FAIL", "RMA"),
    # nothing pending: uncorrectable remaps already applied warn (profile: 1), correctable pass
    ({"correctable": 0, "uncorrectable": 2, "pending": False, "failed": False}, "WARN",
     "watch the trend"),
    ({"correctable": 5, "uncorrectable": 0, "pending": False, "failed": False}, "PASS", None)])
def test_row_remap_follows_the_memory_error_guide(run_cli, tmp_path: Path, rows: dict[str, Any],
                                                  status: str, remedy: str | None) -> None:
    result = _row_remap(run_cli, tmp_path, rows)
    assert result["status"] == status, result
    if remedy:
        assert remedy in result["remedy"], result


def test_a_correctable_only_pending_remap_does_not_fail_the_node(run_cli, tmp_path: Path) -> None:
    """Before: any pending remap failed ("the GPU must be reset before it is used"), though the
    guide says unaffected work goes on and the remap only waits for the next reset."""
    result = _row_remap(run_cli, tmp_path, {"correctable": 1, "uncorrectable": 0,
                                            "pending": True, "failed": False})
    assert result["status"] == "WARN" and "takes effect at the next GPU reset" in result["message"]
