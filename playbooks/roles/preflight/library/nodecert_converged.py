#!/usr/bin/python
# Copyright: nodecert contributors
# Apache License 2.0 (see pyproject.toml)
"""Ansible module: compare a node with the record of its last converged provisioning run, or
write that record. The controller half (action_plugins/nodecert_converged.py) decides whether a
run may take the fast path and adds the digest of the run's inputs."""

from __future__ import annotations

DOCUMENTATION = r"""
module: nodecert_converged
short_description: Record a node's state after a converged run, or compare the node with it
description:
  - Reads the node's state: the dpkg database (packages, versions, holds, auto marks), every file
    under the given paths (type, mode, owner, content; a Python venv by its installed
    distributions), the running kernel and its command line, the NVIDIA kernel modules each
    installed kernel's modules.dep lists, the loaded NVIDIA driver, the NVIDIA and Mellanox PCI
    functions, and the state of the NVIDIA systemd units when systemd runs.
  - With C(state=read) it compares that with the record and the given inputs digest, and changes
    nothing (so it runs the same in check mode). With C(state=record) it writes the record when
    it differs.
options:
  state:
    description: C(read) compares, C(record) writes.
    type: str
    choices: [read, record]
    default: read
  inputs:
    description: Digest of what the controller provisions the node from (playbooks, sources, variables).
    type: str
    required: true
  record:
    description: The record's file.
    type: path
    default: /var/lib/nodecert/converged.json
  paths:
    description: Files and directories whose content is part of the state.
    type: list
    elements: path
    default: [/etc]
  notes:
    description: Lines the fast path repeats on every run it takes (a reboot the run could not do).
    type: list
    elements: str
    default: []
"""

RETURN = r"""
converged:
  description: The node and the inputs are those of the record (C(state=read)).
  returned: always
  type: bool
reason:
  description: Why the node is not converged, naming what changed; empty when it is.
  returned: always
  type: str
recorded:
  description: When the record was written (ISO 8601, UTC); empty without one.
  returned: always
  type: str
notes:
  description: The record's notes.
  returned: always
  type: list
"""

import glob  # noqa: E402 (Ansible modules put DOCUMENTATION first)
import hashlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import stat  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

RECORD_VERSION = 2
# Files whose content changes with no one changing the node: the clock's drift, the resolver a
# DHCP client rewrites, the loader's cache (rebuilt after packages, which the dpkg part covers).
VOLATILE = frozenset(
    ["/etc/adjtime", "/etc/resolv.conf", "/etc/mtab", "/etc/ld.so.cache", "/etc/.pwd.lock"]
)
# Content above this size is compared by size and modification time.
HASHED_UP_TO = 4 << 20
PACKAGE_FILES = ("/var/lib/dpkg/status", "/var/lib/apt/extended_states")
PCI_VENDORS = ("0x10de", "0x15b3")  # NVIDIA, Mellanox (the rdma role's NICs)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError:
        return None


def _entry(path: str, info: os.stat_result) -> str:
    kind = stat.S_IFMT(info.st_mode)
    head = f"{stat.S_IMODE(info.st_mode):o} {info.st_uid}:{info.st_gid}"
    if kind == stat.S_IFLNK:
        return f"link {head} {os.readlink(path)}"
    if kind == stat.S_IFDIR:
        return f"dir {head}"
    if kind != stat.S_IFREG:
        return f"special {kind:o} {head}"
    if info.st_size > HASHED_UP_TO:
        return f"file {head} {info.st_size} {info.st_mtime_ns}"
    content = _read(path)
    return f"file {head} {'unreadable' if content is None else _sha(content)}"


def _site_packages(top: str) -> list[str]:
    return glob.glob(os.path.join(top, "lib", "python*", "site-packages"))


def files(paths: list[str], skip: str) -> dict[str, str]:
    """Path -> entry for every file and directory under `paths`. A venv's site-packages counts
    by its top-level names and its *.dist-info directories: what pip installed, not the bytecode
    each run of the checks leaves."""
    found: dict[str, str] = {}
    for top in paths:
        try:
            found[top] = _entry(top, os.lstat(top))
        except FileNotFoundError:
            found[top] = "absent"
            continue
        pruned = {os.path.normpath(p) for p in _site_packages(top)}
        for directory, subdirs, names in os.walk(top):
            subdirs[:] = sorted(d for d in subdirs if d != "__pycache__")
            in_site = directory in pruned
            for name in names + subdirs:
                path = os.path.join(directory, name)
                if path in VOLATILE or path == skip:
                    continue
                try:
                    found[path] = _entry(path, os.lstat(path))
                except OSError:
                    found[path] = "vanished"
            if in_site:
                subdirs[:] = [d for d in subdirs if d.endswith(".dist-info")]
    return found


