"""The real hardware layer on this machine, and sysfs parsing on a fake PCI tree."""

from __future__ import annotations

from pathlib import Path

import pytest

from checks.hw.base import HardwareError, NvmlUnavailable
from checks.hw.fixture import FixtureBackend, load_scenario
from checks.hw.linux import LinuxBackend, _count_cpulist


def fake_pci(root: Path, address: str, vendor: str, device: str, klass: str, **extra: str) -> None:
    d = root / address
    d.mkdir(parents=True)
    for name, value in {"vendor": vendor, "device": device, "class": klass, **extra}.items():
        (d / name).write_text(value + "\n")


def test_sysfs_pci_parsing(tmp_path: Path) -> None:
    fake_pci(tmp_path, "0000:3b:00.0", "0x10de", "0x2330", "0x030200",
             current_link_width="8", max_link_width="16", current_link_speed="32.0 GT/s PCIe",
             numa_node="1")
    fake_pci(tmp_path, "0000:05:00.0", "0x10de", "0x22a3", "0x068000")
    fake_pci(tmp_path, "0000:00:1f.0", "0x8086", "0x1234", "0x060100")
    devices = {d.address: d for d in LinuxBackend(sys_pci=tmp_path).pci_devices()}
    gpu = devices["0000:3b:00.0"]
    assert gpu.is_nvidia_gpu and not gpu.is_nvswitch
    assert (gpu.current_link_width, gpu.max_link_width, gpu.numa_node) == (8, 16, 1)
    assert devices["0000:05:00.0"].is_nvswitch
    assert not devices["0000:00:1f.0"].is_nvidia_gpu


def test_missing_sysfs_is_a_hardware_error(tmp_path: Path) -> None:
    with pytest.raises(HardwareError):
        LinuxBackend(sys_pci=tmp_path / "absent").pci_devices()


def test_this_machine_reads_without_errors() -> None:
    hw = LinuxBackend()
    assert hw.cpu_count() >= 1
    assert sum(hw.numa_nodes().values()) >= 1
    assert hw.shm().total_bytes > 0
    assert hw.os_release().get("ID")
    assert isinstance(hw.loaded_modules(), set)
    assert hw.memlock_limit() == -1 or hw.memlock_limit() > 0
    torch = hw.torch()
    assert torch.version and torch.error is None


def test_nvml_unavailable_is_translated_not_raised_raw() -> None:
    hw = LinuxBackend()
    if any(d.is_nvidia_gpu for d in hw.pci_devices()):
        pytest.skip("this machine has NVIDIA GPUs")
    with pytest.raises(NvmlUnavailable) as info:
        hw.nvml()
    assert info.value.kind in {"library_missing", "driver_not_loaded", "bindings_missing"}


def test_cpulist() -> None:
    assert _count_cpulist("0-3,8,10-11") == 7
    assert _count_cpulist("") == 0


def test_fixture_query_spellings() -> None:
    hw = FixtureBackend(load_scenario("fault-nvlink-down"))
    gpu = hw.nvml().gpu(4)
    links = gpu.query("nvlink")
    assert len(links) == 18 and [lk["link"] for lk in links if not lk["active"]] == [7]
    assert gpu.query("compute_capability") == (9, 0)
    from checks.hw.base import NotSupported

    with pytest.raises(NotSupported):
        gpu.query("retired_pages_sbe")
    with pytest.raises(KeyError):
        gpu.query("no_such_field")
