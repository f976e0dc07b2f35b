"""The hold tasks wait for dpkg's lock as the apt tasks do.

`dpkg --set-selections` takes dpkg's frontend lock and gives up at once when another apt/dpkg run
holds it: unattended-upgrades starting between a role's install and its hold stopped the play with
the packages installed and unheld. Every role now holds and releases packages through one module,
preflight's nodecert_dpkg_selections, which waits for the lock itself, as long as the apt tasks wait
(preflight_apt_lock_timeout), and fails with one line naming the lock and its holder. Here the real
NCCL hold task, read from the role, runs that module with real dpkg in a real Debian 12 root while a
process in that root holds the lock. (tests/e2e/test_role_rules.py keeps every other way of setting
selections out of the playbooks.)
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import yaml
from e2elib import rootfs, runner

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

ROLES = runner.REPO / "playbooks" / "roles"
PREFLIGHT = ROLES / "preflight"
MODULE = "nodecert_dpkg_selections"
SELECTION_TASKS = [
    (path, task)
    for path in sorted(ROLES.glob("*/tasks/*.yml"))
    for task in (yaml.safe_load(path.read_text()) or [])
    if MODULE in task
]


def _id(item: tuple[Path, dict]) -> str:
    path, task = item
    return f"{path.relative_to(ROLES)}:{task['name']}"


@pytest.mark.parametrize("item", SELECTION_TASKS, ids=[_id(i) for i in SELECTION_TASKS])
def test_every_selection_task_waits_as_long_as_the_apt_tasks(item) -> None:
    _, task = item
    arguments = task[MODULE]
    assert arguments["lock_timeout"] == "{{ preflight_apt_lock_timeout }}", task
    assert arguments["selection"] in ("hold", "install"), task
    # One module call with the whole list: no loop, no retry of its own around it.
    assert not {"loop", "with_items", "until", "retries"} & set(task), task


def test_the_tasks_were_found() -> None:
    # 11: the holds of nvidia_driver (4), fabric_manager (2), cuda_toolkit, nccl, dcgm, imex and
    # container_toolkit.
    assert len(SELECTION_TASKS) >= 11, [_id(i) for i in SELECTION_TASKS]


def _hold_play(workdir: Path, name: str, lock_timeout: int, packages: list[str]) -> Path:
    """The NCCL role's hold task, as the role has it, in a play beside preflight's library and
    module_utils (what a role depending on preflight sees)."""
    hold = next(t for p, t in SELECTION_TASKS if p.parts[-3] == "nccl" and t["name"] == "Hold NCCL")
    play_dir = workdir / "dpkg-lock-plays"
    play_dir.mkdir(exist_ok=True)
    for plugins in ("library", "module_utils"):
        if not (play_dir / plugins).exists():
            (play_dir / plugins).symlink_to(PREFLIGHT / plugins)
    play = [{
        "name": "The NCCL role's hold task",
        "hosts": "gpu_nodes",
        "gather_facts": False,
        "vars": {"nccl_hold": True, "_nccl_pending": False, "nccl_packages": packages,
                 "preflight_apt_lock_timeout": lock_timeout},
        "tasks": [
            {**hold, "register": "_hold"},
            {"name": "Say how long the hold waited", "ansible.builtin.debug": {
                "msg": "waited {{ _hold.waited }} s, set {{ _hold.changed_packages }}"}},
        ],
    }]
    path = play_dir / f"{name}.yml"
    path.write_text(yaml.safe_dump(play, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def root(debian12_tarball, workdir) -> Path:
    return rootfs.unpack(debian12_tarball, workdir / "hosts" / "dpkg-lock")


def _selection(root: Path, package: str) -> str:
    status = runner.in_root(root, "dpkg", "--get-selections", package)
    return status.stdout.split()[-1] if status.stdout.split() else ""


def _run(root: Path, workdir: Path, wrapper: Path, home: Path, name: str, lock_timeout: int,
         packages: list[str], *args: str, release_after: float | None = 0) -> runner.Result:
    """The hold task run while a process in the root holds dpkg's lock, released after
    release_after seconds (0: never taken; None: held until the run ends)."""
    inventory = runner.write_inventory(workdir / f"{name}.yml", {"locked": root}, wrapper, {})
    play = _hold_play(workdir, name, lock_timeout, packages)
    if release_after == 0:
        return runner.run_playbook(str(play), inventory, home, *args)
    holder = runner.hold_dpkg_lock(root)
    release = threading.Timer(release_after, holder.kill) if release_after is not None else None
    if release:
        release.start()
    try:
        return runner.run_playbook(str(play), inventory, home, *args)
    finally:
        if release:
            release.cancel()
        holder.kill()
        holder.wait()


def test_a_hold_waits_for_a_lock_that_is_released(root, workdir, chroot_wrapper, ansible_home) -> None:
    home = ansible_home("dpkg-lock")
    packages = ["base-files", "bash"]
    result = _run(root, workdir, chroot_wrapper, home, "released", 60, packages, release_after=8)
    assert result.rc == 0, result.output[-3000:]
    waited = float(result.output.split('"msg": "waited ', 1)[1].split(" s,", 1)[0])
    assert 5 <= waited < 60, result.output[-3000:]
    assert "set ['base-files', 'bash']" in result.output, result.output[-3000:]
    assert [_selection(root, p) for p in packages] == ["hold", "hold"]

    # Held already: nothing to set, nothing changed, no wait.
    again = _run(root, workdir, chroot_wrapper, home, "again", 60, packages)
    assert again.rc == 0 and again.recap["locked"]["changed"] == 0, again.output[-3000:]
    assert "waited 0.0 s, set []" in again.output, again.output[-3000:]
    for package in packages:
        runner.in_root(root, "sh", "-c", f"echo {package} install | dpkg --set-selections")


def test_check_mode_reports_and_changes_nothing(root, workdir, chroot_wrapper, ansible_home) -> None:
    # Check mode reads the selections only: it needs no lock, so a held lock does not stop it.
    result = _run(root, workdir, chroot_wrapper, ansible_home("dpkg-lock"), "check", 5, ["base-files"],
                  "--check", release_after=None)
    assert result.rc == 0, result.output[-3000:]
    assert result.recap["locked"]["changed"] == 1, result.output[-3000:]
    assert _selection(root, "base-files") == "install"


def test_a_lock_held_past_the_timeout_fails_naming_it(root, workdir, chroot_wrapper, ansible_home) -> None:
    result = _run(root, workdir, chroot_wrapper, ansible_home("dpkg-lock"), "held", 5, ["base-files"],
                  release_after=None)
    assert result.rc == 2, result.output[-3000:]
    message = result.failure("locked")
    assert "\n" not in message
    # The holder runs in a PID namespace of its own (the test's unshare): not visible by PID.
    assert message.startswith(
        "dpkg's lock is still held after 5 s: /var/lib/dpkg/lock-frontend held by a process in another "
        "PID namespace; could not hold base-files."
    ), message
    assert "preflight_apt_lock_timeout" in message
    assert _selection(root, "base-files") == "install"
