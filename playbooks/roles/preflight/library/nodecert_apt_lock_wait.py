#!/usr/bin/python
# Copyright: nodecert contributors
# Apache License 2.0 (see pyproject.toml)
"""Ansible module: wait until no process holds apt's or dpkg's lock, then report who held it."""

from __future__ import annotations

DOCUMENTATION = r"""
module: nodecert_apt_lock_wait
short_description: Wait for apt and dpkg locks to be free, fail clearly when they stay held
description:
  - Asks the kernel whether a write lock could be taken on each lock file (F_GETLK), which is how
    apt and dpkg lock (fcntl record locks). It never takes the lock, so it changes nothing and
    runs the same in check mode.
options:
  paths:
    description: Lock files to test; missing files count as free.
    type: list
    elements: path
    default: [/var/lib/dpkg/lock-frontend, /var/lib/dpkg/lock, /var/lib/apt/lists/lock]
  timeout:
    description: Seconds to wait before failing.
    type: int
    default: 300
  interval:
    description: Seconds between two tests.
    type: float
    default: 2
"""

RETURN = r"""
waited:
  description: Seconds spent waiting.
  returned: always
  type: float
"""

import fcntl
import os
import struct
import time

from ansible.module_utils.basic import AnsibleModule

# struct flock on Linux: short l_type, short l_whence, off_t l_start, off_t l_len, pid_t l_pid.
FLOCK_FORMAT = "hhqqi"


def lock_holder(path: str) -> int | None:
    """PID holding a conflicting lock on path (0 when unknown), None when the lock is free."""
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return None
    try:
        query = struct.pack(FLOCK_FORMAT, fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
        answer = fcntl.fcntl(fd, fcntl.F_GETLK, query)
    finally:
        os.close(fd)
    l_type, _, _, _, l_pid = struct.unpack(FLOCK_FORMAT, answer)
    return None if l_type == fcntl.F_UNLCK else l_pid


def describe(pid: int) -> str:
    if pid <= 0:
        return "a process in another PID namespace"
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            command = handle.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        command = "?"
    return f"PID {pid} ({command or '?'})"


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "paths": {
                "type": "list",
                "elements": "path",
                "default": ["/var/lib/dpkg/lock-frontend", "/var/lib/dpkg/lock", "/var/lib/apt/lists/lock"],
            },
            "timeout": {"type": "int", "default": 300},
            "interval": {"type": "float", "default": 2},
        },
        supports_check_mode=True,
    )
    start = time.monotonic()
    deadline = start + module.params["timeout"]
    while True:
        held = {path: pid for path in module.params["paths"] if (pid := lock_holder(path)) is not None}
        if not held:
            module.exit_json(changed=False, waited=round(time.monotonic() - start, 1))
        if time.monotonic() >= deadline:
            holders = "; ".join(f"{path} held by {describe(pid)}" for path, pid in held.items())
            module.fail_json(
                msg=(
                    f"apt/dpkg is still locked after {module.params['timeout']} s: {holders}. "
                    "Another package operation is running (often unattended-upgrades or cloud-init "
                    "on a fresh machine). Let it finish, or stop it (systemctl stop "
                    "unattended-upgrades), then run the playbook again; to wait longer set "
                    "preflight_apt_lock_timeout."
                ),
                held=held,
            )
        time.sleep(module.params["interval"])


if __name__ == "__main__":
    main()
