"""Hosts that must not be provisioned fail early, each with a message a person can act on.

All fault hosts share one inventory and one run (a fork each), each failing at its own step; a
separate run checks that a failed host stops a rolling run before the next batch.
"""

from __future__ import annotations

import hashlib
import re

import pytest
from e2elib import aptrepo, rootfs, runner

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

LOCK_TIMEOUT = 5
UNREACHABLE_SOURCE = "http://127.0.0.1:9/offline"  # the discard port: nothing listens there
MIRROR_GAP_DIR = "srv/mirror-gap"  # the node's mirror of Ubuntu's archive, inside its root
MIRROR_GAP_KERNEL = "6.94.0-7-generic"
MIRROR_GAP_FILE = "nvidia-kernel-common-580-server"
EXAMPLE_CHECKSUM = re.search(
    r"^cuda_toolkit_repo_key_checksum=(\S+)$", (runner.REPO / "inventory.example").read_text(), re.M
).group(1)


@pytest.fixture(scope="module")
def faults(make_host, debian12_tarball, base_vars, stand_in_repo, chroot_wrapper, ansible_home, workdir):
    names = (
        "bad-checksum",
        "wrong-key",
        "unsupported-os",
        "apt-locked",
        "secure-boot",
        "example-checksum",
        "debian-gpu",
        "gh200-proprietary",
        "dpkg-interrupted",
        "secure-boot-dkms",
        "unreachable-source",
        "modules-gap",
        "modules-gap-auto",
        "mirror-gap",
    )
    roots = {name: make_host(name, debian12_tarball) for name in names}
    rootfs.pretend_os(roots["unsupported-os"], "ubuntu", "Ubuntu", "20.04", "focal")
    runner.fake_pci_device(roots["secure-boot"], "0000:3b:00.0", "2330", "0x030200")
    runner.fake_secure_boot(roots["secure-boot"], enabled=True)
    runner.fake_pci_device(roots["secure-boot-dkms"], "0000:3b:00.0", "2330", "0x030200")
    runner.fake_secure_boot(roots["secure-boot-dkms"], enabled=True)
    runner.fake_pci_device(roots["debian-gpu"], "0000:3b:00.0", "2330", "0x030200")
    runner.fake_pci_device(roots["gh200-proprietary"], "0000:01:00.0", "2342", "0x030200")
    # What a dpkg run killed while unpacking leaves: its unfinished status entry.
    (roots["dpkg-interrupted"] / "var/lib/dpkg/updates/0001").write_text(
        "Package: curl\nStatus: install ok half-installed\n"
    )
    # An air-gapped site's mirror set up, one source left pointing at a host that does not answer.
    (roots["unreachable-source"] / "etc/apt/sources.list.d/offline-mirror.list").write_text(
        f"deb [trusted=yes] {UNREACHABLE_SOURCE} ./\n"
    )
    # A mirror that lists a file it does not serve (a lagging mirror; Ubuntu's archive copy here for
    # jammy's nvidia-kernel-common-580-server 580.196.07): the driver and its modules listed, one
    # file of them gone from the pool. apt read the index before the run, as on a node in service.
    mirror = roots["mirror-gap"] / MIRROR_GAP_DIR
    aptrepo.publish_flat(
        mirror,
        [
            *aptrepo.canonical_user_space("580", aptrepo.ARCHIVE_DRIVER_2026_12_04),
            aptrepo.precompiled_modules("580", MIRROR_GAP_KERNEL, aptrepo.ARCHIVE_DRIVER_2026_12_04),
        ],
        workdir / "build-mirror-gap",
    )
    (missing,) = mirror.glob(f"{MIRROR_GAP_FILE}_*.deb")
    missing.unlink()
    (roots["mirror-gap"] / "etc/apt/sources.list.d/mirror-gap.list").write_text(
        f"deb [trusted=yes] file:/{MIRROR_GAP_DIR} ./\n"
    )
    runner.in_root(
        roots["mirror-gap"], "apt-get", "update", "-q",
        "-o", "Dir::Etc::sourcelist=sources.list.d/mirror-gap.list",
        "-o", "Dir::Etc::sourceparts=-", "-o", "APT::Get::List-Cleanup=0",
    )
    host_vars = {
        "mirror-gap": {"nvidia_driver_kernel_release": MIRROR_GAP_KERNEL},
        "bad-checksum": {
            "cuda_toolkit_repo_key_checksum": "sha256:" + hashlib.sha256(b"another file").hexdigest()
        },
        # A key that passes its (correct) checksum but is not the one the repository is signed with.
        "wrong-key": {
            "cuda_toolkit_repo_key_url": stand_in_repo.wrong_key_path,
            "cuda_toolkit_repo_key_checksum": stand_in_repo.wrong_key_checksum,
        },
        "apt-locked": {"preflight_apt_lock_timeout": LOCK_TIMEOUT},
        # Lists refreshed whatever their age, so that the unreachable source is read.
        "unreachable-source": {"preflight_apt_cache_valid_time": 0},
        # A kernel Canonical ships no precompiled NVIDIA modules for: DKMS would be needed.
        "secure-boot": {"nvidia_driver_kernel_release": "6.99.0-1-generic"},
        # Precompiled modules asked for on a kernel whose modules are built for an older driver
        # than the archive serves (Ubuntu's archive on 2026-12-04): stopped before any change.
        "modules-gap": {"nvidia_driver_kernel_release": aptrepo.MODULES_GAP_KERNEL,
                        "nvidia_driver_module_source": "precompiled"},
        # The same kernel with the default source: DKMS, said with the reason (the stand-in archive
        # has no linux-headers for this kernel, so the DKMS install then fails: the fault here).
        "modules-gap-auto": {"nvidia_driver_kernel_release": aptrepo.MODULES_GAP_KERNEL},
        # DKMS asked for: known before NVIDIA's repository is read, so the stop comes before any change.
        "secure-boot-dkms": {"nvidia_driver_module_source": "dkms"},
        # inventory.example's placeholder, copied without being replaced.
        "example-checksum": {"cuda_toolkit_repo_key_checksum": EXAMPLE_CHECKSUM},
        # The default: Debian is no GPU distribution (base_vars lets the other roots play Ubuntu).
        "debian-gpu": {"preflight_gpu_distributions": ["Ubuntu"]},
        # Grace Hopper needs the open modules; asking for the proprietary ones must stop early.
        "gh200-proprietary": {"nvidia_driver_kernel_modules": "proprietary"},
    }
    inventory = runner.write_inventory(workdir / "faults.yml", roots, chroot_wrapper, base_vars, host_vars)
    holder = runner.hold_dpkg_lock(roots["apt-locked"])
    try:
        # Each fault host must reach its own failure: without this the first failure stops the rest
        # (max_fail_percentage 0, the rolling default, tested below).
        result = runner.run_playbook(
            "provision.yml",
            inventory,
            ansible_home("faults"),
            "-e",
            "provision_max_fail_percentage=100",
            forks=len(names),
        )
    finally:
        holder.kill()
        holder.wait()
    return roots, result


