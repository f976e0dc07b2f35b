"""Verdict rules for the node types people really have, each case a small scenario on top of a
shipped one. The shipped node-* and field-* scenarios (tests/framework/test_node_types.py,
test_field_corpus.py) carry the sourced facts; these pin the rules one at a time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

HEALTHY = "h100-sxm-8x-healthy"


def _results(report: dict[str, Any], check_id: str) -> list[dict[str, Any]]:
    (chk,) = [c for c in report["checks"] if c["id"] == check_id]
    return chk["results"]


def _status(report: dict[str, Any], check_id: str) -> str:
    (chk,) = [c for c in report["checks"] if c["id"] == check_id]
    return chk["status"]


def _problems(report: dict[str, Any]) -> dict[str, str]:
    return {c["id"]: c["status"] for c in report["checks"] if c["status"] in ("FAIL", "ERROR", "WARN")}


@pytest.fixture
def simulate(run_cli, tmp_path: Path):
    def run(yaml_text: str, *argv: str) -> tuple[int, dict[str, Any]]:
        path = tmp_path / f"case{len(list(tmp_path.glob('case*.yaml')))}.yaml"
        path.write_text(yaml_text)
        code, report, err = run_cli("--simulate", str(path), "--level", "quick", *argv)
        assert report is not None, err
        return code, report

    return run


# A single H100 SXM passed through to a KVM guest: no NVSwitch on the guest's bus, NVML answers
# NOT_SUPPORTED for NVLink, the driver reports no fabric, no Fabric Manager unit, and the
# guest's virtual root port shows Gen4 (real-nodes notes: cloud 1-GPU slices of HGX boards).
VM_SLICE = f"""
extends: {HEALTHY}
host:
  virtualization: kvm
  cpu_count: 26
  numa_nodes: {{0: 26}}
  services: {{nvidia-persistenced: active}}
  fabric_manager_version: null
nvswitches: []
gpu_defaults:
  nvlink: not_supported
  fabric_info: {{state: not_supported, status: success, cluster_uuid: null, clique_id: 0}}
  pcie_gen_max: 4
gpus:
  - {{pci_bus_id: "0000:06:00.0", uuid: GPU-1, serial: "1650000000001", numa_node: 0}}
"""


def test_vm_slice_with_one_sxm_gpu_is_green(simulate) -> None:
    code, report = simulate(VM_SLICE)
    problems = _problems(report)
    assert problems == {}, problems
    assert code == 0
    assert _status(report, "nvlink") == "SKIP"
    assert "no NVSwitch on the PCI bus" in _results(report, "nvlink")[0]["message"]
    assert _status(report, "fabric-manager") == "SKIP"
    assert "kvm VM's virtual root port" in _results(report, "pcie-link")[0]["message"]


def test_vm_slice_still_fails_a_real_fault(simulate) -> None:
    code, report = simulate(VM_SLICE + "gpu_overrides:\n  0: {ecc_volatile_uncorrected: 2}\n")
    assert code == 1 and _status(report, "ecc-errors") == "FAIL"
    assert _results(report, "ecc-errors")[0]["device"]["serial"] == "1650000000001"


def test_sxm_gpus_without_nvswitch_or_links_warn(simulate) -> None:
    _, report = simulate(VM_SLICE + """gpus:
  - {pci_bus_id: "0000:06:00.0", uuid: GPU-1}
  - {pci_bus_id: "0000:07:00.0", uuid: GPU-2}
""")
    assert _status(report, "nvlink") == "WARN"
    assert "GPU-to-GPU traffic goes over PCIe" in _results(report, "nvlink")[0]["message"]


H100_NVL_PAIR = """
description: two H100 NVL cards
extends: h100-sxm-8x-healthy
nvswitches: []
host: {services: {nvidia-persistenced: active}, fabric_manager_version: null}
gpu_defaults:
  name: NVIDIA H100 NVL
  pci_device_id: 0x2321
  fabric_info: {state: not_supported, status: success, cluster_uuid: null, clique_id: 0}
  nvlink: {links: 18, inactive: [12, 13, 14, 15, 16, 17]}
  power_limit_w: 400.0
  power_default_limit_w: 400.0
