"""The rdma role for real: converged twice on fresh roots (Debian 12, plus Ubuntu 24.04 when an
Ubuntu archive answers), the second run changing nothing, then assertions on what the roots hold;
and `--check` on a fresh root leaving it byte-identical.

One Debian host carries an nvidia-peermem module under /lib/modules/<this kernel> (what the
NVIDIA driver's kernel-module package installs; the chroots report this machine's kernel) built with
peer-memory symbols, another a stub built without them: the boot-time load is written on the first
only. Nothing here loads a module: chroots share
this machine's kernel (see docs/multinode.md).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from e2elib import rootfs, runner

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1500)]

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".cache" / "e2e"
KERNEL = os.uname().release
ANSIBLE_WORKDIR = ("root/.ansible",)
# Only what the role needs from the preflight role: no GPU in a chroot, small roots, short waits.
RDMA_VARS = {
    "preflight_require_gpu": False,
    "preflight_min_free_disk_mb": 1024,
    "preflight_apt_lock_timeout": 30,
}
PACKAGES = ("rdma-core", "ibverbs-utils", "infiniband-diags", "perftest", "kmod")
TOOLS = ("/usr/bin/ibv_devinfo", "/usr/sbin/ibstat", "/usr/bin/ib_write_bw")


def rdma_playbook(workdir: Path) -> Path:
    """A play applying only the rdma role (and preflight, its dependency) to gpu_nodes."""
    play_dir = workdir / "rdma-play"
    if not play_dir.exists():
        play_dir.mkdir()
        (play_dir / "roles").symlink_to(REPO / "playbooks" / "roles")
        play = [
            {
                "name": "Provision the RDMA user space",
                "hosts": "gpu_nodes",
                "become": True,
                "gather_facts": True,
                "gather_subset": ["min"],
                "force_handlers": True,
                "roles": [{"role": "rdma"}],
            }
        ]
        (play_dir / "rdma.yml").write_text(yaml.safe_dump(play, sort_keys=False))
    return play_dir / "rdma.yml"


def plant_peermem(root: Path, depends: str = "ib_core,nvidia") -> Path:
    """An ELF object with the module's .modinfo, which modinfo reads as from the real module: built
    with peer-memory symbols (MLNX_OFED's, or a kernel that has them) it depends on ib_core;
    Canonical's build without them (a stub that fails to load) depends on nvidia alone."""
    module = root / "lib/modules" / KERNEL / "updates/dkms/nvidia-peermem.ko"
    module.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        empty, modinfo = Path(tmp) / "empty.o", Path(tmp) / "modinfo"
        subprocess.run(["as", "-o", str(empty), "/dev/null"], check=True)
        modinfo.write_bytes(f"license=Dual BSD/GPL\0depends={depends}\0name=nvidia_peermem\0".encode())
        subprocess.run(
            [
                "objcopy",
                f"--add-section=.modinfo={modinfo}",
                "--set-section-flags=.modinfo=alloc,readonly",
                str(empty),
                str(module),
            ],
            check=True,
        )
    return module


@dataclass
class Converged:
    roots: dict[str, Path]
    first: runner.Result
    second: runner.Result | None


@pytest.fixture(scope="module")
def converged(e2e_ready, workdir, debian12_tarball, chroot_wrapper, ansible_home) -> Converged:
    roots = {
        name: rootfs.unpack(debian12_tarball, workdir / "hosts" / name)
        for name in ("rdma-plain", "rdma-peermem", "rdma-stub")
    }
    plant_peermem(roots["rdma-peermem"])
    plant_peermem(roots["rdma-stub"], depends="nvidia")
    # A setting left from a driver that had the module: auto removes it where none is installed.
    stale = roots["rdma-plain"] / "etc/modules-load.d/nodecert-rdma.conf"
    stale.parent.mkdir(parents=True, exist_ok=True)
    stale.write_text("nvidia-peermem\n")
    if rootfs.archive_answers(rootfs.UBUNTU_2404) is None:
        roots["rdma-noble"] = rootfs.unpack(
            rootfs.cached_tarball(rootfs.UBUNTU_2404, CACHE), workdir / "hosts" / "rdma-noble"
        )
    inventory = runner.write_inventory(
        workdir / "rdma.yml",
        roots,
        chroot_wrapper,
        RDMA_VARS,
        host_vars={"rdma-peermem": {"rdma_peermem": "always"}},
    )
    play = rdma_playbook(workdir)
    first = runner.run_playbook(str(play), inventory, ansible_home("rdma"), forks=len(roots))
    second = (
        runner.run_playbook(str(play), inventory, ansible_home("rdma"), forks=len(roots))
        if first.rc == 0
        else None
    )
    print(
        f"\nrdma role, hosts {sorted(roots)}: first run {first.seconds:.0f}s"
        + (f", second run {second.seconds:.0f}s" if second else "")
    )
    return Converged(roots, first, second)


def test_first_run_converges(converged):
    assert converged.first.rc == 0, converged.first
    assert all(converged.first.recap[h]["changed"] > 0 for h in converged.roots), converged.first


def test_second_run_changes_nothing(converged):
    assert converged.second is not None and converged.second.rc == 0, converged.first
    assert converged.second.changed() == dict.fromkeys(converged.roots, 0), {
        h: converged.second.changed_tasks(h) for h in converged.roots}


def test_packages_and_tools_are_installed(converged):
    for root in converged.roots.values():
        status = runner.in_root(
            root, "dpkg-query", "--show", "--showformat=${Status}\\n", *PACKAGES
        ).stdout.split("\n")
        assert [s for s in status if s] == ["install ok installed"] * len(PACKAGES), root
        assert [t for t in TOOLS if not (root / t.lstrip("/")).exists()] == [], root


def test_peermem_loads_at_boot_only_where_the_driver_provides_it(converged):
    conf = "etc/modules-load.d/nodecert-rdma.conf"
    assert "nvidia-peermem" in (converged.roots["rdma-peermem"] / conf).read_text().split()
    assert not (converged.roots["rdma-plain"] / conf).exists(), "stale setting kept"


def test_a_peermem_stub_is_not_loaded_at_boot_and_says_why(converged):
    # A module built without peer-memory symbols fails at every boot (EINVAL): not set to load.
    assert not (converged.roots["rdma-stub"] / "etc/modules-load.d/nodecert-rdma.conf").exists()
    assert "depends on nvidia, not ib_core" in converged.first.output, converged.first


def test_memlock_is_unlimited_for_sessions_and_services(converged):
    root = converged.roots["rdma-plain"]
    limits = (root / "etc/security/limits.d/90-nodecert-rdma.conf").read_text().splitlines()
    rows = {tuple(line.split()) for line in limits if line and not line.startswith("#")}
    assert {("*", "hard", "memlock", "unlimited"), ("root", "soft", "memlock", "unlimited")} <= rows
    dropin = (root / "etc/systemd/system.conf.d/90-nodecert-rdma.conf").read_text()
    assert "[Manager]" in dropin and "DefaultLimitMEMLOCK=infinity" in dropin.splitlines()


def test_no_doca_repository_unless_asked(converged):
    for root in converged.roots.values():
        assert not (root / "etc/apt/sources.list.d/nodecert-doca-ofed.list").exists()


def test_check_mode_on_a_fresh_root_changes_nothing(
    e2e_ready, workdir, debian12_tarball, chroot_wrapper, ansible_home
):
    root = rootfs.unpack(debian12_tarball, workdir / "hosts" / "rdma-check")
    plant_peermem(root)
    before = rootfs.tree_digest(root, exclude=ANSIBLE_WORKDIR)
    inventory = runner.write_inventory(
        workdir / "rdma-check.yml", {"rdma-check": root}, chroot_wrapper, RDMA_VARS
    )
    result = runner.run_playbook(
        str(rdma_playbook(workdir)), inventory, ansible_home("rdma-check"), "--check", "--diff"
    )
    assert result.rc == 0, result
    assert result.recap["rdma-check"]["changed"] > 0, "check mode should say what it would change"
    after = rootfs.tree_digest(root, exclude=ANSIBLE_WORKDIR)
    changed = rootfs.changed_paths(before, after)
    assert changed == [], f"check mode changed the root: {changed[:20]}"
    assert "a real run installs rdma-core, ibverbs-utils, infiniband-diags, perftest" in result.output


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"rdma_doca_ofed": True}, "rdma_doca_ofed=true needs the site mirror"),
        ({"rdma_memlock_limit": "lots"}, "rdma_memlock_limit must be"),
        ({"rdma_peermem": "always"}, "no nvidia-peermem module is installed"),
    ],
)
def test_preflight_stops_with_an_actionable_message(
    e2e_ready, workdir, debian12_tarball, chroot_wrapper, ansible_home, extra, message
):
    name = f"rdma-bad-{sorted(extra)[0]}"
    root = rootfs.unpack(debian12_tarball, workdir / "hosts" / name)
    inventory = runner.write_inventory(
        workdir / f"{name}.yml", {name: root}, chroot_wrapper, {**RDMA_VARS, **extra}
    )
    # The peermem case must reach configure: skip installing packages to keep it quick.
    args = ("--skip-tags", "rdma_install") if "rdma_peermem" in extra else ()
    result = runner.run_playbook(str(rdma_playbook(workdir)), inventory, ansible_home(name), *args)
    assert result.rc != 0, result
    assert message in result.failure(name), result