def test_every_fault_host_fails(faults):
    roots, result = faults
    assert result.rc == 2, result
    assert {host: result.recap[host]["failed"] for host in roots} == dict.fromkeys(roots, 1), result


def test_wrong_key_checksum_stops_before_trusting_the_key(faults):
    roots, result = faults
    message = result.failure("bad-checksum")
    assert "Could not install the CUDA repository key" in message and "did not match" in message, result
    assert "do not trust it" in message
    assert not (roots["bad-checksum"] / "etc/apt/keyrings/nvidia-cuda.asc").exists()


def test_repository_signed_by_another_key_is_refused(faults):
    roots, result = faults
    message = result.failure("wrong-key")
    assert "apt could not read the CUDA repository" in message, result
    assert "NO_PUBKEY" in message or "not signed" in message, message
    assert not (roots["wrong-key"] / "usr/local/cuda-12.8").exists()


def test_unsupported_os_fails_preflight(faults):
    roots, result = faults
    message = result.failure("unsupported-os")
    refusal = "unsupported-os runs Ubuntu 20.04; these roles support Ubuntu 22.04/24.04/26.04, Debian 12"
    assert refusal in message, result
    assert not (roots["unsupported-os"] / "etc/apt/sources.list.d/nvidia-cuda.list").exists()


