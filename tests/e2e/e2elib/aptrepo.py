"""A signed stand-in for NVIDIA's CUDA apt repository, served on 127.0.0.1.

Packages carry the real names the roles install (Ubuntu's -server driver packages, Canonical's
precompiled module packages, cuda-toolkit-X-Y, libnccl2, nvidia-fabricmanager-<branch>...) but
only stub files. Two kinds: what only NVIDIA's CUDA repository ships (cuda-keyring, cuda-toolkit-X-Y,
libnccl2/-dev, the unversioned nvidia-fabricmanager, nvidia-imex and libnvsdm from 580, nvlsm,
nvidia-driver-pinning-<branch>),
and stand-ins for Canonical's packages (Ubuntu's restricted/multiverse) served from the same URL
so that Debian 12 roots can play Ubuntu GPU nodes (those tests set preflight_gpu_distributions).
The layout is NVIDIA's flat one: <root>/compute/cuda/repos/<distro>/<arch>/,
with Packages, Release, InRelease and Release.gpg signed by a throwaway key made here.
"""

from __future__ import annotations

import hashlib
import http.server
import os
import shutil
import socket
import subprocess
import tempfile
import textwrap
import threading
import urllib.request
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

# NVIDIA's directory per release; ubuntu2604 is modelled on the published layout of the others.
DISTRIBUTIONS = ("debian12", "ubuntu2204", "ubuntu2404", "ubuntu2604")
REPO_PREFIX = "compute/cuda/repos"
KEY_NAME = "3bf863cc.pub"  # the file name NVIDIA serves its key under

DRIVER_VERSIONS = {"580": "580.95.05", "590": "590.44.01"}
OLDER_FABRIC_MANAGER = {"580": "580.82.07", "590": "590.40.02"}
CUDA_VERSION = "12.8"
CUDA_PATCH = "12.8.93"
NCCL_VERSION = "2.26.2-1"
NEWER_NCCL = ("2.27.3-1", "12.9")  # apt would take this one if the role did not pin
# A kernel "installed but not running" (its /boot/vmlinuz planted by a test): modules exist for it.
PENDING_KERNEL = "6.98.0-2-generic"
# A kernel whose precompiled NVIDIA modules were built for an older driver than the archive now
# serves: Canonical publishes linux-modules-nvidia-* after a driver update, and each pins the
# driver it was built for, as noble's did on 2026-12-04 ("Depends: ...,
# nvidia-kernel-common-580-server (<= 580.196.07-1), nvidia-kernel-common-580-server (>=
# 580.196.07)", the 6.8.0-151 build; kernels before it had modules for 580.178.04 only while
# the archive served 580.196.07). Modules of this kernel are built for OLDER_FABRIC_MANAGER's
# version of the branch.
MODULES_GAP_KERNEL = "6.97.0-3-generic"
# From branch 580 NVIDIA's repository names Fabric Manager nvidia-fabricmanager and only "provides"
# nvidia-fabricmanager-<branch> ("Package nvidia-fabricmanager-580 is a virtual package provided by:
# nvidia-fabricmanager 580.65.06-1", NVIDIA/gpu-driver-container#451). The stand-in has the
# versioned name (Ubuntu's, multiverse) for 580 and only NVIDIA's unversioned one for 590.
UNVERSIONED_FABRIC_MANAGER = ("590",)
# NVLink5 and NVL72 packages of NVIDIA's repository, names as NVIDIA's driver container installs
# them from it (gpu-driver-container ubuntu22.04/install.sh: "libnvsdm=${DRIVER_VERSION}-1" and
# "nvidia-imex=${DRIVER_VERSION}-1" from branch 580, "nvlsm infiniband-diags" unpinned; "libnvsdm
# packages are not available for arm64"). nvlsm has date versions of its own:
# nvlsm_2025.10.11-1_amd64.deb under ubuntu2204/x86_64/, nvlsm_2025.10.14-1_arm64.deb under sbsa
# (public AMI build notes and a GB200 image script quoting those file names). Their Depends are
# not modelled: no public control file of these packages was found.
NVLSM_VERSIONS = {"amd64": "2025.10.11-1", "arm64": "2025.10.14-1"}

# Driver branches under NVIDIA's own Ubuntu package names (before the 590 rename: nvidia-utils-570,
# libnvidia-compute-570, nvidia-dkms-570-open... the names Canonical's non-server packages have),
# as NVIDIA's CUDA repository ships them, for installs from that repository (the rollback path).
# Versions: 570.211.01 is the newest 570 ("nvidia-driver-pinning-570.211.01 - APT driver pinning file
# for driver version 570.211.01" in NVIDIA's repository listing), 580.126.09 a 580 build listed
# there too; NVIDIA's Ubuntu builds are versioned <version>-0ubuntu1 ("apt install
# nvidia-driver-570=570.124.06-0ubuntu1" from NVIDIA's ubuntu2404 driver repository).
# From 590 NVIDIA's repository drops the branch from the names (libnvidia-compute-580 ->
# libnvidia-compute, nvidia-dkms-580-open -> nvidia-dkms-open: NVIDIA Driver Installation Guide r590,
# "Recent Updates", table "Ubuntu 590 package renames", "renamed by removing the branch designation
# from the package name"); 590.48.01 is the 590 build Ubuntu's archive carries too
# (nvidia-kernel-common-590 590.48.01-0ubuntu0.24.04.4, noble).
NVIDIA_REPO_DRIVERS = {"570": "570.211.01", "580": "580.126.09", "590": "590.48.01"}
# nvidia-driver-pinning-<branch> ("APT driver pinning file for driver branch 570", versions such as
# 580-5 on debian12 and 610-2ubuntu1 on Ubuntu): one file, /etc/apt/preferences.d/nvidia-driver-pin,
# whose stanzas pin the branch's packages by source package and version at priority 1000
# ("Package: cuda-drivers* src:nvidia-open:any / Pin: version 595.71.05-* / Pin-Priority: 1000",
# NVIDIA's driver installation guide, "Version locking"). Every pinning package ships that same
# path, so the stand-ins conflict with each other (one branch pinned at a time).
PINNING_FILE = "etc/apt/preferences.d/nvidia-driver-pin"
# Ubuntu's archive turned the 570 packages into transitional ones that depend on 580, under a
# *570* version that sorts above NVIDIA's build of the same driver (noble-updates, restricted:
# "Package: nvidia-utils-570 / Version: 570.211.01-0ubuntu1.24.04.1 / Depends: nvidia-utils-580",
# likewise nvidia-headless-no-dkms-570-open and nvidia-dkms-570-open). NVIDIA's pinning package
# (version 570.*) matches them too. Served to the Debian roots from a second address, as the
# "Ubuntu archive" of the rollback test (ubuntu_archive_url).
UBUNTU_TRANSITIONAL_570 = {
    "nvidia-utils-570": "nvidia-utils-580",
    "nvidia-headless-no-dkms-570-open": "nvidia-headless-no-dkms-580-open",
    "nvidia-dkms-570-open": "nvidia-dkms-580-open",
}
UBUNTU_TRANSITIONAL_VERSION = "570.211.01-0ubuntu1.24.04.1"


