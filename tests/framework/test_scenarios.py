"""Every shipped fault scenario is caught by the right check; healthy scenarios raise nothing."""

from __future__ import annotations

import jsonschema
import pytest

from checks.hw.fixture import shipped
from checks.report_schema import schema


def statuses(report: dict) -> dict[str, str]:
    return {c["id"]: c["status"] for c in report["checks"]}


def problems(report: dict) -> dict[str, str]:
    """Checks that did not PASS or SKIP."""
    return {k: v for k, v in statuses(report).items() if v not in ("PASS", "SKIP")}

# scenario -> the checks that must flag it (and no other check may FAIL/WARN/ERROR).
FAULTS = {
    "fault-gpu-missing-from-nvml": {"gpu-count": "FAIL"},
    "fault-ecc-uncorrectable": {"ecc-errors": "FAIL"},
    "fault-row-remap-pending": {"row-remap": "FAIL"},
    "fault-xid-79": {"xid-events": "FAIL"},
    "fault-gpu-recovery-action": {"gpu-recovery-action": "FAIL"},
    "fault-pcie-x8": {"pcie-link": "FAIL"},
    "fault-thermal-throttle": {"clock-throttle": "FAIL", "gpu-temperature": "FAIL"},
    "fault-nvlink-down": {"nvlink": "FAIL"},
    "fault-persistence-off": {"persistence-mode": "WARN"},
    "fault-torch-newer-cuda": {"cuda-compat": "FAIL"},
    "fault-nouveau-loaded": {"nouveau-not-loaded": "FAIL", "driver-loaded": "FAIL"},
    "fault-shm-64mb": {"shm-size": "FAIL"},
    "fault-nvml-missing": {"driver-loaded": "FAIL"},
    "unknown-gpu-model": {"gpu-profile": "WARN"},
}
HEALTHY = ["h100-sxm-8x-healthy", "cpu-only-healthy"]


def test_every_shipped_fault_scenario_has_an_expectation() -> None:
    faults = {s for s in shipped() if s.startswith("fault-")}
    assert faults <= set(FAULTS), f"untested scenarios: {faults - set(FAULTS)}"


@pytest.mark.parametrize("scenario", HEALTHY)
def test_healthy_scenario_raises_nothing(run_cli, scenario: str) -> None:
    code, report, _ = run_cli("--simulate", scenario, "--level", "quick")
    assert code == 0
    assert problems(report) == {}
    jsonschema.validate(report, schema())


@pytest.mark.parametrize("scenario,expected", sorted(FAULTS.items()))
def test_fault_scenario_is_caught_by_the_right_check(run_cli, scenario: str,
                                                    expected: dict[str, str]) -> None:
    code, report, _ = run_cli("--simulate", scenario, "--level", "quick")
    assert problems(report) == expected
    assert code == (1 if "FAIL" in expected.values() else 0)
    jsonschema.validate(report, schema())
    for chk in report["checks"]:
        for result in chk["results"]:
            if result["status"] in ("FAIL", "WARN"):
                assert result["fault_code"] == chk["code"]
                assert result["remedy"], f"{chk['id']} gives no remedy"


def test_missing_gpu_is_named_by_pci_address(run_cli) -> None:
    _, report, _ = run_cli("--simulate", "fault-gpu-missing-from-nvml", "--level", "quick")
    (chk,) = [c for c in report["checks"] if c["id"] == "gpu-count"]
    failed = [r for r in chk["results"] if r["status"] == "FAIL"]
    assert [r["device"]["pci"] for r in failed] == ["0000:ab:00.0"]
    assert "7" in str(failed[0]["value"]) and failed[0]["expected"] == "8"


def test_xid_is_attributed_to_its_gpu(run_cli) -> None:
    _, report, _ = run_cli("--simulate", "fault-xid-79", "--level", "quick")
    (chk,) = [c for c in report["checks"] if c["id"] == "xid-events"]
    (result,) = chk["results"]
    assert result["value"] == 79 and result["device"]["pci"] == "0000:9a:00.0"


@pytest.mark.parametrize("scenario,check_id,device_index", [
    ("fault-ecc-uncorrectable", "ecc-errors", 2),
    ("fault-pcie-x8", "pcie-link", 1),
    ("fault-nvlink-down", "nvlink", 4),
    ("fault-thermal-throttle", "clock-throttle", 6),
    ("fault-row-remap-pending", "row-remap", 3),
])
def test_per_gpu_fault_names_only_that_gpu(run_cli, scenario: str, check_id: str,
                                           device_index: int) -> None:
    _, report, _ = run_cli("--simulate", scenario, "--level", "quick")
    (chk,) = [c for c in report["checks"] if c["id"] == check_id]
    bad = [r["device"]["index"] for r in chk["results"] if r["status"] != "PASS"]
    assert bad == [device_index]
    assert len(chk["results"]) == 8


def test_no_driver_blocks_dependent_checks(run_cli) -> None:
    _, report, _ = run_cli("--simulate", "fault-nvml-missing", "--level", "quick")
    by_id = {c["id"]: c for c in report["checks"]}
    assert "NVML library" in by_id["driver-loaded"]["results"][0]["message"]
    assert by_id["ecc-errors"]["status"] == "SKIP"
    assert by_id["ecc-errors"]["results"][0]["message"] == "blocked by driver-loaded"


