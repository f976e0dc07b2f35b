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

import time  # noqa: E402 (Ansible modules put DOCUMENTATION first)

from ansible.module_utils.basic import AnsibleModule  # noqa: E402 (Ansible modules put DOCUMENTATION first)
from ansible.module_utils.nodecert_dpkg_lock import APT_LOCKS, describe_held, held_locks  # noqa: E402 (Ansible modules put DOCUMENTATION first)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "paths": {
                "type": "list",
                "elements": "path",
                "default": list(APT_LOCKS),
            },
            "timeout": {"type": "int", "default": 300},
            "interval": {"type": "float", "default": 2},
        },
        supports_check_mode=True,
    )
    start = time.monotonic()
    deadline = start + module.params["timeout"]
    while True:
        held = held_locks(module.params["paths"])
        if not held:
            module.exit_json(changed=False, waited=round(time.monotonic() - start, 1))
        if time.monotonic() >= deadline:
            holders = describe_held(held)
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
