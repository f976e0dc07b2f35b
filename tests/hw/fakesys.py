"""A fake /sys/bus/pci/devices tree for LinuxBackend(sys_pci=...)."""

from __future__ import annotations

from pathlib import Path

NVIDIA = 0x10DE
CLASS_3D = 0x030200


def device(root: Path, address: str, vendor: int, device_id: int, klass: int,
           **attributes: str) -> Path:
    """One PCI function as sysfs shows it: vendor/device/class files, plus any attribute."""
    path = root / address
    path.mkdir(parents=True)
    values = {"vendor": f"0x{vendor:04x}", "device": f"0x{device_id:04x}",
              "class": f"0x{klass:06x}", **attributes}
    for name, value in values.items():
        (path / name).write_text(value + "\n")
    return path


def gpu(root: Path, address: str, device_id: int, width: int = 16, speed: str = "32.0 GT/s PCIe"
        ) -> Path:
    """An NVIDIA 3D controller with a full-width link (device_id: e.g. 0x2330 for H100 SXM5)."""
    return device(root, address, NVIDIA, device_id, CLASS_3D, numa_node="0",
                  current_link_width=str(width), max_link_width=str(width),
                  current_link_speed=speed, max_link_speed=speed)
