"""The real NVML and torch path on a GPU host (skipped without a CUDA GPU)."""

from __future__ import annotations

import pytest

from checks.hw.base import GPU_FIELDS, HardwareError, NotSupported
from checks.hw.linux import LinuxBackend

pytestmark = pytest.mark.gpu


def test_nvml_answers_every_field_or_says_not_supported() -> None:
    nvml = LinuxBackend().nvml()
    assert nvml.device_count() >= 1
    assert nvml.driver_version()
    assert nvml.cuda_driver_version() >= 11000
    gpu = nvml.gpu(0)
    answered = {}
    for name in GPU_FIELDS:
        try:
            answered[name] = gpu.query(name)
        except NotSupported:
            continue
    for name in ("name", "uuid", "pci_bus_id", "memory_total_bytes", "temperature_c"):
        assert answered.get(name) not in (None, ""), name


def test_pci_and_nvml_and_torch_agree() -> None:
    hw = LinuxBackend()
    pci = [d.address for d in hw.pci_devices() if d.is_nvidia_gpu]
    nvml = hw.nvml()
    nvml_pci = [nvml.gpu(i).query("pci_bus_id") for i in range(nvml.device_count())]
    assert set(nvml_pci) <= set(pci)
    assert hw.torch().device_count >= 1


def test_quick_level_on_this_gpu_host(run_cli) -> None:
    _, report, _ = run_cli("--level", "quick")
    by_id = {c["id"]: c["status"] for c in report["checks"]}
    assert by_id["driver-loaded"] == "PASS"
    assert by_id["gpu-count"] == "PASS"
    errors = [c["id"] for c in report["checks"] if c["status"] == "ERROR"]
    assert not errors, f"could not measure: {errors}"


def test_unknown_field_is_rejected() -> None:
    with pytest.raises((KeyError, HardwareError)):
        LinuxBackend().nvml().gpu(0).query("bogus")