@dataclass
class Package:
    name: str
    version: str
    depends: list[str] = field(default_factory=list)
    files: dict[str, tuple[str | bytes, int]] = field(default_factory=dict)  # path -> (content, mode)
    architecture: str = "amd64"
    provides: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)  # also written as Replaces
    source: str = ""
    from_nvidia: bool = False  # a package of NVIDIA's repository although Ubuntu has the name too
    # Further control fields written as given (Pre-Depends, Breaks, Replaces, Recommends...), for
    # packages whose real control file has them without the Provides that `conflicts` adds.
    control: dict[str, str] = field(default_factory=dict)


def _script(text: str) -> tuple[str, int]:
    return ("#!/bin/sh\n" + textwrap.dedent(text).lstrip(), 0o755)


def nvidia_repo_driver(branch: str, version: str, kernel_release: str) -> list[Package]:
    """One branch under NVIDIA's Ubuntu names, as its CUDA repository ships it (DKMS modules only:
    Canonical's signed precompiled modules are in Ubuntu's archive alone). Depends and the
    Provides/Conflicts/Replaces on the unversioned names follow Canonical's packaging, which NVIDIA's
    builds share (nvidia-utils-580 in noble-updates: "Provides: nvidia-smi, nvidia-utils /
    Conflicts: nvidia-smi, nvidia-utils / Replaces: nvidia-smi, nvidia-utils"; libnvidia-compute-580
    likewise for libnvidia-compute). Simplified: nvidia-dkms-* neither depends on dkms nor builds
    anything."""
    deb = f"{version}-0ubuntu1"
    exact = f"(= {deb})"
    unbranched = int(branch) >= 590
    b = "" if unbranched else f"-{branch}"  # the branch in a name, from 590 on none
    source = "nvidia-graphics-drivers" if unbranched else f"nvidia-graphics-drivers-{branch}"

    def package(name: str, conflicts: tuple[str, ...] = (), **kwargs) -> Package:
        # A versioned name conflicts with (and replaces) the unbranched one, as in Canonical's
        # packaging. An unbranched package is modelled as conflicting with (and replacing) the
        # versioned names of the earlier branches it takes over: an assumption, no published
        # control file of NVIDIA's 590 packages was found; without it apt keeps the installed
        # 580 package that Provides the name and refuses the move ("generated breaks").
        if unbranched:
            conflicts = tuple(f"{c}-{other}" for c in conflicts for other in NVIDIA_REPO_DRIVERS
                              if int(other) < int(branch))
        return Package(name, deb, source=source, from_nvidia=True, conflicts=list(conflicts), **kwargs)

    packages = [
        package(f"nvidia-kernel-common{b}"),
        package(
            f"libnvidia-compute{b}",
            depends=[f"nvidia-kernel-common{b} {exact}"],
            conflicts=("libnvidia-compute",),
            files={f"usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{version}": ("stand-in\n", 0o644)},
        ),
        package(
            f"nvidia-utils{b}",
            depends=[f"libnvidia-compute{b} {exact}"],
            conflicts=("nvidia-utils",),
            files={
                "usr/bin/nvidia-smi": _script(f"""
                    echo "NVIDIA-SMI stand-in   Driver Version: {version}"
                    exit 6
                """)
            },
        ),
        package(
            f"nvidia-compute-utils{b}",
            conflicts=("nvidia-compute-utils",),
            files={
                "lib/systemd/system/nvidia-persistenced.service": (
                    "[Service]\nType=forking\nExecStart=/usr/bin/nvidia-persistenced --user "
                    "nvidia-persistenced --no-persistence-mode --verbose\n",
                    0o644,
                ),
                "usr/bin/nvidia-persistenced": _script("exit 0\n"),
            },
        ),
        Package(
            f"nvidia-driver-pinning-{branch}",
            f"{branch}-1ubuntu1",
            architecture="all",
            from_nvidia=True,
            conflicts=["nvidia-driver-pinning"],
            files={
                PINNING_FILE: (
                    f"Package: src:{source}\nPin: version {branch}.*\nPin-Priority: 1000\n",
                    0o644,
                )
            },
        ),
    ]
    for suffix in ("", "-open"):
        packages += [
            package(
                f"nvidia-headless-no-dkms{b}{suffix}",
                depends=[
                    f"libnvidia-compute{b} {exact}",
                    f"nvidia-compute-utils{b} {exact}",
                    f"nvidia-kernel-common{b} {exact}",
                ],
            ),
            package(
                f"nvidia-dkms{b}{suffix}",
                depends=[f"nvidia-kernel-common{b} {exact}"],
                files={f"usr/src/nvidia-{version}/dkms.conf": (f'PACKAGE_VERSION="{version}"\n', 0o644)},
            ),
            package(
                f"nvidia-headless{b}{suffix}",
                depends=[
                    f"nvidia-headless-no-dkms{b}{suffix} {exact}",
                    f"nvidia-dkms{b}{suffix} {exact}",
                ],
            ),
        ]
    return packages


