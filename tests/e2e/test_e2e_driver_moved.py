"""A driver moved out of band: after provisioning, an admin lifts the holds and installs a newer
user space of the branch by hand; Canonical's precompiled modules depend on exactly the driver they
were built for, so apt removes the kernel's modules and the kernel has no nvidia.ko. The rerun of
provision.yml says so in one line and brings the node back to its pins, or, where the archive no
longer has the pinned build, stops in one line saying what to do.

Two Debian 12 roots playing Ubuntu nodes, each with a source of its own next to the stand-in
repository (an -updates pocket): driver-moved, provisioned with the stand-in's 580 build, whose
kernel's modules are built for it; driver-pin-gone, provisioned with the build its kernel's modules
were built for, which its source then drops for a newer one (as noble-updates did on 2026-12-04).
One inventory, only the phases that touch the driver: a first run, the admin's move, a check-mode
run, the rerun, and one more run of the restored node that must change nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from e2elib import aptrepo, runner

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1500)]

BRANCH = "580"
PINNED = aptrepo.DRIVER_VERSIONS[BRANCH]  # the stand-in's build: driver-moved's pin
GONE = aptrepo.MODULES_DRIVER_2026_12_04  # driver-pin-gone's pin, later dropped by its source
NEWER = aptrepo.ARCHIVE_DRIVER_2026_12_04  # what the admin installs
KERNELS = {"driver-moved": "6.96.0-5-generic", "driver-pin-gone": "6.95.0-6-generic"}
UPDATES = "srv/driver-updates"  # each root's own source, inside the root
USER_SPACE = tuple(package.name for package in aptrepo.canonical_user_space(BRANCH, NEWER))
TAGS = "preflight,nvidia_driver"
# A binary package only the newer build has (modelled: a source package that gains a binary in a
# point release), pinned to it exactly: no pin to go back to, so apt has to remove it.
NEWER_ONLY = aptrepo.Package(
    f"libnvidia-newer-only-{BRANCH}-server",
    f"{NEWER}-0ubuntu1",
    depends=[f"nvidia-kernel-common-{BRANCH}-server (= {NEWER}-0ubuntu1)"],
)


def modules(host: str) -> str:
    return f"linux-modules-nvidia-{BRANCH}-server-open-{KERNELS[host]}"


def nvidia_ko(root: Path, host: str) -> Path:
    return root / f"lib/modules/{KERNELS[host]}/kernel/nvidia-{BRANCH}srv-open/nvidia.ko"


def installed(root: Path) -> dict[str, str]:
    """package -> "version selection" of the NVIDIA packages dpkg has installed."""
    out = runner.in_root(
        root, "dpkg-query", "--show", "--showformat=${db:Status-Abbrev}|${Package}|${Version}\\n"
    ).stdout
    return {
        name: f"{version} {'hold' if status.startswith('h') else 'install'}"
        for status, name, version in (line.split("|") for line in out.splitlines())
        if status[1:2] == "i" and "nvidia" in name
    }


def snapshot(root: Path, host: str) -> dict[str, str]:
    """installed(), and whether the kernel has its nvidia.ko."""
    return {**installed(root), "nvidia.ko": "present" if nvidia_ko(root, host).exists() else "missing"}


def said(host: str, moved_to: str, pin: str) -> str:
    return (
        f"driver moved out of band on {host}: user space {moved_to} (pinned {pin}), no {modules(host)}, "
        f"the kernel {KERNELS[host]} has no nvidia.ko, the driver packages are not held"
    )


def admin_moves_the_driver(root: Path, *extra: str) -> None:
    """What the admin did by hand: lift the holds, read the updated source, install the newer
    user space (apt removes the kernel's modules, which depend on the old build)."""
    held = [name for name in runner.in_root(root, "apt-mark", "showhold").stdout.split() if "nvidia" in name]
    runner.in_root(root, "apt-mark", "unhold", *held)
    runner.in_root(
        root,
        "apt-get",
        "update",
        "-q",
        "-o",
        "Dir::Etc::sourcelist=sources.list.d/driver-updates.list",
        "-o",
        "Dir::Etc::sourceparts=-",
        "-o",
        "APT::Get::List-Cleanup=0",
    )
    runner.in_root(root, "apt-get", "install", "-y", "-q", *USER_SPACE, *extra)


@dataclass
class Moved:
    roots: dict[str, Path]
    first: runner.Result
    provisioned: dict[str, dict[str, str]]  # what dpkg had after the first run
    moved: dict[str, dict[str, str]]  # what dpkg had after the admin's move
    check: runner.Result | None = None
    after_check: dict[str, dict[str, str]] | None = None
    rerun: runner.Result | None = None
    again: runner.Result | None = None


@pytest.fixture(scope="module")
def moved(
    make_host, debian12_tarball, base_vars, stand_in_repo, chroot_wrapper, ansible_home, workdir
) -> Moved:
    roots = {name: make_host(name, debian12_tarball) for name in KERNELS}

    def publish(host: str, packages: list[aptrepo.Package]) -> None:
        aptrepo.publish_flat(roots[host] / UPDATES, packages, workdir / "build-driver-updates" / host)

    # driver-moved: modules for its kernel built for the stand-in's build. driver-pin-gone: a
    # newer build than the stand-in's, and its kernel's modules built for that one.
    publish("driver-moved", [aptrepo.precompiled_modules(BRANCH, KERNELS["driver-moved"], PINNED)])
    publish(
        "driver-pin-gone",
        [
            *aptrepo.canonical_user_space(BRANCH, GONE),
            aptrepo.precompiled_modules(BRANCH, KERNELS["driver-pin-gone"], GONE),
        ],
    )
    for root in roots.values():
        (root / "etc/apt/sources.list.d/driver-updates.list").write_text(
            f"deb [trusted=yes] file:/{UPDATES} ./\n"
        )
    inventory = runner.write_inventory(
        workdir / "driver-moved.yml",
        roots,
        chroot_wrapper,
        # The roots' Debian lists are hours old: not refreshed from Debian's mirror here.
        {**base_vars, "preflight_apt_cache_valid_time": 86400},
        {host: {"nvidia_driver_kernel_release": kernel} for host, kernel in KERNELS.items()},
    )
    home = ansible_home("driver-moved")

    def run(*args: str) -> runner.Result:
        return runner.run_playbook("provision.yml", inventory, home, *args, forks=2)

    first = run("--tags", f"{TAGS},cuda_toolkit")
    provisioned = {host: snapshot(root, host) for host, root in roots.items()}
    if first.rc != 0:
        return Moved(roots, first, provisioned, {})
    # The source now lists the newer build; driver-pin-gone's drops the build its modules need.
    publish(
        "driver-moved",
        [
            aptrepo.precompiled_modules(BRANCH, KERNELS["driver-moved"], PINNED),
            *aptrepo.canonical_user_space(BRANCH, NEWER),
            NEWER_ONLY,
        ],
    )
    publish(
        "driver-pin-gone",
        [
            *aptrepo.canonical_user_space(BRANCH, NEWER),
            aptrepo.precompiled_modules(BRANCH, KERNELS["driver-pin-gone"], GONE),
        ],
    )
    admin_moves_the_driver(roots["driver-moved"], NEWER_ONLY.name)
    admin_moves_the_driver(roots["driver-pin-gone"])
    state = Moved(roots, first, provisioned, {host: snapshot(root, host) for host, root in roots.items()})
    state.check = run("--check", "--tags", TAGS, "-e", "provision_max_fail_percentage=100")
    state.after_check = {host: snapshot(root, host) for host, root in roots.items()}
    state.rerun = run("--tags", TAGS, "-e", "provision_max_fail_percentage=100")
    state.again = run("--tags", TAGS, "--limit", "driver-moved")
    print(
        f"\ndriver moved out of band, 2 hosts: first run {first.seconds:.0f}s, "
        f"check {state.check.seconds:.0f}s, rerun {state.rerun.seconds:.0f}s, "
        f"restored node again {state.again.seconds:.0f}s"
    )
    return state


def test_first_run_installs_and_holds_the_builds_the_modules_need(moved):
    assert moved.first.rc == 0, moved.first
    for host, pin in (("driver-moved", PINNED), ("driver-pin-gone", GONE)):
        packages = moved.provisioned[host]
        assert {name: packages.get(name) for name in USER_SPACE} == dict.fromkeys(
            USER_SPACE, f"{pin}-0ubuntu1 hold"
        ), packages
        assert packages.get(modules(host), "").endswith(" hold"), packages
        assert packages["nvidia.ko"] == "present", packages


def test_the_admins_move_removed_the_kernels_modules(moved):
    """The starting point of the issue: the newer user space, unheld, no modules, no nvidia.ko."""
    for host in KERNELS:
        packages = moved.moved[host]
        assert {name: packages.get(name) for name in USER_SPACE} == dict.fromkeys(
            USER_SPACE, f"{NEWER}-0ubuntu1 install"
        ), packages
        assert modules(host) not in packages and packages["nvidia.ko"] == "missing", packages
    assert moved.moved["driver-moved"].get(NEWER_ONLY.name) == f"{NEWER}-0ubuntu1 install"


def test_check_mode_says_what_moved_and_changes_nothing(moved):
    assert moved.check is not None, moved.first
    assert moved.after_check == moved.moved
    assert (
        f"{said('driver-moved', NEWER, PINNED)}: bringing the node back to the pins" in moved.check.output
    ), moved.check
    # What a real run would install, from the simulation.
    assert (
        "Check mode: a real run installs" in moved.check.output
        and modules("driver-moved") in moved.check.output
    )
    assert moved.check.failure("driver-moved") == "", moved.check
    assert moved.check.failure("driver-pin-gone").startswith(said("driver-pin-gone", NEWER, GONE)), (
        moved.check
    )


def test_rerun_says_it_once_and_brings_the_node_back_to_its_pins(moved):
    assert moved.rerun is not None, moved.first
    root = moved.roots["driver-moved"]
    assert moved.rerun.recap["driver-moved"]["failed"] == 0, (
        moved.rerun.failure("driver-moved") or moved.rerun
    )
    line = f"{said('driver-moved', NEWER, PINNED)}: bringing the node back to the pins"
    assert moved.rerun.output.count(line) == 1, moved.rerun
    packages = installed(root)
    assert {name: packages.get(name) for name in USER_SPACE} == dict.fromkeys(
        USER_SPACE, f"{PINNED}-0ubuntu1 hold"
    ), packages
    assert packages.get(modules("driver-moved"), "").endswith(" hold"), packages
    assert nvidia_ko(root, "driver-moved").exists()
    # Only the newer build had it: apt removed it with the move back.
    assert NEWER_ONLY.name not in packages, packages
    assert not [line for line in moved.rerun.output.splitlines() if "held broken packages" in line]


def test_the_restored_node_then_changes_nothing(moved):
    assert moved.again is not None, moved.first
    assert moved.again.rc == 0, moved.again
    assert moved.again.recap["driver-moved"]["changed"] == 0, moved.again.changed_tasks("driver-moved")


def test_a_pin_the_archive_no_longer_has_stops_in_one_line(moved):
    assert moved.rerun is not None, moved.first
    message = moved.rerun.failure("driver-pin-gone")
    assert message.startswith(said("driver-pin-gone", NEWER, GONE) + "; apt no longer offers "), moved.rerun
    assert f"at {GONE}, the driver {modules('driver-pin-gone')} is built for" in message
    assert all(name in message for name in USER_SPACE), message
    assert "nvidia_driver_module_source=dkms" in message and "\n" not in message.strip(), message
    # Stopped before the install: the node is as the admin left it.
    assert snapshot(moved.roots["driver-pin-gone"], "driver-pin-gone") == moved.moved["driver-pin-gone"]
