"""provision.yml for real on Ubuntu 22.04 (jammy) and 24.04 (noble) roots, when an Ubuntu archive
answers (each release is probed; a case whose archive does not answer is skipped with the reason).

One inventory holds one HGX H100 host per Ubuntu release (forks=2); the same assertions as the
Debian 12 cluster where they apply, with Ubuntu's repository directories (ubuntu2204/ubuntu2404),
then a second run that must change nothing.

torch: the local torch wheel is built for CPython 3.11 (Debian 12); jammy has Python 3.10 and
noble 3.12. The Ubuntu hosts get a stand-in wheel named torch 2.13.0 (py3-none-any, importable,
not PyTorch) so that the pytorch role's venv, pip and import steps run for real.

This project on jammy: pyproject.toml says requires-python >= 3.11 (the code needs 3.11, e.g.
enum.StrEnum), and jammy's release pocket has no Python 3.11, so the project cannot be installed
there. The jammy host installs through pytorch_nodecert_requirement (the role's install-from-an-
index branch) with a requirement the wheelhouse satisfies, and a separate run checks that the
role's preflight stops with an actionable message when it would have to install the project.
noble installs this project's wheel and its dependencies (cp312 wheels) for real.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from e2elib import aptrepo, rootfs, runner, wheelhouse

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".cache" / "e2e"
KERNEL = os.uname().release
WHEELHOUSE_IN_HOST = "srv/wheelhouse"
PROBE_TIMEOUT = 5


@dataclass(frozen=True)
class Case:
    release: rootfs.Release
    python: str
    installs_project: bool


CASES = {
    "jammy": Case(rootfs.UBUNTU_2204, "3.10", installs_project=False),
    "noble": Case(rootfs.UBUNTU_2404, "3.12", installs_project=True),
}
JAMMY_VARS = {
    # Not this project (it needs Python >= 3.11): a requirement the wheelhouse satisfies, so the
    # role's install-from-an-index branch runs. See the module docstring.
    "pytorch_nodecert_requirement": "torch==2.13.0",
    "pytorch_import_check": ["torch"],
}


@dataclass
class Ubuntu:
    roots: dict[str, Path]
    skipped: dict[str, str]
    inventory: Path
    first: runner.Result | None
    second: runner.Result | None


@pytest.fixture(scope="module")
def ubuntu(e2e_ready, workdir, base_vars, chroot_wrapper, ansible_home) -> Ubuntu:
    roots: dict[str, Path] = {}
    skipped: dict[str, str] = {}
    for name, case in CASES.items():
        reason = rootfs.archive_answers(case.release, timeout=PROBE_TIMEOUT)
        if reason:
            skipped[name] = f"no Ubuntu archive: {reason}"
            continue
        tarball = rootfs.cached_tarball(case.release, CACHE)
        wheels = wheelhouse.cached_standin_wheelhouse(REPO, CACHE, case.python, case.installs_project)
        root = rootfs.unpack(tarball, workdir / "hosts" / name)
        wheelhouse.link_into(wheels, root, WHEELHOUSE_IN_HOST)
        runner.hgx_h100(root)  # the fullest path: open modules, Fabric Manager
        roots[name] = root
    inventory = workdir / "ubuntu.yml"
    if not roots:
        return Ubuntu(roots, skipped, inventory, None, None)
    host_vars = {"jammy": JAMMY_VARS} if "jammy" in roots else {}
    runner.write_inventory(inventory, roots, chroot_wrapper, base_vars, host_vars)
    first = runner.run_playbook("provision.yml", inventory, ansible_home("ubuntu"), forks=len(roots))
    (workdir / "ubuntu-first.log").write_text(first.output)  # kept with NODECERT_E2E_KEEP=1
    second = None
    if first.rc == 0:
        second = runner.run_playbook("provision.yml", inventory, ansible_home("ubuntu"), forks=len(roots))
        (workdir / "ubuntu-second.log").write_text(second.output)
    print(
        f"\nprovision.yml, Ubuntu hosts {sorted(roots)}: first run {first.seconds:.0f}s"
        + (f", second run {second.seconds:.0f}s" if second else "")
    )
    return Ubuntu(roots, skipped, inventory, first, second)


@pytest.fixture(params=sorted(CASES))
def host(request, ubuntu) -> str:
    if request.param in ubuntu.skipped:
        pytest.skip(ubuntu.skipped[request.param])
    return request.param


def selections(root: Path) -> dict[str, str]:
    out = runner.in_root(root, "dpkg", "--get-selections").stdout
    return dict(line.split() for line in out.splitlines() if line.strip())


def version(root: Path, package: str) -> str:
    return runner.in_root(root, "dpkg-query", "--show", "--showformat=${Version}", package).stdout


def test_root_is_the_ubuntu_release(ubuntu, host):
    os_release = (ubuntu.roots[host] / "etc/os-release").read_text()
    assert "ID=ubuntu" in os_release
    assert f'VERSION_ID="{CASES[host].release.name[6:8]}.{CASES[host].release.name[8:]}"' in os_release


def test_first_run_provisions(ubuntu, host):
    assert ubuntu.first is not None and ubuntu.first.recap[host]["failed"] == 0, ubuntu.first
    assert ubuntu.first.rc == 0, ubuntu.first


def test_second_run_changes_nothing(ubuntu, host):
    assert ubuntu.second is not None, ubuntu.first
    assert ubuntu.second.rc == 0, ubuntu.second
    assert ubuntu.second.recap[host]["changed"] == 0, ubuntu.second


def test_driver_toolkit_nccl_fabric_manager_installed_and_held(ubuntu, host):
    root = ubuntu.roots[host]
    held = selections(root)
    expected = [
        "nvidia-headless-no-dkms-580-server-open",
        f"linux-modules-nvidia-580-server-open-{KERNEL}",
        "nvidia-utils-580-server",
        "nvidia-compute-utils-580-server",
        "cuda-toolkit-12-8",
        "cuda-nvcc-12-8",
        "libnccl2",
        "libnccl-dev",
        "nvidia-fabricmanager-580",
    ]
    assert {p: held.get(p) for p in expected} == dict.fromkeys(expected, "hold")
    assert not [p for p in held if p.startswith("nvidia-dkms-")], "precompiled modules exist: no DKMS"
    assert version(root, "libnccl2") == f"{aptrepo.NCCL_VERSION}+cuda{aptrepo.CUDA_VERSION}"
    assert version(root, "nvidia-fabricmanager-580") == f"{aptrepo.DRIVER_VERSIONS['580']}-1"


def test_cuda_repository_is_ubuntus_and_signed_by_the_pinned_key(ubuntu, host, stand_in_repo):
    root = ubuntu.roots[host]
    distribution = CASES[host].release.name  # ubuntu2204 / ubuntu2404: NVIDIA's directory names
    source = (root / "etc/apt/sources.list.d/nvidia-cuda.list").read_text()
    line = f"deb [signed-by=/etc/apt/keyrings/nvidia-cuda.asc] {stand_in_repo.url}/{distribution}/x86_64/ /"
    assert line in source
    assert "trusted=yes" not in source
    key = (root / "etc/apt/keyrings/nvidia-cuda.asc").read_bytes()
    assert "sha256:" + hashlib.sha256(key).hexdigest() == stand_in_repo.key_checksum
    assert not (root / "etc/apt/trusted.gpg").exists()
    assert not list((root / "etc/apt/trusted.gpg.d").glob("*cuda*"))


def test_profile_modprobe_unattended_upgrades_and_persistence(ubuntu, host):
    root = ubuntu.roots[host]
    profile = (root / "etc/profile.d/cuda.sh").read_text()
    assert "CUDA_HOME=/usr/local/cuda-12.8" in profile and "${CUDA_HOME}/lib64" in profile
    login = runner.in_root(root, "bash", "-lc", "nvcc --version; echo LD=$LD_LIBRARY_PATH").stdout
    assert "release 12.8," in login and "\nLD=\n" in login, login  # never LD_LIBRARY_PATH
    blacklist = (root / "etc/modprobe.d/nodecert-blacklist-nouveau.conf").read_text()
    assert "blacklist nouveau" in blacklist and "options nouveau modeset=0" in blacklist
    unattended = (root / "etc/apt/apt.conf.d/51nodecert-nvidia-blacklist").read_text()
    for pattern in ('"^nvidia-";', '"^libnvidia-";', '"^libnccl";'):
        assert pattern in unattended
    override = (root / "etc/systemd/system/nvidia-persistenced.service.d/nodecert.conf").read_text()
    assert next(line for line in override.splitlines() if line.startswith("ExecStart=")) == "ExecStart="
    wants = root / "etc/systemd/system/multi-user.target.wants/nvidia-persistenced.service"
    target = os.readlink(wants)
    assert target == "/lib/systemd/system/nvidia-persistenced.service"
    # Ubuntu's /lib is a link to usr/lib (merged /usr): the unit must still be found through it.
    assert (root / "usr/lib/systemd/system/nvidia-persistenced.service").exists()
    fm = root / "etc/systemd/system/multi-user.target.wants/nvidia-fabricmanager.service"
    assert os.readlink(fm) == "/lib/systemd/system/nvidia-fabricmanager.service"


def test_venv_with_the_stand_in_torch(ubuntu, host):
    root = ubuntu.roots[host]
    probe = runner.in_root(
        root,
        "/opt/nodecert/venv/bin/python",
        "-c",
        "import sys, torch; print(torch.__version__, '%d.%d' % sys.version_info[:2])",
    )
    assert probe.stdout.split() == ["2.13.0", CASES[host].python], probe.stderr
    lock = (root / "opt/nodecert/requirements.lock").read_text()
    assert re.search(r"^torch==2\.13\.0$", lock, re.M)
    if CASES[host].installs_project:
        imports = runner.in_root(root, "/opt/nodecert/venv/bin/python", "-c", "import checks, trainer, numpy")
        assert imports.returncode == 0, imports.stderr
        assert re.search(r"^nodecert @ file:///opt/nodecert/dist/nodecert-", lock, re.M)
    else:
        assert not re.search(r"^nodecert", lock, re.M)


def test_jammy_python_too_old_for_this_project_is_named_early(
    ubuntu, workdir, base_vars, chroot_wrapper, ansible_home
):
    """With the role's defaults (install this project) jammy's Python 3.10 fails the pytorch
    role's preflight, naming the fix, before a venv or torch is touched."""
    if "jammy" in ubuntu.skipped:
        pytest.skip(ubuntu.skipped["jammy"])
    inventory = runner.write_inventory(
        workdir / "ubuntu-jammy-defaults.yml", {"jammy": ubuntu.roots["jammy"]}, chroot_wrapper, base_vars
    )
    result = runner.run_playbook(
        "provision.yml",
        inventory,
        ansible_home("ubuntu-jammy-defaults"),
        "--tags",
        "preflight,pytorch_preflight",
    )
    assert result.rc == 2, result
    message = result.failure("jammy")
    expected = "/usr/bin/python3 on jammy is Python 3.10, but this project needs Python >= 3.11"
    assert expected in message, result
    assert "pytorch_python" in message
