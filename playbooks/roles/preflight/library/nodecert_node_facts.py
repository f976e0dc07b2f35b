#!/usr/bin/python
# Copyright: nodecert contributors
# Apache License 2.0 (see pyproject.toml)
"""Ansible module: read what the NVIDIA roles need to know about a node, in one pass."""

from __future__ import annotations

DOCUMENTATION = r"""
module: nodecert_node_facts
short_description: NVIDIA PCI devices, Secure Boot, loaded driver and free disk of a node
description:
  - Reads sysfs and procfs only; changes nothing, so it runs the same in check mode.
  - Each NVIDIA function on the PCI bus is classified as a GPU (class 0x0300 or 0x0302),
    an NVSwitch (class 0x0680) or other, and GPUs are matched against the given architecture
    table to say which kernel-module flavour they need.
options:
  pci_devices_path:
    description: Directory listing the PCI functions.
    type: path
    default: /sys/bus/pci/devices
  efivars_path:
    description: Directory of EFI variables.
    type: path
    default: /sys/firmware/efi/efivars
  architectures:
    description:
      - List of dicts with C(name), C(first), C(last) (PCI device IDs, hex strings) and
        C(kernel_modules) (C(open_required), C(open_recommended) or C(proprietary_only)).
    type: list
    elements: dict
    default: []
  models:
    description: Map of PCI device ID (hex string, lower case, no 0x) to a model name.
    type: dict
    default: {}
  disk_path:
    description: Path whose file system's free space is reported.
    type: path
    default: /
  dmi_product_path:
    description: File holding the DMI product name (the system builder's model).
    type: path
    default: /sys/class/dmi/id/product_name
  platforms:
    description:
      - Ordered list of platform rules; the first that matches names the platform. A rule has
        C(name), C(fabric) and any of C(device_ids) (every GPU's device ID is one of them),
        C(architectures) (every GPU's architecture is one of them), C(min_gpus), C(nvswitch)
        (NVSwitches on the PCI bus or not) and C(dmi) (regular expression the DMI product name
        must match). A rule without conditions matches any node with a GPU.
    type: list
    elements: dict
    default: []
  platform:
    description: C(auto) picks the platform from the rules; a rule's name forces that platform.
    type: str
    default: auto
"""

RETURN = r"""
ansible_facts:
  description: C(nodecert_node) with gpus, nvswitches, platform, platform_fabric, dmi_product,
    secure_boot, loaded_driver_version, nouveau_loaded, systemd_running and free_disk_mb.
  returned: always
  type: dict
"""

import os
import re

from ansible.module_utils.basic import AnsibleModule

NVIDIA_VENDOR = 0x10DE
GPU_CLASSES = (0x0300, 0x0302)
NVSWITCH_CLASS = 0x0680
SECURE_BOOT_VAR = "SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"


def _read(path: str) -> str | None:
    try:
        with open(path) as handle:
            return handle.read().strip()
    except OSError:
        return None


def _architecture(device_id: int, architectures: list[dict]) -> dict:
    for arch in architectures:
        if int(str(arch["first"]), 16) <= device_id <= int(str(arch["last"]), 16):
            return {"architecture": arch["name"], "kernel_modules": arch["kernel_modules"]}
    return {"architecture": "unknown", "kernel_modules": "unknown"}


def pci_devices(path: str, architectures: list[dict], models: dict) -> tuple[list, list]:
    gpus, nvswitches = [], []
    try:
        addresses = sorted(os.listdir(path))
    except OSError:
        return gpus, nvswitches
    for address in addresses:
        base = os.path.join(path, address)
        vendor, device, pci_class = (_read(os.path.join(base, f)) for f in ("vendor", "device", "class"))
        if not (vendor and device and pci_class):
            continue
        try:
            if int(vendor, 16) != NVIDIA_VENDOR:
                continue
            device_id, class_code = int(device, 16), int(pci_class, 16) >> 8
        except ValueError:
            continue
        entry = {
            "address": address,
            "device_id": f"{device_id:04x}",
            "model": models.get(f"{device_id:04x}", f"NVIDIA device {device_id:04x}"),
        }
        if class_code in GPU_CLASSES:
            entry.update(_architecture(device_id, architectures))
            gpus.append(entry)
        elif class_code == NVSWITCH_CLASS:
            nvswitches.append(entry)
    return gpus, nvswitches