def ubuntu_transitional_570() -> list[Package]:
    """Ubuntu's transitional 570 packages (see UBUNTU_TRANSITIONAL_570)."""
    return [
        Package(
            name,
            UBUNTU_TRANSITIONAL_VERSION,
            depends=[target],
            source="nvidia-graphics-drivers-570",
        )
        for name, target in UBUNTU_TRANSITIONAL_570.items()
    ]


# DCGM 4 in NVIDIA's CUDA repository. Real (NVIDIA/DCGM, cmake/packaging.cmake and CMakeLists.txt
# at the "DCGM 4.6.0" commit 72fa3fe): the packages are datacenter-gpu-manager-4-core and one
# datacenter-gpu-manager-4-cuda<major> per CUDA major (11, 12, 13), versioned
# <epoch 1>:<version>-1; core "Depends: libc6 (>= 2.27), lshw", "Pre-Depends: passwd, login",
# "Conflicts: datacenter-gpu-manager"; each cuda<major> "Depends: datacenter-gpu-manager-4-core
# (= 1:<version>-1)", "Provides: datacenter-gpu-manager-4 (= 1:<version>-1)", "Recommends:
# libnuma1"; core ships /usr/bin/dcgmi, /usr/bin/nv-hostengine and
# /usr/lib/systemd/system/nvidia-dcgm.service ([Install] Alias=dcgm.service,
# WantedBy=multi-user.target; scripts/verify_package_contents/datacenter-gpu-manager-core_amd64.deb.txt,
# config-files/systemd/nvidia-dcgm.service.in). Modelled: that the CUDA repository serves 4.6.0
# under those names (no published Packages file of it was found); the stubs' contents; core's
# postinst (which adds the nvidia-dcgm user) is left out.
DCGM_VERSION = "1:4.6.0-1"
DCGM_CUDA_MAJORS = ("12", "13")


def dcgm_packages(version: str = DCGM_VERSION) -> list[Package]:
    upstream = version.split(":", 1)[-1].rsplit("-", 1)[0]
    core = Package(
        "datacenter-gpu-manager-4-core",
        version,
        depends=["libc6 (>= 2.27)", "lshw"],
        control={"Pre-Depends": "passwd, login", "Conflicts": "datacenter-gpu-manager"},
        files={
            "usr/bin/dcgmi": _script(f"""
                case "$1" in
                  --version|-v) echo "dcgmi  version: {upstream}"; exit 0 ;;
                esac
                echo "Error: unable to establish a connection to the specified host: localhost" >&2
                exit 255
            """),
            "usr/bin/nv-hostengine": _script("exit 0\n"),
            "usr/lib/systemd/system/nvidia-dcgm.service": (
                textwrap.dedent("""\
                    [Unit]
                    Description=NVIDIA DCGM service (stand-in)

                    [Service]
                    User=root
                    Environment="DCGM_HOME_DIR=/var/log/nvidia-dcgm"
                    ExecStart=/usr/bin/nv-hostengine -n --service-account nvidia-dcgm
                    Restart=on-abort

                    [Install]
                    Alias=dcgm.service
                    WantedBy=multi-user.target
                    """),
                0o644,
            ),
        },
    )
    return [core] + [
        Package(
            f"datacenter-gpu-manager-4-cuda{major}",
            version,
            depends=[f"datacenter-gpu-manager-4-core (= {version})"],
            provides=[f"datacenter-gpu-manager-4 (= {version})"],
            control={"Recommends": "libnuma1"},
            files={
                f"usr/lib/x86_64-linux-gnu/libdcgm_cublas_proxy{major}.so.4": ("stand-in\n", 0o644),
            },
        )
        for major in DCGM_CUDA_MAJORS
    ]


# A driver moved out of band (test_e2e_driver_moved): a node's own flat source next to the
# stand-in (an -updates pocket, a site mirror) to which a test publishes other builds of a branch.
# Versions from Ubuntu's noble archive on 2026-12-04: the 580 build it served, and the one the
# kernels' modules were still built for (no longer served: -updates lists the newest build only).
ARCHIVE_DRIVER_2026_12_04 = "580.196.07"
MODULES_DRIVER_2026_12_04 = "580.178.04"


def user_space_common(branch: str, version: str, deb_version: str) -> list[Package]:
    """nvidia-utils, nvidia-kernel-common and nvidia-compute-utils of one build of a branch, as
    Canonical's -server packages have them (nvidia-smi, the persistence daemon's unit)."""
    return [
        Package(
            f"nvidia-utils-{branch}-server",
            deb_version,
            files={
                "usr/bin/nvidia-smi": _script(f"""
                echo "NVIDIA-SMI stand-in   Driver Version: {version}"
                echo "No devices were found" >&2
                exit 6
            """),
            },
        ),
        Package(f"nvidia-kernel-common-{branch}-server", deb_version),
        Package(
            f"nvidia-compute-utils-{branch}-server",
            deb_version,
            files={
                # Like Ubuntu's unit: no [Install] section, and --no-persistence-mode.
                "lib/systemd/system/nvidia-persistenced.service": (
                    textwrap.dedent("""\
                [Unit]
                Description=NVIDIA Persistence Daemon
                Wants=syslog.target
                StopWhenUnneeded=true

                [Service]
                Type=forking
                ExecStart=/usr/bin/nvidia-persistenced --user nvidia-persistenced \\
                    --no-persistence-mode --verbose
                ExecStopPost=/bin/rm -rf /var/run/nvidia-persistenced
                """),
                    0o644,
                ),
                "usr/bin/nvidia-persistenced": _script("exit 0\n"),
            },
        ),
    ]


