"""The roles' package-name rules, evaluated by Ansible's own templating (e2elib.roletemplate) over
whole tables of real package names, and where a real consumer exists, by that consumer:
unattended-upgrades' own matching code reads the rendered blacklist through apt's config parser.

Fast (no root filesystem, no play): the e2e tests cover the same roles on real roots.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2elib import aptrepo, roletemplate  # noqa: E402

KERNEL = "6.8.0-90-generic"
NEXT_KERNEL = "6.8.0-94-generic"

# The CUDA toolkit's own versioned packages, as apt lists them when installing cuda-toolkit-12-x
# from NVIDIA's repository (an apt transcript of cuda-toolkit-12-5: libcublas-12-5 libcublas-dev-12-5
# libcufft-12-5 ... libnvfatbin-dev-12-5 libnvjitlink-12-5 libnvjpeg-dev-12-5; gds-tools-12-9 and
# nsight-compute/-systems come with cuda-toolkit too). Written for 12-8, the toolkit the roles pin.
CUDA_TOOLKIT_DEPENDENCIES = [
    f"lib{name}{dev}-12-8"
    for name in ("cublas", "cufft", "cufile", "curand", "cusolver", "cusparse", "npp", "nvfatbin", "nvjitlink", "nvjpeg")
    for dev in ("", "-dev")
] + ["gds-tools-12-8", "nsight-compute-2025.1.1", "nsight-systems-2024.6.2", "cuda-keyring", "cuda-compat-12-8"]

# Every NVIDIA/CUDA package the roles install or pull in, Canonical's and NVIDIA's names: the
# stand-in repository carries the names the roles ask for (driver branches 570/580/590, Fabric
# Manager, NSCQ, IMEX, NVLink5, toolkit, NCCL). Canonical's precompiled modules are not among them:
# they follow the kernel (see test_kernel_modules_follow_the_kernel_under_unattended_upgrades).
NVIDIA_PACKAGES = sorted(
    {
        package.name
        for package in aptrepo.stand_in_packages(KERNEL)
        if not package.name.startswith(("linux-headers-", "linux-modules-nvidia-"))
    }
    | set(CUDA_TOOLKIT_DEPENDENCIES)
    | {"libnvidia-nscq-580", "nvidia-fabricmanager-580", "nvidia-imex-580", "xserver-xorg-video-nvidia-535-server"}
)

# Packages whose names start like NVIDIA's and which get security updates of their own (noble's
# names): the blacklist must let them through.
OTHER_PACKAGES = [
    "curl",
    "libcurl4t64",
    "libcurl3t64-gnutls",
    "libcups2t64",
    "cups",
    "libcupsimage2t64",
    "libcue2",
    "libcunit1",
    "libcups2-dev",
    "libnpth0t64",
    "libnvme1t64",
    "libnss3",
    "cudf-tools",  # not a real noble package: a name merely starting with "cud"
    "nsight",  # likewise
    # The kernel and Canonical's NVIDIA modules for it move together (docs/provisioning.md).
    "linux-generic",
    "linux-image-virtual",
    f"linux-image-{NEXT_KERNEL}",
    "linux-modules-nvidia-580-server-open-generic",
    f"linux-modules-nvidia-580-server-open-{NEXT_KERNEL}",
]

# unattended-upgrades' own code: the Package-Blacklist as apt's config parser reads it, each name
# put through is_pkgname_in_blacklist from /usr/bin/unattended-upgrade (system Python, python3-apt).
MATCH_WITH_UNATTENDED_UPGRADES = r"""
import importlib.machinery, importlib.util, json, sys
import apt_pkg
loader = importlib.machinery.SourceFileLoader("uu", "/usr/bin/unattended-upgrade")
spec = importlib.util.spec_from_loader("uu", loader)
uu = importlib.util.module_from_spec(spec)
loader.exec_module(uu)
apt_pkg.init_config()
apt_pkg.read_config_file(apt_pkg.config, sys.argv[1])
blacklist = apt_pkg.config.value_list("Unattended-Upgrade::Package-Blacklist")
names = json.loads(sys.stdin.read())
print(json.dumps({"blacklist": blacklist, "blocked": [n for n in names if uu.is_pkgname_in_blacklist(n, blacklist)]}))
"""


@pytest.fixture(scope="module")
def blocked(tmp_path_factory) -> dict:
    if not Path("/usr/bin/unattended-upgrade").exists() or shutil.which("python3") is None:
        pytest.fail("unattended-upgrades is missing: apt-get install -y $(cat .ci/apt-packages.txt)")
    conf = tmp_path_factory.mktemp("uu") / "51nodecert-nvidia-blacklist"
    conf.write_text(
        roletemplate.render_file(
            roletemplate.ROLES / "nvidia_driver/templates/unattended-upgrades-nvidia.conf.j2", "nvidia_driver"
        )
    )
    proc = subprocess.run(
        ["/usr/bin/python3", "-c", MATCH_WITH_UNATTENDED_UPGRADES, str(conf)],
        input=json.dumps(NVIDIA_PACKAGES + OTHER_PACKAGES),
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
    )
    return json.loads(proc.stdout)


def test_the_rendered_file_carries_every_pattern(blocked):
    assert blocked["blacklist"] == roletemplate.render("nvidia_driver_unattended_upgrades_blacklist", "nvidia_driver")


@pytest.mark.parametrize("name", NVIDIA_PACKAGES)
def test_unattended_upgrades_keep_nvidia_and_cuda_packages(blocked, name):
    assert name in blocked["blocked"]


@pytest.mark.parametrize("name", OTHER_PACKAGES)
def test_unattended_upgrades_let_other_security_updates_through(blocked, name):
    assert name not in blocked["blocked"]
