"""gpu-recovery-action: NVML's recovery action per GPU, with or without an XID line."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from checks.node.suite.gpu_state import RECOVERY_REMEDIES

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scenario_verdict import run


def _results(report: dict[str, Any]) -> list[dict[str, Any]]:
    (chk,) = [c for c in report["checks"] if c["id"] == "gpu-recovery-action"]
    return chk["results"]


def test_drain_and_reset_without_an_xid_line_fails_that_gpu(tmp_path: Path) -> None:
    code, report = run("fault-gpu-recovery-action", tmp_path, "--only", "gpu-recovery-action")
    assert code == 1
    results = _results(report)
    assert [r["status"] for r in results] == ["PASS", "PASS", "FAIL"] + ["PASS"] * 5
    bad = results[2]
    assert bad["fault_code"] == "GPU015" and bad["value"] == "drain_and_reset"
    assert bad["remedy"] == RECOVERY_REMEDIES["drain_and_reset"]
    assert "DRAIN_AND_RESET" in bad["message"]


def test_a_driver_without_the_field_skips_with_the_reason(tmp_path: Path) -> None:
    code, report = run("h100-sxm-8x-healthy", tmp_path, "--only", "gpu-recovery-action")
    assert code == 0
    assert {r["status"] for r in _results(report)} == {"SKIP"}
    assert "not supported" in _results(report)[0]["message"]


@pytest.mark.parametrize("action, status", [
    ("gpu_reset", "FAIL"), ("node_reboot", "FAIL"), ("drain_p2p", "FAIL"),
    ("system_reboot", "FAIL"), ("recover_imex_domain", "FAIL"), ("unknown(9)", "WARN"),
    ("none", "PASS")])
def test_every_action_maps_to_a_verdict(tmp_path: Path, action: str, status: str) -> None:
    scenario = tmp_path / "action.yaml"
    base = Path(__file__).resolve().parents[2] / "checks" / "scenarios" / "fault-gpu-recovery-action.yaml"
    scenario.write_text(f"description: 'test: action {action}'\nextends: {base}\n"
                        f"gpu_overrides:\n  2: {{recovery_action: '{action}'}}\n")
    _, report = run(str(scenario), tmp_path, "--only", "gpu-recovery-action")
    assert _results(report)[2]["status"] == status