def test_held_apt_lock_is_waited_for_then_named(faults):
    _, result = faults
    message = result.failure("apt-locked")
    assert (
        f"apt/dpkg is still locked after {LOCK_TIMEOUT} s: /var/lib/dpkg/lock-frontend held by" in message
    ), result
    assert "unattended-upgrades" in message and "preflight_apt_lock_timeout" in message
    assert result.seconds >= LOCK_TIMEOUT


def test_an_unreachable_apt_source_is_named_in_one_line(faults):
    roots, result = faults
    message = result.failure("unreachable-source")
    assert message.startswith(
        f"apt could not refresh its package lists on unreachable-source: {UNREACHABLE_SOURCE}/./InRelease ("
    ), result
    assert "Could not connect to 127.0.0.1:9" in message and "Fix or remove that source" in message, message
    assert "\n" not in message.strip(), message
    # It stopped in the checks before any change.
    assert not (roots["unreachable-source"] / "etc/apt/sources.list.d/nvidia-cuda.list").exists()


def test_secure_boot_without_signed_modules_stops_with_mok_steps(faults):
    roots, result = faults
    message = result.failure("secure-boot")
    assert "Secure Boot is enabled on secure-boot" in message, result
    assert "linux-modules-nvidia-580-server-open-6.99.0-1-generic" in message
    assert "update-secureboot-policy --enroll-key" in message and "nvidia_driver_mok_enrolled=true" in message
    status = runner.in_root(
        roots["secure-boot"], "dpkg-query", "--show", "--showformat=${Package}\\n", check=False
    ).stdout.split()
    assert not [p for p in status if p.startswith(("nvidia-", "linux-modules-nvidia"))]


def test_secure_boot_with_dkms_stops_before_any_change(faults):
    roots, result = faults
    message = result.failure("secure-boot-dkms")
    assert "Secure Boot is enabled on secure-boot-dkms" in message, result
    assert untouched(roots["secure-boot-dkms"])
    assert not (roots["secure-boot-dkms"] / "etc/apt/keyrings/nvidia-cuda.asc").exists()


def untouched(root) -> bool:
    """Nothing of the provisioning landed: no CUDA source, no NVIDIA package."""
    query = runner.in_root(root, "dpkg-query", "--show", "--showformat=${Package}\\n", check=False)
    packages = query.stdout.split()
    return not (root / "etc/apt/sources.list.d/nvidia-cuda.list").exists() and not [
        p for p in packages if p.startswith(("nvidia-", "cuda-", "linux-modules-nvidia"))
    ]


def test_example_checksum_is_refused_before_any_change(faults):
    roots, result = faults
    assert EXAMPLE_CHECKSUM.startswith("sha256:0000")
    message = result.failure("example-checksum")
    assert "is the all-zero placeholder from inventory.example" in message, result
    assert untouched(roots["example-checksum"])


def test_debian_gpu_node_is_refused_up_front(faults):
    roots, result = faults
    message = result.failure("debian-gpu")
    assert "debian-gpu runs Debian 12" in message and "GPU-less images only" in message, result
    assert "1 NVIDIA GPU(s) on its PCI bus" in message
    assert untouched(roots["debian-gpu"])


def test_precompiled_modules_built_for_another_driver_stop_before_the_driver(faults):
    """apt would answer "held broken packages" for the pair; the stop names both versions and
    comes before any driver package. (These Debian roots list the driver only once the stand-in
    repository is added, so the stop is the second one, after apt reads it; on Ubuntu the
    archive lists both before any change and the early stop in source.yml answers.)"""
    roots, result = faults
    message = result.failure("modules-gap")
    old, new = aptrepo.OLDER_FABRIC_MANAGER["580"], aptrepo.DRIVER_VERSIONS["580"]
    assert (f"linux-modules-nvidia-580-server-open-{aptrepo.MODULES_GAP_KERNEL} for kernel "
            f"{aptrepo.MODULES_GAP_KERNEL} is built for driver {old}, but the driver apt installs "
            f"is {new}") in message, result
    assert "nvidia_driver_module_source=dkms" in message
    status = runner.in_root(
        roots["modules-gap"], "dpkg-query", "--show", "--showformat=${Package}\\n", check=False
    ).stdout.split()
    assert not [p for p in status if p.startswith(("nvidia-", "linux-modules-nvidia"))], status