def canonical_user_space(branch: str, version: str, suffix: str = "-open") -> list[Package]:
    """Canonical's user-space packages of one build of a branch, shaped as stand_in_packages has
    them (utils, kernel-common, compute-utils, headless-no-dkms of one flavour), at another version."""
    deb_version = f"{version}-0ubuntu1"
    return [
        *user_space_common(branch, version, deb_version),
        Package(
            f"nvidia-headless-no-dkms-{branch}-server{suffix}",
            deb_version,
            depends=[f"nvidia-compute-utils-{branch}-server (= {deb_version})"],
        ),
    ]


def other_branch_user_space(branch: str, version: str, installed_branch: str) -> list[Package]:
    """canonical_user_space of another branch as it meets installed_branch's on one node: the
    utils packages conflict (Canonical's through the virtual nvidia-utils both provide, here by
    name: both ship nvidia-smi) and its compute-utils ships no files, so the rest of the two
    branches could stay side by side and only the role's purge removes them."""
    packages = canonical_user_space(branch, version)
    for package in packages:
        if package.name == f"nvidia-utils-{branch}-server":
            replaced = f"nvidia-utils-{installed_branch}-server"
            package.control.update({"Conflicts": replaced, "Replaces": replaced})
        if package.name == f"nvidia-compute-utils-{branch}-server":
            package.files.clear()
    return packages


def precompiled_modules(branch: str, kernel: str, built_for: str, suffix: str = "-open") -> Package:
    """Canonical's linux-modules-nvidia-<branch>-server[-open]-<kernel>, pinned to the driver it
    was built for as MODULES_GAP_KERNEL's are, with its nvidia.ko."""
    return Package(
        f"linux-modules-nvidia-{branch}-server{suffix}-{kernel}",
        f"{kernel.removesuffix('-generic').replace('-', '.')}+1",
        depends=[f"nvidia-kernel-common-{branch}-server (<= {built_for}-1), "
                 f"nvidia-kernel-common-{branch}-server (>= {built_for})"],
        files={f"lib/modules/{kernel}/kernel/nvidia-{branch}srv{suffix}/nvidia.ko": ("stand-in\n", 0o644)},
    )


def publish_flat(directory: Path, packages: list[Package], workdir: Path) -> None:
    """(Re)publish an unsigned flat repository (a source with [trusted=yes]) holding exactly these
    packages: what it listed before and does not list now is gone from it."""
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    for package in packages:
        build_deb(package, workdir, directory)
    shutil.rmtree(workdir, ignore_errors=True)
    _index(directory, "Driver updates stand-in", "Driver updates stand-in")