def test_cpu_only_host_skips_gpu_checks_with_reason(run_cli) -> None:
    code, report, _ = run_cli("--simulate", "cpu-only-healthy", "--level", "quick")
    st = statuses(report)
    assert code == 0
    assert st["pci-gpus"] == "SKIP" and st["ecc-errors"] == "SKIP"
    assert st["shm-size"] == "PASS" and st["os-supported"] == "PASS"
    reasons = {c["results"][0]["message"] for c in report["checks"] if c["status"] == "SKIP"}
    # The fabric checks skip for their own reason: no RDMA device on this host; the
    # host checks operators' suites run skip for theirs: this scenario describes no disks, no
    # swap state and no ipmitool.
    from checks.node.suite.bmc import NO_IPMITOOL
    from checks.node.suite.fabric_links import NO_RDMA
    from checks.node.suite.storage import NO_PATHS

    assert reasons == {"no NVIDIA device on the PCI bus", NO_RDMA, NO_IPMITOOL, NO_PATHS,
                       "swap state not given in the scenario"}


def test_cuda_visible_devices_limits_torch_view(run_cli, tmp_path) -> None:
    scenario = tmp_path / "cvd.yaml"
    scenario.write_text("extends: h100-sxm-8x-healthy\nhost:\n  env: {CUDA_VISIBLE_DEVICES: '0,3'}\n")
    _, report, _ = run_cli("--simulate", str(scenario), "--level", "quick")
    (chk,) = [c for c in report["checks"] if c["id"] == "gpu-count"]
    # A partial verification is not a plain PASS: the six hidden GPUs were not looked at.
    assert chk["status"] == "WARN" and chk["results"][0]["value"] == 2
    assert "CUDA_VISIBLE_DEVICES='0,3'" in chk["results"][0]["message"]
    assert "only 2 of 8 GPU(s) are verified" in chk["results"][0]["message"]
    _, report, _ = run_cli("--simulate", str(scenario), "--level", "quick", "--expect-gpus", "8")
    (chk,) = [c for c in report["checks"] if c["id"] == "gpu-count"]
    assert chk["status"] == "FAIL"
    assert "only 2 of the 8 expected GPUs are usable" in chk["results"][0]["message"]


@pytest.mark.parametrize("value", ["NoDevFiles", "", "-1"])
def test_cuda_visible_devices_hiding_every_gpu_fails(run_cli, tmp_path, value: str) -> None:
    """Slurm's NoDevFiles (a job without --gres), '' and -1 leave torch on the CPU."""
    scenario = tmp_path / "hidden.yaml"
    scenario.write_text("extends: h100-sxm-8x-healthy\n"
                        f"host:\n  env: {{CUDA_VISIBLE_DEVICES: '{value}'}}\n"
                        "torch: {device_count: 0}\n")
    code, report, _ = run_cli("--simulate", str(scenario), "--level", "quick")
    (chk,) = [c for c in report["checks"] if c["id"] == "gpu-count"]
    assert code == 1 and chk["status"] == "FAIL"
    assert "hides all 8 GPU(s): torch would train on the CPU" in chk["results"][0]["message"]


def test_a_query_that_fails_is_error_on_that_gpu_never_pass(run_cli, tmp_path) -> None:
    scenario = tmp_path / "unreadable.yaml"
    scenario.write_text(
        "extends: h100-sxm-8x-healthy\n"
        "gpu_overrides:\n  3: {ecc_volatile_uncorrected: {error: Unknown Error}}\n"
        "host:\n  kernel_log: {error: 'dmesg: Operation not permitted'}\n")
    code, report, _ = run_cli("--simulate", str(scenario), "--level", "quick")
    assert code == 1
    assert problems(report) == {"ecc-errors": "ERROR", "xid-events": "ERROR",
                                "nvswitch-sxid": "ERROR", "pcie-aer": "ERROR"}
    (ecc,) = [c for c in report["checks"] if c["id"] == "ecc-errors"]
    errors = [r for r in ecc["results"] if r["status"] == "ERROR"]
    assert [r["device"]["index"] for r in errors] == [3]
    assert errors[0]["fault_code"] == "GPU002-E"


def test_newer_cuda_minor_runs_under_minor_version_compatibility(run_cli, tmp_path) -> None:
    """torch cu128 on a 550 driver (CUDA 12.4): same major, driver >= 525.60.13: a WARN that
    names the rule, not a FAIL (NVIDIA CUDA Compatibility, minor version compatibility)."""
    scenario = tmp_path / "minor.yaml"
    scenario.write_text("extends: h100-sxm-8x-healthy\n"
                        "torch: {version: 2.7.0+cu128, cuda: '12.8', nccl: 2.26.2,\n"
                        "        arch_list: [sm_80, sm_90, sm_100, sm_120]}\n")
    code, report, _ = run_cli("--simulate", str(scenario), "--level", "quick")
    (chk,) = [c for c in report["checks"] if c["id"] == "cuda-compat"]
    assert code == 0 and chk["status"] == "WARN"
    assert "minor version compatibility" in chk["results"][0]["message"]
    old = tmp_path / "old-driver.yaml"
    old.write_text(f"extends: {scenario}\ndriver: {{version: '520.61.05', cuda_version: 12000}}\n")
    code, report, _ = run_cli("--simulate", str(old), "--level", "quick", "--only", "cuda-compat")
    (chk,) = [c for c in report["checks"] if c["id"] == "cuda-compat"]
    assert code == 1 and chk["status"] == "FAIL"
    assert "below the minor-version-compatibility minimum 525.60.13" in chk["results"][0]["message"]