def test_precompiled_modules_built_for_another_driver_fall_back_to_dkms_saying_why(faults):
    _roots, result = faults
    old, new = aptrepo.OLDER_FABRIC_MANAGER["580"], aptrepo.DRIVER_VERSIONS["580"]
    said = (f"nvidia_driver_module_source=auto: Canonical's linux-modules-nvidia-580-server-open-"
            f"{aptrepo.MODULES_GAP_KERNEL} for kernel {aptrepo.MODULES_GAP_KERNEL} is built for driver "
            f"{old}, not {new} (modules for a new driver follow it by some days), so modules-gap-auto "
            "falls back to DKMS")
    assert said in result.output, result
    assert f"linux-headers-{aptrepo.MODULES_GAP_KERNEL}" in result.failure("modules-gap-auto"), result


def test_gh200_with_proprietary_modules_is_refused(faults):
    roots, result = faults
    message = result.failure("gh200-proprietary")
    assert "nvidia_driver_kernel_modules=proprietary cannot drive" in message and "GH200" in message, result
    assert untouched(roots["gh200-proprietary"])


def test_interrupted_dpkg_stops_in_preflight_with_one_line(faults):
    roots, result = faults
    message = result.failure("dpkg-interrupted")
    assert message == (
        "dpkg was interrupted on dpkg-interrupted (1 unfinished entry in /var/lib/dpkg/updates): run "
        "sudo dpkg --configure -a there, then run again."
    ), result
    assert untouched(roots["dpkg-interrupted"])


def test_a_mirror_that_lists_a_file_it_does_not_serve_stops_before_any_change(faults):
    roots, result = faults
    message = result.failure("mirror-gap")
    version = aptrepo.ARCHIVE_DRIVER_2026_12_04
    assert message.startswith("mirror-gap: apt lists driver packages its sources do not serve"), result
    missing = f"file:/{MIRROR_GAP_DIR}/./{MIRROR_GAP_FILE}_{version}-0ubuntu1_amd64.deb (File not found"
    assert missing in message, message
    assert "nothing was changed" in message and "\n" not in message.strip(), message
    # Stopped in the first play: no CUDA key or source, no NVIDIA package, no scratch left behind.
    assert untouched(roots["mirror-gap"])
    assert not (roots["mirror-gap"] / "etc/apt/keyrings/nvidia-cuda.asc").exists()
    assert not list((roots["mirror-gap"] / "var/cache/apt").glob("nodecert-fetch.*"))


def test_failed_host_stops_the_rollout_before_the_next_batch(
    make_host, debian12_tarball, base_vars, chroot_wrapper, ansible_home, workdir
):
    """provision_serial=2 over three hosts: the first batch's bad host fails in the middle of the
    play (its key checksum is wrong), which stops its batch partner after that task and the third
    host, in the next batch, is never changed (max_fail_percentage: 0; Ansible alone would go on
    while one host of the batch survives)."""
    names = ("roll-bad", "roll-good", "roll-next")
    roots = {name: make_host(name, debian12_tarball) for name in names}
    inventory = runner.write_inventory(
        workdir / "rolling.yml",
        roots,
        chroot_wrapper,
        base_vars,
        {"roll-bad": {"cuda_toolkit_repo_key_checksum": "sha256:" + hashlib.sha256(b"other").hexdigest()}},
    )
    result = runner.run_playbook(
        "provision.yml",
        inventory,
        ansible_home("rolling"),
        "-e",
        "provision_serial=2",
        "--tags",
        "preflight,cuda_toolkit",
    )
    assert result.rc != 0, result
    assert "Could not install the CUDA repository key" in result.failure("roll-bad"), result
    # The batch stops after the task the bad host failed in: its partner got the key (that task)
    # but no source entry (the next one); the host of the next batch is not touched at all.
    assert (roots["roll-good"] / "etc/apt/keyrings/nvidia-cuda.asc").exists(), result
    assert not (roots["roll-good"] / "etc/apt/sources.list.d/nvidia-cuda.list").exists(), result
    assert untouched(roots["roll-next"])
    assert not (roots["roll-next"] / "etc/apt/keyrings/nvidia-cuda.asc").exists()
    assert "NO MORE HOSTS LEFT" in result.output, result