def stand_in_packages(kernel_release: str, architecture: str = "amd64") -> list[Package]:
    packages: list[Package] = []
    kernels = (kernel_release, PENDING_KERNEL)
    for branch, version in DRIVER_VERSIONS.items():
        deb_version = f"{version}-0ubuntu1"
        exact = f"(= {deb_version})"
        packages += user_space_common(branch, version, deb_version)
        for suffix in ("", "-open"):
            packages += [
                Package(
                    f"nvidia-headless-no-dkms-{branch}-server{suffix}",
                    deb_version,
                    depends=[f"nvidia-compute-utils-{branch}-server {exact}"],
                ),
                Package(f"nvidia-dkms-{branch}-server{suffix}", deb_version),
                Package(
                    f"nvidia-headless-{branch}-server{suffix}",
                    deb_version,
                    depends=[
                        f"nvidia-headless-no-dkms-{branch}-server{suffix} {exact}",
                        f"nvidia-dkms-{branch}-server{suffix} {exact}",
                    ],
                ),
            ]
            built_for = OLDER_FABRIC_MANAGER[branch]
            packages.append(
                Package(
                    f"linux-modules-nvidia-{branch}-server{suffix}-{MODULES_GAP_KERNEL}",
                    f"{MODULES_GAP_KERNEL.removesuffix('-generic').replace('-', '.')}+1",
                    depends=[f"nvidia-kernel-common-{branch}-server (<= {built_for}-1), "
                             f"nvidia-kernel-common-{branch}-server (>= {built_for})"],
                    files={
                        f"lib/modules/{MODULES_GAP_KERNEL}/kernel/nvidia-{branch}srv{suffix}/nvidia.ko": (
                            "stand-in\n",
                            0o644,
                        )
                    },
                )
            )
            packages += [
                Package(
                    f"linux-modules-nvidia-{branch}-server{suffix}-{kernel}",
                    deb_version,
                    files={
                        f"lib/modules/{kernel}/kernel/nvidia-{branch}srv{suffix}/nvidia.ko": (
                            "stand-in\n",
                            0o644,
                        )
                    },
                )
                for kernel in kernels
            ]
        unversioned = branch in UNVERSIONED_FABRIC_MANAGER
        for fm_version in (version, OLDER_FABRIC_MANAGER[branch]):
            deb = f"{fm_version}-1"
            packages.append(
                Package(
                    "nvidia-fabricmanager" if unversioned else f"nvidia-fabricmanager-{branch}",
                    deb,
                    provides=[f"nvidia-fabricmanager-{branch} (= {deb})"] if unversioned else [],
                    files={
                        "lib/systemd/system/nvidia-fabricmanager.service": (
                            textwrap.dedent("""\
                    [Unit]
                    Description=NVIDIA fabric manager service

                    [Service]
                    Type=forking
                    ExecStart=/usr/bin/nv-fabricmanager -c /usr/share/nvidia/nvswitch/fabricmanager.cfg

                    [Install]
                    WantedBy=multi-user.target
                    """),
                            0o644,
                        ),
                        "usr/bin/nv-fabricmanager": _script(
                            f'echo "Fabric Manager version is : {fm_version}"\n'
                        ),
                    },
                )
            )
            if not unversioned:  # Ubuntu's NSCQ next to Fabric Manager (multiverse)
                packages.append(
                    Package(
                        f"libnvidia-nscq-{branch}",
                        deb,
                        files={
                            f"usr/lib/x86_64-linux-gnu/libnvidia-nscq.so.{fm_version}": ("stand-in\n", 0o644)
                        },
                    )
                )
        for build in (version, OLDER_FABRIC_MANAGER[branch]):
            deb = f"{build}-1"
            packages.append(
                Package(
                    "nvidia-imex",
                    deb,
                    files={
                        "lib/systemd/system/nvidia-imex.service": (
                            textwrap.dedent("""\
                    [Unit]
                    Description=NVIDIA IMEX service

                    [Service]
                    Type=forking
                    ExecStart=/usr/bin/nvidia-imex -c /etc/nvidia-imex/config.cfg

                    [Install]
                    WantedBy=multi-user.target
                    """),
                            0o644,
                        ),
                        "etc/nvidia-imex/config.cfg": (
                            "IMEX_NODE_CONFIG_FILE=/etc/nvidia-imex/nodes_config.cfg\n",
                            0o644,
                        ),
                        "usr/bin/nvidia-imex": _script(f'echo "IMEX version is: {build}"\n'),
                    },
                )
            )
            if architecture != "arm64":
                packages.append(
                    Package(
                        "libnvsdm",
                        deb,
                        files={f"usr/lib/x86_64-linux-gnu/libnvsdm.so.{build}": ("stand-in\n", 0o644)},
                    )
                )
    packages.append(
        Package(
            "nvlsm",
            NVLSM_VERSIONS.get(architecture, NVLSM_VERSIONS["amd64"]),
            files={"usr/share/doc/nvlsm/stand-in": ("NVLink subnet manager stand-in\n", 0o644)},
        )
    )
    for branch, version in NVIDIA_REPO_DRIVERS.items():
        packages += nvidia_repo_driver(branch, version, kernel_release)
    # The kernel headers the DKMS packages build against (Ubuntu's linux-headers-<kernel>; a stub
    # for the roots' kernel, which is this machine's).
    packages.append(Package(f"linux-headers-{kernel_release}", "1.0-1"))
    dashed = CUDA_VERSION.replace(".", "-")
    packages += [
        Package(
            f"cuda-nvcc-{dashed}",
            f"{CUDA_PATCH}-1",
            files={
                f"usr/local/cuda-{CUDA_VERSION}/bin/nvcc": _script(f"""
                echo "nvcc: NVIDIA (R) Cuda compiler driver"
                echo "Cuda compilation tools, release {CUDA_VERSION}, V{CUDA_PATCH}"
            """),
            },
        ),
        Package(
            f"cuda-cudart-{dashed}",
            f"{CUDA_PATCH}-1",
            depends=["cuda-toolkit-12-config-common"],
            files={
                f"usr/local/cuda-{CUDA_VERSION}/lib64/libcudart.so.12": ("stand-in\n", 0o644),
            },
        ),
        # Registers the toolkit's libraries with the dynamic linker, as NVIDIA's packages do.
        Package(
            "cuda-toolkit-12-config-common",
            "12.8.90-1",
            architecture="all",
            files={
                "etc/ld.so.conf.d/988_cuda-12.conf": ("/usr/local/cuda-12/targets/x86_64-linux/lib\n", 0o644)
            },
        ),
        Package(
            f"cuda-toolkit-{dashed}",
            f"{CUDA_VERSION}.1-1",
            depends=[f"cuda-nvcc-{dashed} (>= {CUDA_PATCH})", f"cuda-cudart-{dashed} (>= {CUDA_PATCH})"],
        ),
    ]
    for nccl, cuda in ((NCCL_VERSION, CUDA_VERSION), NEWER_NCCL):
        version = f"{nccl}+cuda{cuda}"
        packages += [
            Package(
                "libnccl2", version, files={"usr/lib/x86_64-linux-gnu/libnccl.so.2": (f"{version}\n", 0o644)}
            ),
            Package(
                "libnccl-dev",
                version,
                depends=[f"libnccl2 (= {version})"],
                files={"usr/include/nccl.h": (f"/* {version} */\n", 0o644)},
            ),
        ]
    packages += dcgm_packages()
    for package in packages:
        if package.architecture != "all":
            package.architecture = architecture
    return packages


def build_deb(package: Package, workdir: Path, outdir: Path) -> Path:
    tree = workdir / f"{package.name}_{package.version}"
    (tree / "DEBIAN").mkdir(parents=True)
    control = [
        f"Package: {package.name}",
        f"Version: {package.version}",
        f"Architecture: {package.architecture}",
        "Maintainer: nodecert tests <tests@nodecert.invalid>",
        "Section: misc",
        "Priority: optional",
    ]
    if package.depends:
        control.append(f"Depends: {', '.join(package.depends)}")
    if package.source:
        control.append(f"Source: {package.source}")
    provides = package.provides + package.conflicts
    if provides:
        control.append(f"Provides: {', '.join(provides)}")
    if package.conflicts:
        control.append(f"Conflicts: {', '.join(package.conflicts)}")
        control.append(f"Replaces: {', '.join(package.conflicts)}")
    control += [f"{key}: {value}" for key, value in package.control.items()]
    control.append(f"Description: stand-in for {package.name} (nodecert e2e tests)")
    (tree / "DEBIAN/control").write_text("\n".join(control) + "\n")
    for rel, (content, mode) in package.files.items():
        path = tree / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
        path.chmod(mode)
    deb = outdir / f"{package.name}_{package.version.replace(':', '%3a')}_{package.architecture}.deb"
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", "-Zgzip", "-z1", "--build", str(tree), str(deb)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return deb


