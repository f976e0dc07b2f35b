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
run, the rerun, and one more run of the restored node that must change nothing. Then the admin
moves driver-moved to another branch by hand (595 with its modules, 580 removed as the real
packages' conflicts remove it), and the next run says what it found and what it did.

Last, the kernel guard on the restored node under the real unattended-upgrade (Debian's, with the
driver source as its origin), each time after an `apt-get update` in which one source fails: a new
kernel ABI published before its modules (the guard's blacklist must keep it out of u-u, while an
unrelated update lands), then its modules published (the blacklist must let it in, with its
nvidia.ko, and the next unrelated update lands too). apt runs Post-Invoke-Success, which rewrites
the blacklist, unless every source failed: security updates keep flowing in both.
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


# The branch the admin moves driver-moved to by hand (resolute-updates carries 595-server).
# Modelled as aptrepo.other_branch_user_space has it: the two branches' utils conflict, the rest
# could stay side by side and only the role's purge removes them.
OTHER_BRANCH, OTHER_VERSION = "595", "595.71.05"


def other_branch() -> list[aptrepo.Package]:
    return [*aptrepo.other_branch_user_space(OTHER_BRANCH, OTHER_VERSION, BRANCH),
            aptrepo.precompiled_modules(OTHER_BRANCH, KERNELS["driver-moved"], OTHER_VERSION)]


OTHER_USER_SPACE = tuple(p.name for p in other_branch()[:-1])


def other_modules(host: str) -> str:
    return f"linux-modules-nvidia-{OTHER_BRANCH}-server-open-{KERNELS[host]}"


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


def admin_moves_the_driver(root: Path, *extra: str, user_space: tuple[str, ...] = USER_SPACE) -> None:
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
    runner.in_root(root, "apt-get", "install", "-y", "-q", *user_space, *extra)


# The kernel guard under unattended-upgrades: driver-moved's kernel, a new ABI of it, the flavour's
# meta packages (kernel and Canonical's modules, as linux-image-virtual and
# linux-modules-nvidia-580-server-open-generic follow each other) and an unrelated update.
NEW_KERNEL = "6.96.0-6-generic"
UNREACHABLE = "http://127.0.0.1:9/offline"  # the discard port: the source that fails
GUARD_BLACKLIST = "etc/apt/apt.conf.d/51nodecert-kernels-without-nvidia-modules"
UNRELATED = "e2e-unrelated-fix"


@dataclass
class Guarded:
    blacklist: str  # the guard's u-u blacklist after the failing update ('' when absent)
    rc: int  # unattended-upgrade's exit status
    output: str
    unrelated: str  # the unrelated package's installed version
    new_kernel: bool  # linux-image-<NEW_KERNEL> installed
    new_nvidia_ko: bool


def kernel_packages(kernel: str, new_modules: bool, unrelated: str) -> list[aptrepo.Package]:
    """What the driver source lists: the flavour's kernel meta package pointing at `kernel`, the
    modules' meta package at the newest kernel that has modules (`kernel` once new_modules), and
    the unrelated package at this version."""
    old = KERNELS["driver-moved"]
    with_modules = kernel if new_modules else old

    def version(release: str) -> str:
        return release.removesuffix("-generic").replace("-", ".")

    return [
        aptrepo.precompiled_modules(BRANCH, old, PINNED),
        *([aptrepo.precompiled_modules(BRANCH, kernel, PINNED)] if with_modules != old else []),
        *(aptrepo.Package(f"linux-image-{release}", version(release)) for release in sorted({old, kernel})),
        aptrepo.Package("linux-image-virtual", version(kernel), depends=[f"linux-image-{kernel}"]),
        aptrepo.Package(
            f"linux-modules-nvidia-{BRANCH}-server-open-generic",
            version(with_modules),
            depends=[f"linux-modules-nvidia-{BRANCH}-server-open-{with_modules}"],
        ),
        aptrepo.Package(UNRELATED, unrelated),
    ]


def unattended_upgrade_after_a_failing_update(root: Path) -> Guarded:
    update = runner.in_root(root, "apt-get", "update", "-q", check=False)
    assert "Failed to fetch " + UNREACHABLE in update.stdout + update.stderr, update
    blacklist = root / GUARD_BLACKLIST
    uu = runner.in_root(root, "unattended-upgrade", "-v", check=False, timeout=300)
    version = runner.in_root(root, "dpkg-query", "--show", "--showformat=${Version}", UNRELATED).stdout
    status = runner.in_root(
        root, "dpkg-query", "--show", "--showformat=${db:Status-Status}", f"linux-image-{NEW_KERNEL}",
        check=False,
    ).stdout
    ko = root / f"lib/modules/{NEW_KERNEL}/kernel/nvidia-{BRANCH}srv-open/nvidia.ko"
    return Guarded(
        blacklist.read_text() if blacklist.exists() else "", uu.returncode, uu.stdout + uu.stderr, version,
        status == "installed", ko.exists(),
    )


def guard_under_unattended_upgrades(root: Path, publish) -> dict[str, Guarded]:
    """The node takes its updates from the driver source with Debian's unattended-upgrades; one
    more source of it fails on every update from here on."""
    publish(kernel_packages(KERNELS["driver-moved"], False, "1.0"))
    runner.in_root(root, "apt-get", "update", "-q")
    runner.in_root(root, "apt-get", "install", "-y", "-q", "--no-install-recommends", "unattended-upgrades",
                   "linux-image-virtual", f"linux-modules-nvidia-{BRANCH}-server-open-generic", UNRELATED)
    (root / "etc/apt/apt.conf.d/52e2e-unattended-upgrades").write_text(
        'Unattended-Upgrade::Origins-Pattern { "origin=Driver updates stand-in"; };\n'
    )
    (root / "etc/apt/sources.list.d/failing-mirror.list").write_text(f"deb [trusted=yes] {UNREACHABLE} ./\n")
    # Canonical publishes the new kernel ABI (a security update) before the modules built for it.
    publish(kernel_packages(NEW_KERNEL, False, "1.1"))
    kernel_first = unattended_upgrade_after_a_failing_update(root)
    # Then the modules follow.
    publish(kernel_packages(NEW_KERNEL, True, "1.2"))
    return {"kernel first": kernel_first, "modules after": unattended_upgrade_after_a_failing_update(root)}


@dataclass
class Moved:
    roots: dict[str, Path]
    first: runner.Result
    provisioned: dict[str, dict[str, str]]  # what dpkg had after the first run
    moved: dict[str, dict[str, str]]  # what dpkg had after the admin's move
    check: runner.Result | None = None
    after_check: dict[str, dict[str, str]] | None = None
    rerun: runner.Result | None = None
    after_rerun: dict[str, str] | None = None
    again: runner.Result | None = None
    on_other_branch: dict[str, str] | None = None  # driver-moved after the admin's move to 595
    branch_rerun: runner.Result | None = None
    guard: dict[str, Guarded] | None = None  # "kernel first", "modules after": what u-u did


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
    state.after_rerun = snapshot(roots["driver-moved"], "driver-moved")  # before the move to 595
    state.again = run("--tags", TAGS, "--limit", "driver-moved")
    if state.again.rc == 0:
        # The source drops the newer 580 build and lists 595 with its modules for the kernel.
        publish(
            "driver-moved",
            [
                aptrepo.precompiled_modules(BRANCH, KERNELS["driver-moved"], PINNED),
                *other_branch(),
            ],
        )
        root = roots["driver-moved"]
        was = [name for name in installed(root) if f"-{BRANCH}-" in name or name.endswith(f"-{BRANCH}")]
        admin_moves_the_driver(
            root, other_modules("driver-moved"), *(f"{name}-" for name in was), user_space=OTHER_USER_SPACE
        )
        state.on_other_branch = snapshot(root, "driver-moved")
        state.branch_rerun = run("--tags", TAGS, "--limit", "driver-moved")
        if state.branch_rerun.rc == 0:
            state.guard = guard_under_unattended_upgrades(
                root, lambda packages: publish("driver-moved", packages)
            )
    print(
        f"\ndriver moved out of band, 2 hosts: first run {first.seconds:.0f}s, "
        f"check {state.check.seconds:.0f}s, rerun {state.rerun.seconds:.0f}s, "
        f"restored node again {state.again.seconds:.0f}s"
        + (f", rerun after a move to {OTHER_BRANCH} {state.branch_rerun.seconds:.0f}s"
           if state.branch_rerun else "")
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
    assert moved.rerun.recap["driver-moved"]["failed"] == 0, (
        moved.rerun.failure("driver-moved") or moved.rerun
    )
    line = f"{said('driver-moved', NEWER, PINNED)}: bringing the node back to the pins"
    assert moved.rerun.output.count(line) == 1, moved.rerun
    packages = moved.after_rerun
    assert {name: packages.get(name) for name in USER_SPACE} == dict.fromkeys(
        USER_SPACE, f"{PINNED}-0ubuntu1 hold"
    ), packages
    assert packages.get(modules("driver-moved"), "").endswith(" hold"), packages
    assert packages["nvidia.ko"] == "present", packages
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


def test_a_branch_moved_by_hand_is_said_and_replaced(moved):
    """595 installed by hand over 580 (580 removed): the next run says which branch and build it
    found and what it did, installs 580 at its pin with the kernel's modules, and purges 595."""
    assert moved.branch_rerun is not None, moved.again or moved.first
    before = moved.on_other_branch
    assert before[f"nvidia-utils-{OTHER_BRANCH}-server"] == f"{OTHER_VERSION}-0ubuntu1 install", before
    assert f"nvidia-utils-{BRANCH}-server" not in before and before["nvidia.ko"] == "missing", before
    rerun = moved.branch_rerun
    assert rerun.rc == 0, rerun.failure("driver-moved") or rerun
    purged = ", ".join(sorted([*OTHER_USER_SPACE, other_modules("driver-moved")]))
    line = (
        f"driver-moved had driver {OTHER_VERSION} (branch {OTHER_BRANCH}) installed, not the configured "
        f"branch {BRANCH}-server-open: installed nvidia-utils-{BRANCH}-server {PINNED}-0ubuntu1 "
        f"and purged {purged}."
    )
    assert rerun.output.count(line) == 1, rerun
    root = moved.roots["driver-moved"]
    packages = installed(root)
    assert {name: packages.get(name) for name in USER_SPACE} == dict.fromkeys(
        USER_SPACE, f"{PINNED}-0ubuntu1 hold"
    ), packages
    assert packages.get(modules("driver-moved"), "").endswith(" hold"), packages
    assert nvidia_ko(root, "driver-moved").exists()
    # Purged, not only removed: dpkg no longer knows them.
    status = runner.in_root(root, "dpkg-query", "--show", "--showformat=${Package}\\n").stdout.split()
    assert not [name for name in status if f"-{OTHER_BRANCH}-" in name], status


def test_a_kernel_before_its_modules_stays_out_of_unattended_upgrades_with_a_failing_source(moved):
    """The update that brought the new kernel ABI had a failing source: the guard's blacklist is
    still rewritten from the lists apt has (Post-Invoke-Success runs unless every source failed),
    so u-u leaves the kernel out (its step would be refused) and applies the unrelated update."""
    assert moved.guard is not None, moved.branch_rerun or moved.first
    said = moved.guard["kernel first"]
    assert f'"linux-image-{NEW_KERNEL}$";' in said.blacklist, said
    assert said.rc == 0 and "Installing the upgrades failed" not in said.output, said.output[-3000:]
    assert said.unrelated == "1.1" and not said.new_kernel, said


def test_modules_published_after_the_kernel_let_it_in_with_a_failing_source(moved):
    assert moved.guard is not None, moved.branch_rerun or moved.first
    said = moved.guard["modules after"]
    assert said.blacklist == "", said
    assert said.rc == 0 and "Installing the upgrades failed" not in said.output, said.output[-3000:]
    assert said.unrelated == "1.2" and said.new_kernel and said.new_nvidia_ko, said