gpus:
  - {pci_bus_id: "0000:41:00.0", uuid: GPU-a}
  - {pci_bus_id: "0000:61:00.0", uuid: GPU-b}
"""


def test_bridged_h100_nvl_pair_with_12_of_18_links_passes(simulate) -> None:
    code, report = simulate(H100_NVL_PAIR)
    assert report["profile"]["name"] == "h100-nvl"
    assert _status(report, "nvlink") == "PASS", _results(report, "nvlink")
    assert code == 0, _problems(report)


def test_bridged_pair_with_a_link_down_fails_that_gpu(simulate) -> None:
    override = "gpu_overrides:\n  1: {nvlink: {links: 18, inactive: [3, 12, 13, 14, 15, 16, 17]}}\n"
    code, report = simulate(H100_NVL_PAIR + override)
    failed = [r for r in _results(report, "nvlink") if r["status"] == "FAIL"]
    assert code == 1 and [r["device"]["pci"] for r in failed] == ["0000:61:00.0"]
    assert "11 of 12 NVLink links up" in failed[0]["message"]


def test_unbridged_pcie_card_does_not_fail_nvlink(simulate) -> None:
    code, report = simulate(H100_NVL_PAIR.replace("inactive: [12, 13, 14, 15, 16, 17]",
                                                  "inactive: [" + ", ".join(map(str, range(18))) + "]"))
    assert _status(report, "nvlink") == "SKIP"
    assert "no NVLink bridge" in _results(report, "nvlink")[0]["message"]
    assert code == 0


def test_container_given_two_of_eight_gpus(simulate) -> None:
    """docker --gpus '"device=2,5"': sysfs shows all 8, NVML and /dev only the 2 given."""
    code, report = simulate(f"""
extends: {HEALTHY}
host: {{container: docker, device_nodes: [2, 5], cpu_count: 16, fabric_manager_version: null,
       services: {{nvidia-fabricmanager: unknown, nvidia-persistenced: unknown}}}}
gpu_overrides:
  0: {{nvml_visible: false}}
  1: {{nvml_visible: false}}
  3: {{nvml_visible: false}}
  4: {{nvml_visible: false}}
  6: {{nvml_visible: false}}
  7: {{nvml_visible: false}}
""")
    problems = _problems(report)
    assert code == 0, problems
    assert "6 on the bus not given to this docker container" in _results(report, "gpu-count")[0]["message"]
    assert "16 CPUs for 2 GPUs" in _results(report, "cpu-numa")[0]["message"]
    assert "unit not visible here" in _results(report, "fabric-manager")[0]["message"]


def test_container_given_gpu_that_does_not_answer_fails(simulate) -> None:
    code, report = simulate(f"""
extends: {HEALTHY}
host: {{container: docker, device_nodes: [2, 5], services: {{}}}}
gpu_overrides:
  0: {{nvml_visible: false}}
  1: {{nvml_visible: false}}
  3: {{nvml_visible: false}}
  4: {{nvml_visible: false}}
  5: {{nvml_visible: false}}
  6: {{nvml_visible: false}}
  7: {{nvml_visible: false}}
""")
    assert code == 1 and _status(report, "gpu-count") == "FAIL"
    assert "1 GPU(s) given to this docker container" in _results(report, "gpu-count")[0]["message"]


def test_container_with_expect_gpus_counts_what_it_was_given(simulate) -> None:
    code, report = simulate(f"""
