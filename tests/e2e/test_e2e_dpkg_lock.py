"""The hold tasks wait for dpkg's lock as the apt tasks do.

`dpkg --set-selections` (what ansible.builtin.dpkg_selections runs) takes dpkg's frontend lock
and gives up at once when another apt/dpkg run holds it: unattended-upgrades starting between a
role's install and its hold stopped the play with the packages installed and unheld. Every
dpkg_selections task of the roles now retries while the failure is the lock, for as long as the
apt tasks wait (preflight_apt_lock_timeout). Here the real NCCL hold task, read from the role,
runs with real dpkg in a real Debian 12 root while a process in that root holds the lock.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import yaml
from e2elib import rootfs, runner

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

ROLES = runner.REPO / "playbooks" / "roles"
SELECTION_TASKS = [
    (path, task)
    for path in sorted(ROLES.glob("*/tasks/*.yml"))
    for task in (yaml.safe_load(path.read_text()) or [])
    if "ansible.builtin.dpkg_selections" in task
]


def _id(item: tuple[Path, dict]) -> str:
    path, task = item
    return f"{path.relative_to(ROLES)}:{task['name']}"


@pytest.mark.parametrize("item", SELECTION_TASKS, ids=[_id(i) for i in SELECTION_TASKS])
def test_every_selection_task_retries_while_dpkg_is_locked(item) -> None:
    _, task = item
    register = task.get("register")
    assert register, "no register: the retry cannot see the result"
    until = " ".join(task.get("until", "").split())
    assert until.startswith(f"{register} is not failed or ('lock' not in"), task
    assert f"and {register}.rc | default(0) != 32)" in until, task  # dpkg gone before its input
    assert "preflight_apt_lock_timeout" in str(task.get("retries")), task
    assert task.get("delay") == 5


def test_the_tasks_were_found() -> None:
    assert len(SELECTION_TASKS) >= 10, [_id(i) for i in SELECTION_TASKS]


def _hold_play(path: Path, lock_timeout: int) -> Path:
    hold = next(t for p, t in SELECTION_TASKS if p.parts[-3] == "nccl" and t["name"] == "Hold NCCL")
    play = [{
        "name": "The NCCL role's hold task",
        "hosts": "gpu_nodes",
        "gather_facts": False,
        "vars": {"nccl_hold": True, "_nccl_pending": False, "nccl_packages": ["base-files"],
                 "preflight_apt_lock_timeout": lock_timeout},
        "tasks": [hold],
    }]
    path.write_text(yaml.safe_dump(play, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def root(debian12_tarball, workdir) -> Path:
    return rootfs.unpack(debian12_tarball, workdir / "hosts" / "dpkg-lock")


def _selection(root: Path, package: str) -> str:
    status = runner.in_root(root, "dpkg", "--get-selections", package)
    return status.stdout.split()[-1] if status.stdout.split() else ""


def _hold_under_lock(root: Path, workdir: Path, wrapper: Path, home: Path, lock_timeout: int,
                     release_after: float | None) -> runner.Result:
    """The hold task run while a process in the root holds dpkg's lock, released after
    release_after seconds (None: held until the run ends)."""
    name = f"hold-{lock_timeout}"
    inventory = runner.write_inventory(workdir / f"{name}.yml", {"locked": root}, wrapper, {})
    holder = runner.hold_dpkg_lock(root)
    release = threading.Timer(release_after, holder.kill) if release_after is not None else None
    if release:
        release.start()
    try:
        play = _hold_play(workdir / f"{name}-play.yml", lock_timeout)
        return runner.run_playbook(str(play), inventory, home)
    finally:
        if release:
            release.cancel()
        holder.kill()
        holder.wait()


def test_a_hold_waits_for_a_lock_that_is_released(root, workdir, chroot_wrapper, ansible_home) -> None:
    result = _hold_under_lock(root, workdir, chroot_wrapper, ansible_home("dpkg-lock"), 60, release_after=10)
    assert result.rc == 0, result.output[-3000:]
    assert "FAILED - RETRYING: [locked]: Hold NCCL" in result.output, result.output[-3000:]
    assert _selection(root, "base-files") == "hold"
    runner.in_root(root, "sh", "-c", "echo base-files install | dpkg --set-selections")


def test_a_lock_held_past_the_timeout_fails_naming_it(root, workdir, chroot_wrapper, ansible_home) -> None:
    result = _hold_under_lock(root, workdir, chroot_wrapper, ansible_home("dpkg-lock"), 5, release_after=None)
    assert result.rc == 2, result.output[-3000:]
    assert "FAILED - RETRYING: [locked]: Hold NCCL" in result.output, result.output[-3000:]
    # A looped task prints its failure per item: dpkg's lock message, or, on a loaded machine,
    # the broken pipe of a dpkg that found the lock taken and exited before reading its input.
    assert "failed: [locked] (item=base-files)" in result.output, result.output[-3000:]
    assert ("frontend lock was locked by another process" in result.output
            or "Broken pipe" in result.output), result.output[-3000:]
    assert _selection(root, "base-files") == "install"
