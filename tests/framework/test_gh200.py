"""GH200 (Grace Hopper Superchip): its two variants are detected by PCI ID and NVML name (never as
the H200 whose name is inside theirs), a standalone node from a real report is healthy under its
own profile, the open kernel module is required, and memory held without a process WARNs as on
the other Grace platform."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from checks import profiles
from checks.hw.scenario_file import load_scenario
from checks.node import node_cli as cli

SCENARIO = "node-gh200-480gb-ogkm911"


@pytest.mark.parametrize("device_id, names, expected", [
    ([0x2342], [], "gh200"),
    ([0x2348], [], "gh200-144g"),
    ([], ["NVIDIA GH200 480GB"], "gh200"),
    ([], ["NVIDIA GH200 144G HBM3e"], "gh200-144g"),
    ([], ["NVIDIA H200"], "h200"),            # the H200's name is inside GH200's: anchored
])
def test_detection(device_id: list[int], names: list[str], expected: str) -> None:
    assert profiles.detect(device_id, names).name == expected


def test_variants_differ_in_memory_and_bandwidth_only_where_the_datasheet_says() -> None:
    small, large = profiles.load("gh200"), profiles.load("gh200-144g")
    assert (small.get("peaks.mem_bw_gbs"), large.get("peaks.mem_bw_gbs")) == (4000, 4900)
    assert (small.get("memory_gib"), large.get("memory_gib")) == (96, 144)
    for key in ("peaks.bf16_tflops", "compute_capability", "nvswitch",
                "occupancy.memory_without_process_status", "blackwell.open_module_required"):
        assert small.get(key) == large.get(key), key
    assert small.get("nvswitch") is False and small.get("gpus_per_node") is None


def _run(tmp_path: Path, scenario: str, *extra: str) -> tuple[int, dict]:
    out = tmp_path / "report.json"
    code = cli.main(["--simulate", scenario, "--level", "quick", "--json", str(out), "--quiet",
                     *extra])
    return code, json.loads(out.read_text())


def _variant(tmp_path: Path, name: str, **changes: object) -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"description": f"test: {name}",
                                    "extends": str(load_scenario(SCENARIO)["_path"]), **changes}))
    return str(path)


def _statuses(report: dict, check_id: str) -> list[str]:
    (check,) = [c for c in report["checks"] if c["id"] == check_id]
    return [r["status"] for r in check["results"]]


def test_reported_standalone_node_is_healthy_under_its_own_profile(tmp_path: Path) -> None:
    code, report = _run(tmp_path, SCENARIO)
    assert code == 0
    assert report["profile"]["name"] == "gh200"
    statuses = {r["status"] for c in report["checks"] for r in c["results"]}
    assert statuses <= {"PASS", "SKIP"}, statuses
    assert _statuses(report, "blackwell-open-module") == ["PASS"]
    assert _statuses(report, "gpu-occupied") == ["PASS"]


def test_proprietary_module_fails(tmp_path: Path) -> None:
    proprietary = ("NVRM version: NVIDIA UNIX Kernel Module for aarch64  570.172.08  Release "
                   "Build  (dvs-builder@U22-I3-AE18-23-3)  Tue Jul  8 00:00:00 UTC 2025\n")
    scenario = _variant(tmp_path, "gh200-proprietary", driver={"proc_version": proprietary})
    code, report = _run(tmp_path, scenario, "--only", "blackwell-open-module")
    assert code == 1 and _statuses(report, "blackwell-open-module") == ["FAIL"]
    (check,) = report["checks"]
    assert "proprietary kernel module loaded" in check["results"][0]["message"]


def test_memory_held_without_a_process_warns(tmp_path: Path) -> None:
    scenario = _variant(tmp_path, "gh200-held",
                        gpu_overrides={0: {"memory_used_bytes": 40 << 30, "compute_processes": []}})
    _, report = _run(tmp_path, scenario, "--only", "gpu-occupied")
    assert _statuses(report, "gpu-occupied") == ["WARN"]