class Gpg:
    """A throwaway signing key in its own GNUPGHOME."""

    def __init__(self, name: str) -> None:
        # Short path: gpg-agent's socket path must fit in sun_path.
        self.home = Path(tempfile.mkdtemp(prefix="ncgpg"))
        self.home.chmod(0o700)
        self._gpg(
            "--passphrase",
            "",
            "--quick-gen-key",
            f"{name} <{name}@nodecert.invalid>",
            "ed25519",
            "sign",
            "never",
        )

    def _gpg(self, *args: str, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["gpg", "--batch", "--yes", "--homedir", str(self.home), *args],
            check=True,
            capture_output=True,
            **kwargs,
        )

    def export_armored(self) -> bytes:
        return self._gpg("--armor", "--export").stdout

    def sign_release(self, directory: Path) -> None:
        release = directory / "Release"
        self._gpg("--clearsign", "--output", str(directory / "InRelease"), str(release))
        self._gpg("--armor", "--detach-sign", "--output", str(directory / "Release.gpg"), str(release))

    def close(self) -> None:
        subprocess.run(
            ["gpgconf", "--homedir", str(self.home), "--kill", "gpg-agent"], check=False, capture_output=True
        )
        shutil.rmtree(self.home, ignore_errors=True)


def cuda_keyring(repo: StandInRepo, distribution: str, arch_dir: str = "x86_64") -> Package:
    """NVIDIA's cuda-keyring 1.1-1 as cloud and vendor images ship it: the repository key in
    /usr/share/keyrings/cuda-archive-keyring.gpg and a source entry for the repository that names
    it (/etc/apt/sources.list.d/cuda-<distribution>-<arch>.list), here pointing at the stand-in.
    Layout as in NVIDIA/cuda-repo-management#4 and the images that remove or rewrite that file."""
    line = (
        "deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] "
        f"{repo.url}/{distribution}/{arch_dir}/ /\n"
    )
    return Package(
        "cuda-keyring",
        "1.1-1",
        architecture="all",
        files={
            "usr/share/keyrings/cuda-archive-keyring.gpg": (repo.key_binary, 0o644),
            f"etc/apt/sources.list.d/cuda-{distribution}-{arch_dir}.list": (line, 0o644),
        },
    )


def _quiet_handler(directory: str):
    class Handler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format, *args):
            pass

    return partial(Handler, directory=directory)


@dataclass
class StandInRepo:
    """The built repository tree and the server answering for it."""

    root: Path
    url: str  # base URL, the role's cuda_toolkit_repo_url
    key_checksum: str  # sha256:<hex> of the signing key file
    wrong_key_path: str  # URL path of another key, for the bad-signature case
    wrong_key_checksum: str
    key_binary: bytes = b""  # the signing key, binary (what cuda-keyring installs)
    # Flat repository of Ubuntu's transitional 570 packages on another address (127.0.0.2), signed
    # by the same key: "Ubuntu's archive" for the rollback test ('' with only_nvidia).
    ubuntu_archive_url: str = ""
    _server: http.server.ThreadingHTTPServer | None = None
    _archive_server: http.server.ThreadingHTTPServer | None = None

    def key_url(self, distribution: str, arch: str = "x86_64") -> str:
        return f"{self.url}/{distribution}/{arch}/{KEY_NAME}"

    def stop(self) -> None:
        for server in (self._server, self._archive_server):
            if server is not None:
                server.shutdown()
                server.server_close()
        self._server = self._archive_server = None


def nvidia_only(package: Package) -> bool:
    """What only NVIDIA's CUDA repository ships (the rest is in Ubuntu's archive)."""
    return (
        package.from_nvidia
        or package.name.startswith(("cuda-", "libnccl", "nvidia-driver-pinning-", "datacenter-gpu-manager-"))
        or package.name in ("nvidia-fabricmanager", "nvidia-imex", "libnvsdm", "nvlsm")
    )


def build_and_serve(
    root: Path, kernel_release: str, architecture: str = "amd64", only_nvidia: bool = False
) -> StandInRepo:
    """Build the signed repository under root and serve it on a free port of 127.0.0.1.
    only_nvidia: leave out the stand-ins of Canonical's packages (for roots that take those from
    Ubuntu's archive)."""
    pool = root / "pool"
    pool.mkdir(parents=True)
    work = root / "build"
    for package in stand_in_packages(kernel_release, architecture):
        if only_nvidia and not nvidia_only(package):
            continue
        build_deb(package, work, pool)
    archive = root / "ubuntu-archive"
    if not only_nvidia:
        archive.mkdir()
        for package in ubuntu_transitional_570():
            build_deb(package, work, archive)
    shutil.rmtree(work)
    _index(pool, "NVIDIA stand-in", "NVIDIA CUDA stand-in")
    if not only_nvidia:
        _index(archive, "Ubuntu stand-in", "Ubuntu archive stand-in (transitional 570)")

    signer, stranger = Gpg("nodecert-stand-in-repo"), Gpg("nodecert-unrelated-key")
    try:
        signer.sign_release(pool)
        if not only_nvidia:
            signer.sign_release(archive)
        key = signer.export_armored()
        key_binary = signer._gpg("--export").stdout
        wrong_key = stranger.export_armored()
    finally:
        signer.close()
        stranger.close()
    (pool / KEY_NAME).write_bytes(key)
    (root / "wrong-key.pub").write_bytes(wrong_key)
    arch_dir = "sbsa" if architecture == "arm64" else "x86_64"
    for distribution in DISTRIBUTIONS:
        (root / REPO_PREFIX / distribution).mkdir(parents=True)
        (root / REPO_PREFIX / distribution / arch_dir).symlink_to(pool)

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), _quiet_handler(str(root)))
    threading.Thread(target=server.serve_forever, daemon=True, name="stand-in-apt-repo").start()
    base = f"http://127.0.0.1:{port}"
    with urllib.request.urlopen(f"{base}/{REPO_PREFIX}/debian12/{arch_dir}/Release", timeout=5):
        pass
    archive_server, archive_url = None, ""
    if not only_nvidia:
        # Another address, so that apt tells the two origins apart (Pin: origin).
        archive_server = http.server.ThreadingHTTPServer(("127.0.0.2", port), _quiet_handler(str(archive)))
        threading.Thread(target=archive_server.serve_forever, daemon=True, name="stand-in-archive").start()
        archive_url = f"http://127.0.0.2:{port}"
    return StandInRepo(
        root=root,
        url=f"{base}/{REPO_PREFIX}",
        key_checksum="sha256:" + hashlib.sha256(key).hexdigest(),
        wrong_key_path=f"{base}/wrong-key.pub",
        wrong_key_checksum="sha256:" + hashlib.sha256(wrong_key).hexdigest(),
        key_binary=key_binary,
        ubuntu_archive_url=archive_url,
        _server=server,
        _archive_server=archive_server,
    )


