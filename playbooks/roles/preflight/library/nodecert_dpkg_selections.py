#!/usr/bin/python
# Copyright: nodecert contributors
# Apache License 2.0 (see pyproject.toml)
"""Ansible module: hold or release packages in one dpkg call, waiting for dpkg's lock as apt does."""

from __future__ import annotations

DOCUMENTATION = r"""
module: nodecert_dpkg_selections
short_description: Hold or release packages, waiting while another apt/dpkg run holds dpkg's lock
description:
  - The one way the roles set dpkg selections. C(dpkg --set-selections) takes dpkg's lock and gives
    up at once when another package operation (unattended-upgrades, cloud-init) holds it; this
    module waits for the lock instead, as long as the apt tasks wait (C(lock_timeout)), and fails
    with one line naming the lock and its holder when it stays held.
  - Reads the current selections first (C(dpkg --get-selections), no lock needed) and changes only
    the packages whose selection differs, all in one C(dpkg --set-selections) run. In check mode it
    reads and reports, and never runs C(dpkg --set-selections).
  - A package dpkg does not know cannot be held; a real run says so in a warning, check mode counts
    it as a change (the run that installs it would hold it).
options:
  name:
    description: Packages to set; an empty list does nothing.
    type: list
    elements: str
    required: true
  selection:
    description: C(hold) keeps apt from upgrading or removing them; C(install) lifts the hold of those held.
    type: str
    choices: [hold, install]
    required: true
  lock_timeout:
    description: Seconds to wait for dpkg's lock before failing (the roles pass preflight_apt_lock_timeout).
    type: int
    default: 300
  interval:
    description: Seconds between two looks at the lock.
    type: float
    default: 1
"""

RETURN = r"""
changed_packages:
  description: The packages whose selection was (in check mode, would be) set.
  returned: always
  type: list
waited:
  description: Seconds spent waiting for dpkg's lock.
  returned: always
  type: float
"""

import subprocess  # noqa: E402 (Ansible modules put DOCUMENTATION first)
import time  # noqa: E402 (Ansible modules put DOCUMENTATION first)

from ansible.module_utils.basic import AnsibleModule  # noqa: E402 (Ansible modules put DOCUMENTATION first)
from ansible.module_utils.nodecert_dpkg_lock import DPKG_LOCKS, describe_held, held_locks  # noqa: E402 (Ansible modules put DOCUMENTATION first)

# What dpkg prints when it finds its lock taken ("dpkg: error: dpkg frontend lock was locked by
# another process with pid N", "... unable to acquire the dpkg frontend lock ...").
LOCK_WORDS = ("lock was locked", "acquire the dpkg", "lock-frontend", "/var/lib/dpkg/lock")


def current_selections(module: AnsibleModule, names: list[str]) -> dict[str, str]:
    """name -> selection for the names dpkg knows; Multi-Arch: same libraries (name:amd64) also
    under their plain name. Reading needs no lock."""
    rc, out, err = module.run_command(["dpkg", "--get-selections", *names], environ_update={"LC_ALL": "C"})
    if rc != 0:
        module.fail_json(msg=f"dpkg --get-selections failed: {err.strip() or out.strip()}", rc=rc)
    found: dict[str, str] = {}
    for line in out.splitlines():
        fields = line.split()
        if len(fields) == 2:
            found[fields[0]] = fields[1]
            found.setdefault(fields[0].split(":")[0], fields[1])
    return found


def set_selections(module: AnsibleModule, names: list[str], selection: str) -> tuple[float, str]:
    """Run dpkg --set-selections for names, retrying while dpkg's lock is taken, until
    lock_timeout. Returns (seconds waited, '') or (seconds waited, why it failed)."""
    start = time.monotonic()
    deadline = start + module.params["lock_timeout"]
    data = "".join(f"{name} {selection}\n" for name in names)
    action = "hold" if selection == "hold" else "release the hold of"
    while True:
        held = held_locks(DPKG_LOCKS)
        if not held:
            # dpkg that finds the lock taken may exit before reading its input: communicate()
            # ignores that broken pipe, and the exit status and stderr tell why.
            done = subprocess.run(
                ["dpkg", "--set-selections"], input=data, capture_output=True, text=True,
                env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}, check=False,
            )
            if done.returncode == 0:
                return round(time.monotonic() - start, 1), ""
            if not any(word in done.stderr for word in LOCK_WORDS):
                failure = f"dpkg --set-selections failed: {done.stderr.strip()}"
                return round(time.monotonic() - start, 1), failure
            held = held_locks(DPKG_LOCKS) or {DPKG_LOCKS[0]: 0}
        if time.monotonic() >= deadline:
            return round(time.monotonic() - start, 1), (
                f"dpkg's lock is still held after {module.params['lock_timeout']} s: {describe_held(held)}; "
                f"could not {action} {', '.join(names)}. "
                "Another package operation is running (often unattended-upgrades): let it finish, or stop it "
                "(systemctl stop unattended-upgrades), then run the playbook again; to wait longer set "
                "preflight_apt_lock_timeout."
            )
        time.sleep(module.params["interval"])


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "name": {"type": "list", "elements": "str", "required": True},
            "selection": {"type": "str", "choices": ["hold", "install"], "required": True},
            "lock_timeout": {"type": "int", "default": 300},
            "interval": {"type": "float", "default": 1},
        },
        supports_check_mode=True,
    )
    names = sorted(set(module.params["name"]))
    selection = module.params["selection"]
    if not names:
        module.exit_json(changed=False, changed_packages=[], waited=0.0)
    current = current_selections(module, names)
    if selection == "install":
        # Only holds are lifted: a removed package (deinstall) is not marked for installation, and
        # one dpkg does not know has no hold to lift.
        unknown, wanted = [], [name for name in names if current.get(name) == "hold"]
    else:
        unknown = [name for name in names if name not in current]
        wanted = [name for name in names if name in current and current[name] != selection]
    if module.check_mode:
        module.exit_json(changed=bool(wanted or unknown), changed_packages=wanted + unknown, waited=0.0)
    for name in unknown:
        module.warn(f"{name} is not installed: dpkg cannot hold it")
    if not wanted:
        module.exit_json(changed=False, changed_packages=[], waited=0.0)
    waited, failure = set_selections(module, wanted, selection)
    if failure:
        module.fail_json(msg=failure, waited=waited)
    after = current_selections(module, wanted)
    missed = [name for name in wanted if after.get(name) != selection]
    if missed:
        module.fail_json(msg=f"dpkg did not set {selection} on {', '.join(missed)}", waited=waited)
    module.exit_json(changed=True, changed_packages=wanted, waited=waited)


if __name__ == "__main__":
    main()