def _rule_matches(rule: dict, gpus: list, nvswitches: list, dmi: str) -> bool:
    ids = {str(i).lower().removeprefix("0x").zfill(4) for i in rule.get("device_ids") or []}
    if ids and not all(g["device_id"] in ids for g in gpus):
        return False
    architectures = rule.get("architectures") or []
    if architectures and not all(g["architecture"] in architectures for g in gpus):
        return False
    if len(gpus) < int(rule.get("min_gpus") or 1):
        return False
    if rule.get("nvswitch") is not None and bool(nvswitches) != bool(rule["nvswitch"]):
        return False
    return not rule.get("dmi") or re.search(str(rule["dmi"]), dmi or "") is not None


def platform(rules: list[dict], gpus: list, nvswitches: list, dmi: str | None) -> dict:
    """The first rule every GPU (and the bus, and the DMI product name) satisfies; 'none' without
    a GPU, 'unknown' when no rule matches."""
    if not gpus:
        return {"name": "none", "fabric": "none"}
    for rule in rules:
        if _rule_matches(rule, gpus, nvswitches, dmi or ""):
            return {"name": str(rule["name"]), "fabric": str(rule.get("fabric", "none"))}
    return {"name": "unknown", "fabric": "none"}


def secure_boot(efivars: str) -> str:
    """'enabled', 'disabled', or 'unsupported' (no EFI: legacy BIOS boot)."""
    if not os.path.isdir(efivars):
        return "unsupported"
    try:
        with open(os.path.join(efivars, SECURE_BOOT_VAR), "rb") as handle:
            data = handle.read()
    except OSError:
        return "disabled"
    # Four bytes of attributes, then the value.
    return "enabled" if len(data) >= 5 and data[4] == 1 else "disabled"


def loaded_driver_version() -> str | None:
    text = _read("/proc/driver/nvidia/version")
    if not text:
        return None
    for token in text.split():
        parts = token.split(".")
        if len(parts) >= 2 and all(p.isdigit() for p in parts):
            return token
    return None


def module_loaded(name: str) -> bool:
    text = _read("/proc/modules") or ""
    return any(line.split(" ", 1)[0] == name for line in text.splitlines())


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "pci_devices_path": {"type": "path", "default": "/sys/bus/pci/devices"},
            "efivars_path": {"type": "path", "default": "/sys/firmware/efi/efivars"},
            "architectures": {"type": "list", "elements": "dict", "default": []},
            "models": {"type": "dict", "default": {}},
            "disk_path": {"type": "path", "default": "/"},
            "dmi_product_path": {"type": "path", "default": "/sys/class/dmi/id/product_name"},
            "platforms": {"type": "list", "elements": "dict", "default": []},
            "platform": {"type": "str", "default": "auto"},
        },
        supports_check_mode=True,
    )
    params = module.params
    gpus, nvswitches = pci_devices(params["pci_devices_path"], params["architectures"], params["models"])
    dmi = _read(params["dmi_product_path"])
    if params["platform"] == "auto":
        found = platform(params["platforms"], gpus, nvswitches, dmi)
    else:
        chosen = [r for r in params["platforms"] if r.get("name") == params["platform"]]
        if not chosen:
            names = ", ".join(str(r.get("name")) for r in params["platforms"])
            module.fail_json(msg=f"unknown platform {params['platform']!r}; known: auto, {names}")
        found = {"name": params["platform"], "fabric": str(chosen[0].get("fabric", "none"))}
    stat = os.statvfs(params["disk_path"])
    facts = {
        "gpus": gpus,
        "nvswitches": nvswitches,
        "platform": found["name"],
        "platform_fabric": found["fabric"],
        "dmi_product": dmi,
        "secure_boot": secure_boot(params["efivars_path"]),
        "loaded_driver_version": loaded_driver_version(),
        "nouveau_loaded": module_loaded("nouveau"),
        # What sd_booted(3) tests: systemd is PID 1 of this (chroot-less) system.
        "systemd_running": os.path.isdir("/run/systemd/system"),
        "free_disk_mb": stat.f_bavail * stat.f_frsize // (1024 * 1024),
    }
    module.exit_json(changed=False, ansible_facts={"nodecert_node": facts})


if __name__ == "__main__":
    main()