def _index(directory: Path, origin: str, label: str) -> None:
    """Packages, Packages.gz and Release of a flat repository."""
    subprocess.run(
        "apt-ftparchive packages . > Packages && gzip -9kn Packages", shell=True, cwd=directory, check=True
    )
    release = subprocess.run(
        [
            "apt-ftparchive",
            "-o",
            f"APT::FTPArchive::Release::Origin={origin}",
            "-o",
            f"APT::FTPArchive::Release::Label={label}",
            "release",
            ".",
        ],
        cwd=directory,
        check=True,
        capture_output=True,
    ).stdout
    (directory / "Release").write_bytes(release)


# --- NVIDIA's container toolkit repository (served apart from the CUDA one, as NVIDIA does) ---
#
# Real (the published index, https://nvidia.github.io/libnvidia-container/stable/deb/amd64/Packages,
# i.e. NVIDIA/libnvidia-container's gh-pages branch at commit 69f4ab7, which lists 1.20.1-1 as the
# newest): nvidia-container-toolkit "Depends: nvidia-container-toolkit-base (= V),
# libnvidia-container-tools (= V)" and "Breaks/Replaces: nvidia-container-runtime (<= 3.5.0-1),
# nvidia-container-runtime-hook"; nvidia-container-toolkit-base has no Depends;
# libnvidia-container-tools "Depends: libnvidia-container1 (= V), libc6 (>= 2.14), libcap2 (>= 1:2.10)";
# libnvidia-container1 "Depends: libc6 (>= 2.27), libcap2 (>= 1:2.10), libseccomp2 (>= 0.0.0~20120605)".
# The layout is NVIDIA's: a flat repository per architecture under <url>/stable/deb/<arch>/, entered
# as "deb [signed-by=...] <url>/stable/deb/$(ARCH) /" (its stable/deb/nvidia-container-toolkit.list),
# the armoured key at <url>/gpgkey. Modelled: the binaries are stubs, and nvidia-ctk is a small
# Python program doing to the runtime configs what `nvidia-ctk runtime configure` 1.20 does
# (cmd/nvidia-ctk/runtime/configure and pkg/config/engine in NVIDIA/nvidia-container-toolkit v1.20.0):
# docker: add runtimes.<name> = {"args": [], "path": "nvidia-container-runtime"} (and
# "default-runtime" with --set-as-default) to /etc/docker/daemon.json, written as Go's
# json.MarshalIndent writes it (keys sorted, four spaces, no final newline), creating the directory;
# containerd: write the runtime into the drop-in /etc/containerd/conf.d/99-nvidia.toml and make
# /etc/containerd/config.toml import /etc/containerd/conf.d/*.toml (the real tool re-serialises
# the whole TOML file; this one only adds the two keys it needs). --dry-run prints instead.
CONTAINER_TOOLKIT_VERSIONS = ("1.20.0-1", "1.20.1-1")
CONTAINER_TOOLKIT_PREFIX = "libnvidia-container"

FAKE_NVIDIA_CTK = r'''#!/usr/bin/python3
"""Stand-in for nvidia-ctk (nodecert e2e tests): `runtime configure` for docker and containerd."""
import json, os, re, sys

VERSION = "@UPSTREAM@"
DROP_IN = "/etc/containerd/conf.d/99-nvidia.toml"
IMPORT = "/etc/containerd/conf.d/*.toml"
ALIASES = {"nvidia-runtime-name": "name", "nvidia-runtime-path": "path", "runtime-path": "path"}


def save(path, text, dry_run):
    if dry_run:
        print(text)
        return
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    with open(path, "w") as out:
        out.write(text)
    print(f'level=info msg="Wrote updated config to {path}"', file=sys.stderr)


def docker(opts):
    path = opts.get("config") or "/etc/docker/daemon.json"
    config = {}
    if os.path.exists(path) and os.path.getsize(path) > 0:
        with open(path) as src:
            config = json.load(src)
    runtime = {"args": [], "path": opts["path"] or "nvidia-container-runtime"}
    config.setdefault("runtimes", {})[opts["name"]] = runtime
    if opts["default"]:
        config["default-runtime"] = opts["name"]
    save(path, json.dumps(config, indent=4, sort_keys=True), opts["dry_run"])


def containerd(opts):
    name, binary = opts["name"], opts["path"] or "/usr/bin/nvidia-container-runtime"
    base = 'plugins."io.containerd.grpc.v1.cri".containerd'
    drop_in = ["version = 2", "", "[plugins]", "", '  [plugins."io.containerd.grpc.v1.cri"]', "",
               f"    [{base}]"]
    if opts["default"]:
        drop_in.append(f'      default_runtime_name = "{name}"')
    drop_in += ["", f"      [{base}.runtimes]", "", f"        [{base}.runtimes.{name}]",
                '          runtime_type = "io.containerd.runc.v2"', "",
                f"          [{base}.runtimes.{name}.options]", f'            BinaryName = "{binary}"', ""]
    top_path = opts.get("config") or "/etc/containerd/config.toml"
    top = open(top_path).read() if os.path.exists(top_path) else ""
    match = re.search(r"^imports\s*=\s*\[(.*)\]\s*$", top, re.M)
    if match is None:
        top = f'imports = ["{IMPORT}"]\n' + top
    elif IMPORT not in match.group(1):
        listed = [item.strip() for item in match.group(1).split(",") if item.strip()]
        line = "imports = [" + ", ".join([*listed, f'"{IMPORT}"']) + "]"
        top = top[:match.start()] + line + top[match.end():]
    if not re.search(r"^version\s*=", top, re.M):
        top += "version = 2\n"
    save(DROP_IN, "\n".join(drop_in), opts["dry_run"])
    save(top_path, top.rstrip("\n"), opts["dry_run"])


def main(argv):
    if argv[:1] in (["--version"], ["-v"]):
        print(f"NVIDIA Container Toolkit CLI version {VERSION}")
        return 0
    if argv[:2] != ["runtime", "configure"]:
        print(f"stand-in nvidia-ctk: unsupported command {' '.join(argv)}", file=sys.stderr)
        return 1
    opts = {"runtime": "docker", "name": "nvidia", "path": "", "default": False, "dry_run": False}
    args = iter(argv[2:])
    for arg in args:
        key, _, value = arg.lstrip("-").partition("=")
        if key in ("dry-run",):
            opts["dry_run"] = True
        elif key in ("set-as-default", "nvidia-set-as-default"):
            opts["default"] = True
        elif key in ("runtime", "config", "nvidia-runtime-name", "nvidia-runtime-path", "runtime-path"):
            value = value or next(args)
            opts[ALIASES.get(key, key)] = value
        else:
            print(f"stand-in nvidia-ctk: unsupported flag {arg}", file=sys.stderr)
            return 1
    handlers = {"docker": docker, "containerd": containerd}
    if opts["runtime"] not in handlers:
        print(f"unrecognized runtime '{opts['runtime']}'", file=sys.stderr)
        return 1
    handlers[opts["runtime"]](opts)
    return 0


sys.exit(main(sys.argv[1:]))
'''


