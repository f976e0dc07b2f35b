"""Expected hosts from an Ansible inventory, read by Ansible itself (`ansible-inventory --list`),
so every inventory format and plugin Ansible knows works here too."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path


class InventoryError(Exception):
    """The inventory could not be read (one-line message)."""


def _ansible_inventory() -> str:
    beside_python = Path(sys.executable).with_name("ansible-inventory")
    found = str(beside_python) if beside_python.exists() else shutil.which("ansible-inventory")
    if not found:
        raise InventoryError("ansible-inventory not found (install ansible-core, or use --expect-hosts)")
    return found


def hosts(path: str | Path, timeout_s: float = 120.0) -> list[str]:
    """Every host of the inventory at `path`, sorted."""
    if not Path(path).exists():
        raise InventoryError(f"inventory {path} does not exist")
    cmd = [_ansible_inventory(), "-i", str(path), "--list"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise InventoryError(f"ansible-inventory -i {path} timed out after {timeout_s:g} s") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise InventoryError(f"ansible-inventory -i {path} failed: {last}")
    try:
        data = json.loads(proc.stdout)
    except ValueError as exc:
        raise InventoryError(f"ansible-inventory -i {path}: unexpected output ({exc})") from None
    names = set(data.get("_meta", {}).get("hostvars", {}))
    for group, body in data.items():
        if group != "_meta" and isinstance(body, dict):
            names.update(body.get("hosts", []))
    return sorted(names)
