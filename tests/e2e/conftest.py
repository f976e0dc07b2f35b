"""Fixtures for the end-to-end tests of the provisioning playbooks.

The expensive pieces are session-scoped and built once per pytest run: the debootstrap root
(cached as a tarball under .cache/e2e/ across runs), the signed stand-in NVIDIA repository on
127.0.0.1, and the wheelhouse (also cached). Each test host is a fresh copy of the root.

NODECERT_E2E_KEEP=1 keeps the hosts' roots (under .cache/e2e/run/<pid>/) for inspection.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# pytest runs with --import-mode=importlib, which puts no test directory on sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2elib import aptrepo, rootfs, runner, wheelhouse

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".cache" / "e2e"
TOOLS = ("debootstrap", "dpkg-deb", "apt-ftparchive", "gpg", "gpgconf", "unshare", "chroot", "tar")
WHEELHOUSE_IN_HOST = "srv/wheelhouse"


@pytest.fixture(scope="session")
def e2e_ready() -> None:
    """Skip where these tests cannot run at all; fail where something installable is missing."""
    if os.geteuid() != 0:
        pytest.skip("end-to-end provisioning needs root (debootstrap, chroot, unshare)")
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        pytest.fail(f"missing {', '.join(missing)}: apt-get install -y $(cat .ci/apt-packages.txt)")
    if not (runner.VENV_BIN / "ansible-playbook").exists():
        pytest.fail(f"no ansible-playbook in {runner.VENV_BIN}: pip install -e '.[dev]'")
    if importlib.util.find_spec("ansible_collections.community.general") is None:
        pytest.fail("community.general is missing: pip install ansible (it bundles the chroot connection)")


@pytest.fixture(scope="session")
def workdir(e2e_ready) -> Iterator[Path]:
    # Under .cache/ (same file system as the cached tarball and wheelhouse: hard links work).
    base = CACHE / "run" / str(os.getpid())
    base.mkdir(parents=True)
    yield base
    if not os.environ.get("NODECERT_E2E_KEEP"):
        for root in sorted((base / "hosts").glob("*")) if (base / "hosts").exists() else []:
            rootfs.remove_root(root)
        shutil.rmtree(base)


@pytest.fixture(scope="module", autouse=True)
def _hosts_removed_after_their_module() -> Iterator[None]:
    """The host roots a module made are deleted when the module ends, not at the session's end:
    a worker's roots (28 of them, about 0.5 GiB each) once filled 26 GiB of CI's disk by the time
    the host checks ran there, and disk-space rightly failed. No root is shared between modules
    (--dist loadfile keeps a module on one worker; each module names its own hosts)."""
    hosts = CACHE / "run" / str(os.getpid()) / "hosts"
    before = set(hosts.iterdir()) if hosts.exists() else set()
    yield
    if os.environ.get("NODECERT_E2E_KEEP") or not hosts.exists():
        return
    for root in sorted(set(hosts.iterdir()) - before):
        rootfs.remove_root(root)


@pytest.fixture(scope="session")
def debian12_tarball(e2e_ready) -> Path:
    return rootfs.cached_tarball(rootfs.DEBIAN_12, CACHE)


@pytest.fixture(scope="session")
def stand_in_repo(workdir) -> Iterator[aptrepo.StandInRepo]:
    # The hosts are chroots of this machine: the kernel they report is this one's.
    repo = aptrepo.build_and_serve(workdir / "repo", os.uname().release)
    yield repo
    repo.stop()


@pytest.fixture(scope="session")
def wheels(e2e_ready) -> Path:
    return wheelhouse.cached_wheelhouse(REPO, CACHE)


@pytest.fixture(scope="session")
def project_snapshot(workdir) -> Path:
    """This project's sources as they are now: others may edit the tree while the tests run, and
    the pytorch role would rightly reinstall a changed project (breaking the changed=0 check)."""
    snapshot = workdir / "project"
    snapshot.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("pyproject.toml", "README.md"):
        if (REPO / name).exists():
            shutil.copy2(REPO / name, snapshot / name)
    for name in ("checks", "trainer"):
        shutil.copytree(REPO / name, snapshot / name, ignore=ignore)
    return snapshot


@pytest.fixture(scope="session")
def chroot_wrapper(workdir) -> Path:
    return runner.write_wrapper(workdir)


@pytest.fixture(scope="session")
def make_host(workdir, wheels) -> Callable[[str, Path], Path]:
    """A fresh root for a test host, with the wheelhouse linked in."""

    def make(name: str, tarball: Path) -> Path:
        root = rootfs.unpack(tarball, workdir / "hosts" / name)
        wheelhouse.link_into(wheels, root, WHEELHOUSE_IN_HOST)
        return root

    return make


@pytest.fixture(scope="session")
def base_vars(stand_in_repo, project_snapshot) -> dict:
    """Group variables pointing the roles at the stand-ins, as a site mirror would."""
    imports = ["torch", "checks"] + (
        ["trainer"] if (project_snapshot / "trainer/__init__.py").exists() else []
    )
    return {
        # The chroots have no GPU unless a test plants one in their /sys.
        "preflight_require_gpu": False,
        # Debian 12 roots play Ubuntu GPU nodes here (the stand-in repository serves Canonical's
        # package names to them); by default Debian is refused for GPU nodes, which
        # test_e2e_faults checks.
        "preflight_gpu_distributions": ["Ubuntu", "Debian"],
        "preflight_min_free_disk_mb": 1024,
        "preflight_apt_lock_timeout": 30,
        "cuda_toolkit_repo_url": stand_in_repo.url,
        "cuda_toolkit_repo_key_checksum": stand_in_repo.key_checksum,
        "pytorch_pip_extra_args": f"--no-index --find-links /{WHEELHOUSE_IN_HOST}",
        "pytorch_nodecert_source": str(project_snapshot),
        "pytorch_import_check": imports,
    }


@pytest.fixture(scope="session")
def ansible_home(workdir) -> Callable[[str], Path]:
    return lambda name: workdir / "home" / name