def container_toolkit_packages(version: str) -> list[Package]:
    upstream = version.rsplit("-", 1)[0]
    stub = _script('echo "stand-in" >&2\nexit 1\n')
    return [
        Package(
            "libnvidia-container1",
            version,
            depends=["libc6 (>= 2.27)", "libcap2 (>= 1:2.10)", "libseccomp2 (>= 0.0.0~20120605)"],
            source="libnvidia-container",
            files={f"usr/lib/x86_64-linux-gnu/libnvidia-container.so.{upstream}": ("stand-in\n", 0o644)},
        ),
        Package(
            "libnvidia-container-tools",
            version,
            depends=[f"libnvidia-container1 (= {version})", "libc6 (>= 2.14)", "libcap2 (>= 1:2.10)"],
            source="libnvidia-container",
            files={"usr/bin/nvidia-container-cli": stub},
        ),
        Package(
            "nvidia-container-toolkit-base",
            version,
            source="nvidia-container-toolkit",
            control={
                "Breaks": "nvidia-container-runtime (<= 3.5.0-1), nvidia-container-runtime-hook, "
                "nvidia-container-toolkit (<= 1.10.0-1)",
                "Replaces": "nvidia-container-runtime (<= 3.5.0-1), nvidia-container-runtime-hook",
            },
            files={
                "usr/bin/nvidia-ctk": (FAKE_NVIDIA_CTK.replace("@UPSTREAM@", upstream), 0o755),
                "usr/bin/nvidia-container-runtime": stub,
            },
        ),
        Package(
            "nvidia-container-toolkit",
            version,
            depends=[
                f"nvidia-container-toolkit-base (= {version})",
                f"libnvidia-container-tools (= {version})",
            ],
            control={
                "Breaks": "nvidia-container-runtime (<= 3.5.0-1), nvidia-container-runtime-hook",
                "Replaces": "nvidia-container-runtime (<= 3.5.0-1), nvidia-container-runtime-hook",
            },
            files={"usr/bin/nvidia-container-runtime-hook": stub},
        ),
    ]


@dataclass
class ContainerToolkitRepo:
    """NVIDIA's libnvidia-container repository stand-in: its own key and its own server."""

    root: Path
    url: str  # the role's container_toolkit_repo_url
    key_checksum: str
    _server: http.server.ThreadingHTTPServer | None = None

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def build_and_serve_container_toolkit(root: Path) -> ContainerToolkitRepo:
    """Build <root>/libnvidia-container/{gpgkey,stable/deb/amd64/}, signed by a key of its own,
    and serve it on a free port of 127.0.0.1."""
    base = root / CONTAINER_TOOLKIT_PREFIX
    pool = base / "stable" / "deb" / "amd64"
    pool.mkdir(parents=True)
    work = root / "build"
    for version in CONTAINER_TOOLKIT_VERSIONS:
        for package in container_toolkit_packages(version):
            build_deb(package, work, pool)
    shutil.rmtree(work)
    _index(pool, "github.com/NVIDIA/libnvidia-container stand-in", "NVIDIA container toolkit stand-in")
    signer = Gpg("nodecert-container-toolkit-repo")
    try:
        signer.sign_release(pool)
        key = signer.export_armored()
    finally:
        signer.close()
    (base / "gpgkey").write_bytes(key)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _quiet_handler(str(root)))
    threading.Thread(target=server.serve_forever, daemon=True, name="stand-in-ctk-repo").start()
    url = f"http://127.0.0.1:{server.server_address[1]}/{CONTAINER_TOOLKIT_PREFIX}"
    with urllib.request.urlopen(f"{url}/stable/deb/amd64/InRelease", timeout=5):
        pass
    return ContainerToolkitRepo(
        root=root, url=url, key_checksum="sha256:" + hashlib.sha256(key).hexdigest(), _server=server
    )


def main(argv: list[str] | None = None) -> int:
    """Serve the stand-in repository until killed (used by the Molecule scenario):
    python -m e2elib.aptrepo DIR PORTFILE  (writes "<url> <key checksum>" to PORTFILE)."""
    import signal
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m e2elib.aptrepo DIR INFOFILE", file=sys.stderr)
        return 2
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    repo = build_and_serve(Path(args[0]), os.uname().release)
    Path(args[1]).write_text(f"{repo.url} {repo.key_checksum}\n")
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    repo.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