extends: {HEALTHY}
host: {{container: kubernetes, device_nodes: [0], services: {{}}}}
gpu_overrides: {{{", ".join(f"{i}: {{nvml_visible: false}}" for i in range(1, 8))}}}
""", "--expect-gpus", "8")
    assert code == 1 and _status(report, "gpu-count") == "FAIL"
    assert "only 1 of the 8 expected GPUs are usable" in _results(report, "gpu-count")[0]["message"]


def test_hgx_with_fewer_gpus_than_its_platform_fails_without_expect(simulate) -> None:
    code, report = simulate(f"extends: {HEALTHY}\ngpu_overrides:\n  7: {{on_pci: false}}\n")
    assert code == 1 and _status(report, "gpu-count") == "FAIL"
    assert "this platform (h100-sxm) holds 8" in _results(report, "gpu-count")[0]["message"]


def test_lost_gpu_is_named_and_the_others_still_checked(simulate) -> None:
    code, report = simulate(f"extends: {HEALTHY}\ngpu_overrides:\n  3: {{lost: true}}\n")
    # gpu-count names it; every per-GPU check says it could not measure that one GPU.
    problems = _problems(report)
    assert code == 1 and problems.pop("gpu-count") == "FAIL"
    assert set(problems.values()) == {"ERROR"}
    (lost,) = [r for r in _results(report, "gpu-count") if r["status"] == "FAIL"]
    assert lost["device"] == {"index": 3, "pci": "0000:5d:00.0", "uuid": None, "name": None,
                              "serial": None}
    ecc = _results(report, "ecc-errors")
    assert [r["status"] for r in ecc].count("PASS") == 7
    assert "GPU_IS_LOST" in ecc[3]["message"]


def test_fabric_manager_version_must_equal_the_driver(simulate) -> None:
    code, report = simulate(f"extends: {HEALTHY}\nhost: {{fabric_manager_version: '550.54.15'}}\n")
    assert code == 1 and _status(report, "fabric-manager") == "FAIL"
    assert "Fabric Manager 550.54.15 != driver 550.90.07" in _results(report, "fabric-manager")[0]["message"]


def test_fabric_registration_not_finished_fails_each_gpu(simulate) -> None:
    code, report = simulate(f"""extends: {HEALTHY}
gpu_overrides:
  2: {{fabric_info: {{state: in_progress, status: success, cluster_uuid: null, clique_id: 0}}}}
""")
    failed = [r for r in _results(report, "fabric-manager") if r["status"] == "FAIL"]
    assert code == 1 and [r["device"]["index"] for r in failed] == [2]


def test_fabric_manager_down_fails(simulate) -> None:
    code, report = simulate(f"extends: {HEALTHY}\nhost: {{services: {{nvidia-fabricmanager: failed}}}}\n")
    assert code == 1 and _status(report, "fabric-manager") == "FAIL"


@pytest.mark.parametrize("mode,status", [("exclusive_process", "WARN"), ("prohibited", "FAIL")])
def test_compute_mode(simulate, mode: str, status: str) -> None:
    _, report = simulate(f"extends: {HEALTHY}\ngpu_overrides:\n  5: {{compute_mode: {mode}}}\n")
    bad = [r for r in _results(report, "compute-mode") if r["status"] != "PASS"]
    assert [(r["status"], r["device"]["index"]) for r in bad] == [(status, 5)]


def test_ecc_by_location(simulate) -> None:
    loc = ("{sram: {volatile_uncorrected: 0, volatile_corrected: 3, aggregate_uncorrected: 0, "
           "aggregate_corrected: 12000}, dram: {volatile_uncorrected: 0, volatile_corrected: 0, "
           "aggregate_uncorrected: 2, aggregate_corrected: 50}}")
    _, report = simulate(f"extends: {HEALTHY}\ngpu_overrides:\n  1: {{ecc_by_location: {loc}, "
                         "ecc_aggregate_uncorrected: 2}\n")
    (warned,) = [r for r in _results(report, "ecc-errors") if r["status"] != "PASS"]
    assert warned["status"] == "WARN" and warned["device"]["index"] == 1
    assert "SRAM 12000 / DRAM 50 correctable, 2 uncorrectable lifetime" in warned["message"]