def nvidia_modules() -> str:
    """The NVIDIA modules each installed kernel's modules.dep lists, and whether each is there."""
    lines = []
    for dep in sorted(glob.glob("/lib/modules/*/modules.dep")):
        base = os.path.dirname(dep)
        text = (_read(dep) or b"").decode(errors="replace")
        for line in text.splitlines():
            module = line.split(":", 1)[0]
            if "nvidia" in os.path.basename(module):
                try:
                    size = str(os.stat(os.path.join(base, module)).st_size)
                except OSError:
                    size = "missing"
                lines.append(f"{base}/{module} {size}")
    return "\n".join(lines)


def pci() -> str:
    lines = []
    for device in sorted(glob.glob("/sys/bus/pci/devices/*")):
        fields = [(_read(os.path.join(device, f)) or b"").decode(errors="replace").strip()
                  for f in ("vendor", "device", "class")]
        if fields[0] in PCI_VENDORS:
            lines.append(f"{os.path.basename(device)} {' '.join(fields)}")
    return "\n".join(lines)


def units() -> str:
    if not os.path.isdir("/run/systemd/system"):
        return "no systemd"
    proc = subprocess.run(
        ["systemctl", "list-units", "--all", "--plain", "--no-legend", "--no-pager",
         "nvidia*", "*dcgm*"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, check=False,
    )
    return "\n".join(sorted(" ".join(line.split()[:4]) for line in proc.stdout.splitlines()))


def components(paths: list[str], record: str) -> dict[str, Any]:
    """The node's state by part, to name what changed: a digest each, but `files`, which maps each
    path to its entry so that a changed file can be named."""
    pending = sorted(os.listdir("/var/lib/dpkg/updates")) if os.path.isdir("/var/lib/dpkg/updates") else []
    parts = {
        "packages": _sha(b"".join((_read(p) or b"absent") for p in PACKAGE_FILES)
                         + " ".join(pending).encode()),
        "files": files(paths, record),
        "kernel": _sha(os.uname().release.encode() + b"\n" + (_read("/proc/cmdline") or b"")),
        "kernel modules": _sha(nvidia_modules().encode()),
        "loaded driver": _sha((_read("/proc/driver/nvidia/version") or b"none")
                              + (b" nouveau" if os.path.isdir("/sys/module/nouveau") else b"")),
        "PCI devices": _sha(pci().encode()),
        "services": _sha(units().encode()),
    }
    return parts


def differences(record: dict, inputs: str, parts: dict[str, Any]) -> str:
    if record.get("version") != RECORD_VERSION:
        return "its record is from another nodecert version"
    if record.get("inputs") != inputs:
        return "the playbooks, this project's sources or the host's variables changed"
    before = record.get("parts", {})
    said = []
    for name, now in parts.items():
        was = before.get(name)
        if was == now:
            continue
        if name != "files" or not isinstance(was, dict):
            said.append(name)
            continue
        paths = sorted(p for p in set(was) | set(now) if was.get(p) != now.get(p))
        shown = ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")
        said.append(f"files ({shown})")
    return "changed since: " + "; ".join(said) if said else ""


def write_record(path: str, record: dict) -> None:
    """Atomically, readable by root alone: it holds digests of every file under /etc."""
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    partial = path + ".partial"
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        json.dump(record, handle, sort_keys=True)
    os.chmod(partial, 0o600)
    os.replace(partial, path)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "state": {"type": "str", "choices": ["read", "record"], "default": "read"},
            "inputs": {"type": "str", "required": True},
            "record": {"type": "path", "default": "/var/lib/nodecert/converged.json"},
            "paths": {"type": "list", "elements": "path", "default": ["/etc"]},
            "notes": {"type": "list", "elements": "str", "default": []},
        },
        supports_check_mode=True,
    )
    params = module.params
    parts = components(params["paths"], params["record"])
    text = _read(params["record"])
    try:
        record = json.loads(text) if text is not None else None
    except ValueError:
        record = None
    if not isinstance(record, dict):
        reason = "no record of a converged run" if text is None else "its record is unreadable"
        record = {}
    else:
        reason = differences(record, params["inputs"], parts)
    result = {
        "changed": False,
        "converged": reason == "",
        "reason": reason,
        "recorded": str(record.get("recorded", "")),
        "notes": list(record.get("notes", [])),
    }
    stale = reason != "" or result["notes"] != params["notes"]
    if params["state"] == "record" and stale and not module.check_mode:
        new = {
            "version": RECORD_VERSION,
            "recorded": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "inputs": params["inputs"],
            "notes": params["notes"],
            "parts": parts,
        }
        try:
            write_record(params["record"], new)
        except OSError as error:
            # The node is provisioned all the same; the next run runs every task.
            module.warn(f"could not record the converged node in {params['record']}: {error}")
        else:
            result.update(recorded=new["recorded"], notes=new["notes"])
    module.exit_json(**result)


if __name__ == "__main__":
    main()
