"""provision.yml for real: four Debian 12 roots in one inventory (forks=4), each a different node
type and starting point, then assertions on what the roots hold, then a second run that must
change nothing.

hgx-h100: eight H100 and four NVSwitches, branch 580 (open modules, Ubuntu's versioned Fabric
Manager and NSCQ). v100: proprietary modules, and a newer kernel installed but not running (the
modules must be for it). h200-590: an HGX H200 board on branch 590, whose Fabric Manager only
NVIDIA's repository has (unversioned name). image: a GPU-less image that, like most cloud images,
ships cuda-keyring with its own source entry for the same repository.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from e2elib import aptrepo, runner

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

KERNEL = os.uname().release


@dataclass
class Cluster:
    roots: dict[str, Path]
    inventory: Path
    first: runner.Result
    second: runner.Result


@pytest.fixture(scope="module")
def cluster(
    make_host, debian12_tarball, base_vars, stand_in_repo, chroot_wrapper, ansible_home, workdir
) -> Cluster:
    roots = {name: make_host(name, debian12_tarball) for name in ("hgx-h100", "v100", "h200-590", "image")}
    runner.hgx_h100(roots["hgx-h100"])
    runner.fake_pci_device(roots["v100"], "0000:3b:00.0", "1db5", "0x030200")
    runner.plant_kernel(roots["v100"], aptrepo.PENDING_KERNEL)
    runner.hgx_h100(roots["h200-590"], gpu_id="2335")
    keyring = aptrepo.build_deb(aptrepo.cuda_keyring(stand_in_repo, "debian12"), workdir / "keyring", workdir)
    runner.preinstall_deb(roots["image"], keyring)
    inventory = runner.write_inventory(
        workdir / "cluster.yml",
        roots,
        chroot_wrapper,
        base_vars,
        # NSCQ under NVIDIA's names is not modelled by the stand-in (Ubuntu's name only, for 580).
        host_vars={"h200-590": {"nvidia_driver_branch": "590", "fabric_manager_nscq": False}},
    )
    first = runner.run_playbook("provision.yml", inventory, ansible_home("cluster"), forks=4)
    second = (
        runner.run_playbook("provision.yml", inventory, ansible_home("cluster"), forks=4)
        if first.rc == 0
        else first
    )
    print(
        f"\nprovision.yml, 4 hosts, forks=4: first run {first.seconds:.0f}s, second run {second.seconds:.0f}s"
    )
    return Cluster(roots, inventory, first, second)



def test_first_run_provisions_every_host(cluster):
    assert cluster.first.rc == 0, cluster.first
    assert set(cluster.first.recap) >= set(cluster.roots)
    assert all(cluster.first.recap[host]["failed"] == 0 for host in cluster.roots), cluster.first


def test_second_run_changes_nothing(cluster):
    assert cluster.second.rc == 0, cluster.second
    assert {host: cluster.second.recap[host]["changed"] for host in cluster.roots} == dict.fromkeys(
        cluster.roots, 0
    ), cluster.second


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        # H100 (Hopper): open modules recommended; precompiled modules exist for this kernel.
        (
            "hgx-h100",
            [
                "nvidia-headless-no-dkms-580-server-open",
                f"linux-modules-nvidia-580-server-open-{KERNEL}",
                "nvidia-utils-580-server",
                "nvidia-compute-utils-580-server",
            ],
        ),
        # V100 (Volta): the open modules cannot drive it; modules for the pending kernel, which
        # the next boot runs.
        (
            "v100",
            [
                "nvidia-headless-no-dkms-580-server",
                f"linux-modules-nvidia-580-server-{aptrepo.PENDING_KERNEL}",
                "nvidia-utils-580-server",
            ],
        ),
        # Branch 590: NVIDIA's pinning package comes with it.
        (
            "h200-590",
            [
                "nvidia-headless-no-dkms-590-server-open",
                f"linux-modules-nvidia-590-server-open-{KERNEL}",
                "nvidia-driver-pinning-590",
                "nvidia-utils-590-server",
            ],
        ),
        # No GPU (an image): the default flavour, open.
        ("image", ["nvidia-headless-no-dkms-580-server-open", "nvidia-utils-580-server"]),
    ],
)
def test_driver_packages_are_installed_and_held(cluster, host, expected):
    held = runner.selections(cluster.roots[host])
    assert {package: held.get(package) for package in expected} == dict.fromkeys(expected, "hold")
    wrong_flavour = (
        "nvidia-headless-no-dkms-580-server" if host != "v100" else "nvidia-headless-no-dkms-580-server-open"
    )
    assert wrong_flavour not in held
    assert not [p for p in held if p.startswith("nvidia-dkms-")], "precompiled modules exist: no DKMS"


def test_cuda_repository_is_signed_by_the_pinned_key(cluster, stand_in_repo):
    for root in cluster.roots.values():
        source = (root / "etc/apt/sources.list.d/nvidia-cuda.list").read_text()
        assert (
            f"deb [signed-by=/etc/apt/keyrings/nvidia-cuda.asc] {stand_in_repo.url}/debian12/x86_64/ /"
            in source
        )
        assert "trusted=yes" not in source
        key = (root / "etc/apt/keyrings/nvidia-cuda.asc").read_bytes()
        assert "sha256:" + hashlib.sha256(key).hexdigest() == stand_in_repo.key_checksum
        # Nothing went into apt's global trust store.
        assert not (root / "etc/apt/trusted.gpg").exists()
        assert not list((root / "etc/apt/trusted.gpg.d").glob("*cuda*"))


def test_cuda_toolkit_and_nccl_are_pinned_and_held(cluster):
    for root in cluster.roots.values():
        held = runner.selections(root)
        for package in ("cuda-toolkit-12-8", "cuda-nvcc-12-8", "libnccl2", "libnccl-dev"):
            assert held.get(package) == "hold", package
        # The repository also offers a newer NCCL built for CUDA 12.9: the pin must win.
        pinned = f"{aptrepo.NCCL_VERSION}+cuda{aptrepo.CUDA_VERSION}"
        assert runner.package_version(root, "libnccl2") == pinned
        assert runner.package_version(root, "libnccl-dev") == pinned
        profile = (root / "etc/profile.d/cuda.sh").read_text()
        assert "CUDA_HOME=/usr/local/cuda-12.8" in profile
        login = runner.in_root(root, "sh", "-lc", "nvcc --version; echo LD=$LD_LIBRARY_PATH").stdout
        # No LD_LIBRARY_PATH: it would outrank the CUDA libraries bundled with the torch wheel;
        # the toolkit's packages register theirs with the dynamic linker instead.
        assert "release 12.8," in login and "\nLD=\n" in login, login
        assert not re.search(r"^[^#]*LD_LIBRARY_PATH", profile, re.M), profile
        assert (root / "etc/ld.so.conf.d/988_cuda-12.conf").exists()


def test_fabric_manager_only_where_nvswitches_are(cluster):
    hgx = cluster.roots["hgx-h100"]
    # The driver's version exactly, although an older build is also offered; NSCQ with it.
    for package in ("nvidia-fabricmanager-580", "libnvidia-nscq-580"):
        assert runner.package_version(hgx, package) == f"{aptrepo.DRIVER_VERSIONS['580']}-1", package
        assert runner.selections(hgx)[package] == "hold", package
    link = hgx / "etc/systemd/system/multi-user.target.wants/nvidia-fabricmanager.service"
    assert os.readlink(link) == "/lib/systemd/system/nvidia-fabricmanager.service"
    # Branch 590 from NVIDIA's repository: the unversioned name (the versioned one is only
    # provided, and apt cannot install a virtual package at a version).
    h200 = cluster.roots["h200-590"]
    assert runner.package_version(h200, "nvidia-fabricmanager") == f"{aptrepo.DRIVER_VERSIONS['590']}-1"
    assert runner.selections(h200)["nvidia-fabricmanager"] == "hold"
    assert (h200 / "etc/systemd/system/multi-user.target.wants/nvidia-fabricmanager.service").is_symlink()
    for name in ("v100", "image"):
        packages = runner.selections(cluster.roots[name])
        fabric_manager = [p for p in packages if p.startswith("nvidia-fabricmanager")]
        assert not fabric_manager, name
    assert "Fabric Manager skipped on v100: no NVSwitch" in cluster.first.output


def test_modules_for_the_pending_kernel(cluster):
    """v100 has a newer kernel installed than the one running: the modules are for that one (the
    next boot runs it), not for the running kernel, which this root cannot boot."""
    root = cluster.roots["v100"]
    assert (root / f"lib/modules/{aptrepo.PENDING_KERNEL}/kernel/nvidia-580srv/nvidia.ko").exists()
    assert not (root / f"lib/modules/{KERNEL}").exists()
    assert f"Kernel modules for {aptrepo.PENDING_KERNEL} (the newest installed kernel" in cluster.first.output


def test_preconfigured_cuda_keyring_is_switched_off_and_apt_works(cluster, stand_in_repo):
    """The image shipped cuda-keyring: its entry for the same repository names another keyring,
    which makes apt refuse every source ("Conflicting values set for option Signed-By"). It is
    commented out in place; ours, with the pinned key, is the one apt reads, and apt works."""
    root = cluster.roots["image"]
    keyring_list = (root / "etc/apt/sources.list.d/cuda-debian12-x86_64.list").read_text()
    active = [line for line in keyring_list.splitlines() if line.strip().startswith("deb")]
    assert active == [], keyring_list
    assert "# Disabled by Ansible (nodecert cuda_toolkit)" in keyring_list
    assert f"{stand_in_repo.url}/debian12/x86_64/" in keyring_list  # kept, as a comment
    update = runner.in_root(root, "apt-get", "update", check=False)
    assert update.returncode == 0 and "Conflicting" not in update.stderr, update.stderr
    policy = runner.in_root(root, "apt-cache", "policy", "cuda-toolkit-12-8").stdout
    assert f"{stand_in_repo.url}/debian12/x86_64" in policy
    key = (root / "etc/apt/keyrings/nvidia-cuda.asc").read_bytes()
    assert "sha256:" + hashlib.sha256(key).hexdigest() == stand_in_repo.key_checksum


def test_stale_package_lists_are_refreshed(cluster, ansible_home):
    """Lists from weeks ago are refreshed before the checks read them (cache_valid_time). Weeks-old
    lists that miss an index the mirror now has: the refresh brings it back."""
    root = cluster.roots["image"]
    lists = root / "var/lib/apt/lists"
    missing = sorted(lists.glob("*_main_binary-amd64_Packages*"))[0]
    missing.unlink()
    stale = time.time() - 30 * 86400
    os.utime(lists, (stale, stale))
    result = runner.run_playbook(
        "provision.yml", cluster.inventory, ansible_home("stale"), "--limit", "image", "--tags", "preflight"
    )
    assert result.rc == 0, result
    assert missing.exists(), "the package lists were not refreshed"
    refreshed = r"Refresh apt's package lists when they are stale\][ *]*\nchanged: \[image\]"
    assert re.search(refreshed, result.output), result


def test_nouveau_persistence_and_upgrades_are_configured(cluster):
    for root in cluster.roots.values():
        blacklist = (root / "etc/modprobe.d/nodecert-blacklist-nouveau.conf").read_text()
        assert "blacklist nouveau" in blacklist and "options nouveau modeset=0" in blacklist
        unattended = (root / "etc/apt/apt.conf.d/51nodecert-nvidia-blacklist").read_text()
        assert "Unattended-Upgrade::Package-Blacklist {" in unattended
        for pattern in ('"^nvidia-";', '"^libnvidia-";', '"^libnccl(2|-dev)$";'):
            assert pattern in unattended
        override = (root / "etc/systemd/system/nvidia-persistenced.service.d/nodecert.conf").read_text()
        exec_lines = [line for line in override.splitlines() if line.startswith("ExecStart=")]
        assert exec_lines[0] == "ExecStart=", "the drop-in must clear Ubuntu's ExecStart first"
        assert "--persistence-mode" in exec_lines[1].split() and "--no-persistence-mode" not in exec_lines[1]
        wants = root / "etc/systemd/system/multi-user.target.wants/nvidia-persistenced.service"
        assert os.readlink(wants) == "/lib/systemd/system/nvidia-persistenced.service"


def test_a_phase_tag_runs_that_phase_alone(cluster, ansible_home):
    """The driver's phases are included only on hosts with driver packages; a phase's tag still
    selects that phase and nothing of the other phases."""
    root = cluster.roots["hgx-h100"]
    blacklist = root / "etc/modprobe.d/nodecert-blacklist-nouveau.conf"
    blacklist.unlink()
    result = runner.run_playbook(
        "provision.yml", cluster.inventory, ansible_home("cluster"),
        "--limit", "hgx-h100", "--tags", "nvidia_driver_configure",
    )
    assert result.rc == 0, result
    assert "blacklist nouveau" in blacklist.read_text()
    assert re.search(r"TASK \[nvidia_driver : Blacklist nouveau\][ *]*\nchanged: \[hgx-h100\]", result.output)
    # a task of the install phase, one of the load phase (tasks tagged `always` run anyway), and
    # other roles' install tasks
    for other in ("Lift the holds of other driver branches", "Hold the driver packages",
                  "Report a node without GPUs", "Install the CUDA toolkit", "Install NCCL"):
        assert f" : {other}" not in result.output, other


def test_venv_imports_torch_and_this_project(cluster, base_vars):
    for root in cluster.roots.values():
        probe = runner.in_root(
            root, "/opt/nodecert/venv/bin/python", "-c", "import torch, checks; print(torch.__version__)"
        )
        assert probe.stdout.startswith("2.13.0"), probe.stderr
        lock = (root / "opt/nodecert/requirements.lock").read_text()
        assert re.search(r"^torch==2\.13\.0", lock, re.M)
        assert re.search(r"^nodecert @ file:///opt/nodecert/dist/nodecert-", lock, re.M)
    assert (
        "trainer" in base_vars["pytorch_import_check"]
        or not (Path(__file__).parents[2] / "trainer/__init__.py").exists()
    )


def test_changed_sources_are_rebuilt_and_reinstalled(cluster, project_snapshot, ansible_home, workdir):
    """The wheel built on the control machine is reused while the sources are unchanged (the
    second run did not build it) and rebuilt when they change: the node then runs the new code.
    Only one wheel stays in the control machine's cache."""
    home = ansible_home("cluster")
    cache = home / ".cache/nodecert/wheels"
    assert len(list(cache.iterdir())) == 1, sorted(cache.iterdir())
    reused = r"TASK \[pytorch : Build the wheel\][ *]*\nskipping: "
    assert re.search(reused, cluster.second.output), cluster.second
    edited = workdir / "project-edited"
    shutil.copytree(project_snapshot, edited)
    (edited / "checks" / "e2e_edit.py").write_text("EDITED = 'rebuilt from the edited sources'\n")
    root = cluster.roots["image"]

    def converge(source: Path) -> runner.Result:
        return runner.run_playbook(
            "provision.yml", cluster.inventory, home, "--limit", "image", "--tags", "preflight,pytorch",
            "-e", f"pytorch_nodecert_source={source}",
        )

    def probe() -> subprocess.CompletedProcess:
        code = "import checks.e2e_edit as e; print(e.EDITED)"
        return runner.in_root(root, "/opt/nodecert/venv/bin/python", "-c", code, check=False)

    try:
        result = converge(edited)
        assert result.rc == 0, result
        assert result.recap["image"]["changed"] > 0, result
        assert probe().stdout.strip() == "rebuilt from the edited sources"
        assert len(list(cache.iterdir())) == 1, sorted(cache.iterdir())
    finally:  # the other tests see the project as it was
        restored = converge(project_snapshot)
    assert restored.rc == 0, restored
    assert probe().returncode != 0, "the edited project is still installed"


def test_no_reboot_through_a_chroot_but_an_instruction(cluster):
    # Loaded driver (none: no /proc/driver/nvidia in a chroot) differs from the installed one.
    assert re.search(
        r"hgx-h100 runs driver none, but 580\.95\.05 is installed\. Not rebooting because the "
        r"connection is community\.general\.chroot",
        cluster.first.output,
    )
    # A node without GPUs has nothing to load.
    assert "No NVIDIA GPU on image: driver 580.95.05" in cluster.first.output


def test_verify_collects_each_report(cluster, chroot_wrapper, ansible_home, workdir):
    reports = workdir / "reports"
    result = runner.run_playbook(
        "verify.yml",
        cluster.inventory,
        ansible_home("verify"),
        "--limit",
        "hgx-h100,image",
        "-e",
        "verify_level=quick",
        "-e",
        "verify_run_id=e2e",
        "-e",
        "verify_crosshost=none",
        "-e",
        f"verify_reports_dir={reports}",
    )
    for host in ("hgx-h100", "image"):
        report = reports / "e2e" / f"{host}.json"
        # Fetched whether the checks passed or failed.
        assert report.exists(), result
        failed = result.recap[host]["failed"] == 1
        assert failed == (f"Checks failed on {host}" in result.output), result
    assert result.rc == (2 if any(result.recap[h]["failed"] for h in ("hgx-h100", "image")) else 0), result


def test_fleet_verify_names_every_fault_and_still_reports(cluster, chroot_wrapper, ansible_home, workdir):
    """Fleet mode over the provisioned roots: a host that cannot be reached, a host whose checks
    crash (so it never joins the cross-host rendezvous either), hosts with GPUs but no loaded
    driver, and a healthy image. Everything is named in the fleet report and the run finishes."""
    # The roots have no sysfs and this kernel has no /proc/modules: give each root the sysfs
    # directories a real host shows (the GPU roots already carry their fake PCI devices).
    for root in cluster.roots.values():
        for directory in ("sys/module", "sys/bus/pci/devices"):
            (root / directory).mkdir(parents=True, exist_ok=True)
    crash = cluster.roots["v100"] / "usr/local/bin/nodecert-crash"
    crash.write_text("#!/bin/sh\necho 'Segmentation fault (core dumped)' >&2\nexit 139\n")
    crash.chmod(0o755)
    inventory = yaml.safe_load(cluster.inventory.read_text())
    hosts = inventory["all"]["children"]["gpu_nodes"]["hosts"]
    hosts["v100"]["verify_python"] = "/usr/local/bin/nodecert-crash"
    hosts["ghost"] = {"ansible_host": str(workdir / "no-such-root")}
    inventory["all"]["children"]["gpu_nodes"]["vars"]["nodecert_rdzv_address"] = "127.0.0.1"
    fleet_inventory = workdir / "fleet.yml"
    fleet_inventory.write_text(yaml.safe_dump(inventory, sort_keys=False))
    reports = workdir / "fleet-reports"
    result = runner.run_playbook(
        "verify.yml",
        fleet_inventory,
        ansible_home("fleet"),
        "-e",
        "verify_level=quick",
        "-e",
        "verify_run_id=fleet",
        "-e",
        f"verify_reports_dir={reports}",
        "-e",
        "verify_crosshost_join_timeout=40",
        forks=5,
        timeout=900,
    )
    run = reports / "fleet"
    fleet = json.loads((run / "meta" / "fleet.json").read_text())
    status = {h["host"]: h for h in fleet["hosts"]}
    assert status["ghost"]["status"] == "MISSING" and "unreachable" in status["ghost"]["reason"], result
    assert status["v100"]["status"] == "MISSING", result
    assert "checks crashed: exit 139: Segmentation fault" in status["v100"]["reason"]
    # GPUs on the (fake) PCI bus with no driver loaded in a chroot: a FAIL, not a skip.
    assert status["hgx-h100"]["status"] == "FAIL"
    image = json.loads((run / "image.json").read_text())
    bad = {c["id"]: c["results"][0]["message"] for c in image["checks"] if c["status"] in ("FAIL", "ERROR")}
    assert status["image"]["status"] in ("PASS", "WARN"), bad
    analysis = json.loads((run / "crosshost" / "analysis.json").read_text())
    assert analysis["suspects"] == ["v100"], analysis
    xhost = {c["id"]: c for c in image["checks"] if c["id"].startswith("xhost-")}
    assert xhost["xhost-collective"]["status"] == "WARN"  # a victim of v100, not blamed
    assert "because of v100" in xhost["xhost-collective"]["results"][0]["message"]
    for output in ("fleet.html", "fleet.xml", "prometheus/nodecert-fleet.prom"):
        assert (run / "meta" / output).stat().st_size > 0
    assert result.rc != 0 and "Fleet verdict FAIL" in result.output


def test_crosshost_pairs_needs_a_fork_per_host(cluster, ansible_home, workdir):
    """The cross-host command runs synchronously: with fewer forks than hosts a started host can
    wait for a partner that never starts, in pairs mode too, so verify.yml refuses up front."""
    result = runner.run_playbook(
        "verify.yml",
        cluster.inventory,
        ansible_home("pairs-forks"),
        "-e",
        "verify_crosshost=pairs",
        "-e",
        "verify_python=/bin/true",  # no checks: only the cross-host planning matters here
        "-e",
        "verify_run_id=pairs-forks",
        "-e",
        f"verify_reports_dir={workdir / 'pairs-forks'}",
        forks=2,
    )
    assert result.rc != 0, result
    assert "runs 4 hosts per round (mode pairs)" in result.output, result
    assert "raise the fork count (-f 4)" in result.output
    assert not (workdir / "pairs-forks" / "pairs-forks" / "crosshost" / "analysis.json").exists()


def test_580_to_590_then_back_to_570_from_nvidias_repository(
    make_host, debian12_tarball, base_vars, stand_in_repo, chroot_wrapper, ansible_home, workdir
):
    """A node on 580 from NVIDIA's repository (nvidia_driver_repository=nvidia) moved to 590, whose
    packages carry no branch in their names, then rolled back to 570. Ubuntu's archive (here its
    stand-in on 127.0.0.2) has the 570 names too, as transitional packages depending on 580 under a
    higher 570 version, which NVIDIA's pinning package also matches: the role's preference for
    NVIDIA's repository must win. Then: 570 from NVIDIA's repository installed and held, its
    pinning package in place of 590's, nothing of 580 or 590 left, and a rerun changes nothing.
    Only the provisioning phases that touch the driver run."""
    root = make_host("rollback-570", debian12_tarball)
    runner.fake_pci_device(root, "0000:3b:00.0", "26b9", "0x030200")  # an L40S: open modules
    (root / "etc/apt/keyrings").mkdir(parents=True, exist_ok=True)
    (root / "etc/apt/keyrings/ubuntu-archive-stand-in.gpg").write_bytes(stand_in_repo.key_binary)
    (root / "etc/apt/sources.list.d/ubuntu-archive-stand-in.list").write_text(
        "deb [signed-by=/etc/apt/keyrings/ubuntu-archive-stand-in.gpg] "
        f"{stand_in_repo.ubuntu_archive_url}/ /\n"
    )
    inventory = runner.write_inventory(
        workdir / "rollback.yml",
        {"rollback-570": root},
        chroot_wrapper,
        # The root's Debian lists are hours old: not refreshed from Debian's mirror here (the
        # stale-lists test covers that); NVIDIA's lists are fetched when its repository is added.
        {**base_vars, "nvidia_driver_repository": "nvidia", "preflight_apt_cache_valid_time": 86400},
    )
    home = ansible_home("rollback")

    def converge(branch: str, tags: str = "preflight,nvidia_driver") -> runner.Result:
        return runner.run_playbook(
            "provision.yml", inventory, home, "--tags", tags, "-e", f"nvidia_driver_branch={branch}"
        )

    def installed() -> dict[str, str]:
        out = runner.in_root(
            root, "dpkg-query", "--show", "--showformat=${Package} ${Version} ${db:Status-Abbrev}\\n"
        ).stdout
        return {
            line.split()[0]: line for line in out.splitlines() if re.search(r"nvidia|linux-headers", line)
        }

    # The first run also adds NVIDIA's repository (cuda_toolkit); later runs only touch the driver.
    on_580 = converge("580", "preflight,cuda_toolkit,nvidia_driver")
    assert on_580.rc == 0, on_580
    v580 = f"{aptrepo.NVIDIA_REPO_DRIVERS['580']}-0ubuntu1"
    assert runner.package_version(root, "nvidia-utils-580") == v580
    assert runner.package_version(root, "nvidia-headless-580-open") == v580
    assert runner.selections(root).get("nvidia-driver-pinning-580") == "hold"

    # 590 from NVIDIA's repository: the same packages without the branch in their names, locked
    # by the pinning package alone; they replace 580's in one go and are held.
    on_590 = converge("590")
    assert on_590.rc == 0, on_590.failure("rollback-570") or on_590
    v590 = f"{aptrepo.NVIDIA_REPO_DRIVERS['590']}-0ubuntu1"
    unbranched = ("nvidia-utils", "libnvidia-compute", "nvidia-headless-open", "nvidia-dkms-open",
                  "nvidia-headless-no-dkms-open", "nvidia-kernel-common", "nvidia-compute-utils")
    versions = {p: runner.package_version(root, p) for p in unbranched}
    assert versions == dict.fromkeys(unbranched, v590), installed()
    assert not [line for line in installed().values() if line.split()[1].startswith("580.")], installed()
    held = set(runner.in_root(root, "apt-mark", "showhold").stdout.split())
    assert {*unbranched, "nvidia-driver-pinning-590"} <= held, held
    assert "Pin: version 590.*" in (root / aptrepo.PINNING_FILE).read_text()

    rolled_back = converge("570")
    assert rolled_back.rc == 0, rolled_back
    v570 = f"{aptrepo.NVIDIA_REPO_DRIVERS['570']}-0ubuntu1"
    packages = installed()
    # NVIDIA's 570, although the "archive" offers a higher 570 version of the same names.
    madison = runner.in_root(root, "apt-cache", "madison", "nvidia-utils-570").stdout
    assert aptrepo.UBUNTU_TRANSITIONAL_VERSION in madison, madison
    for package in (
        "nvidia-utils-570",
        "nvidia-headless-570-open",
        "nvidia-headless-no-dkms-570-open",
        "nvidia-dkms-570-open",
        "libnvidia-compute-570",
    ):
        assert runner.package_version(root, package) == v570, packages
    assert f"linux-headers-{KERNEL}" in packages
    assert (root / f"usr/src/nvidia-{aptrepo.NVIDIA_REPO_DRIVERS['570']}/dkms.conf").exists()
    # The pinning package of 570 replaced 580's; the role's preference names 570 and NVIDIA's host.
    pin = (root / aptrepo.PINNING_FILE).read_text()
    assert "Pin: version 570.*" in pin and "580" not in pin, pin
    preference = (root / "etc/apt/preferences.d/nodecert-nvidia-driver").read_text()
    assert "-570(-open)?$/" in preference and 'Pin: origin "127.0.0.1"' in preference, preference
    # Nothing of 580 or 590 left (590's names carry no branch: told by their version), not even
    # configuration files; the holds moved to 570.
    assert not [line for line in packages.values() if line.split()[1].startswith(("580.", "590."))], packages
    held = runner.in_root(root, "apt-mark", "showhold").stdout.split()
    assert {"nvidia-utils-570", "nvidia-headless-570-open", "nvidia-driver-pinning-570"} <= set(held), held
    assert not [p for p in held if "580" in p or p in unbranched], held
    assert re.search(r"rollback-570 runs driver none, but 570\.211\.01 is installed", rolled_back.output)

    again = converge("570")
    print(
        f"\nrollback: 580 {on_580.seconds:.0f}s, 590 {on_590.seconds:.0f}s, 570 {rolled_back.seconds:.0f}s, "
        f"rerun {again.seconds:.0f}s"
    )
    assert again.rc == 0, again
    assert again.recap["rollback-570"]["changed"] == 0, again.changed_tasks("rollback-570")


NEXT_KERNEL = "6.98.0-3-generic"  # a next ABI, offered after provisioning


def test_a_kernel_update_comes_only_with_its_nvidia_modules(cluster, workdir):
    """A next-ABI kernel offered after provisioning, installed by apt as an SRU or
    unattended-upgrades would: the role's guard (DPkg::Pre-Install-Pkgs) refuses the kernel alone
    in one line before dpkg unpacks anything, and lets it in together with Canonical's NVIDIA
    modules for it. Through the real apt and dpkg of a provisioned root (hgx-h100: open modules,
    precompiled); the kernel and modules are removed again afterwards."""
    root = cluster.roots["hgx-h100"]
    version = f"{aptrepo.DRIVER_VERSIONS['580']}-0ubuntu1"
    modules_name = f"linux-modules-nvidia-580-server-open-{NEXT_KERNEL}"
    kernel = aptrepo.Package(
        f"linux-image-{NEXT_KERNEL}", "6.98.0-3.3",
        files={f"boot/vmlinuz-{NEXT_KERNEL}": ("stand-in kernel image\n", 0o644)},
    )
    modules = aptrepo.Package(
        modules_name, version,
        files={f"lib/modules/{NEXT_KERNEL}/kernel/nvidia-580srv-open/nvidia.ko": ("stand-in\n", 0o644)},
    )
    incoming = root / "tmp/next-kernel"
    incoming.mkdir(parents=True)
    debs = [f"/tmp/next-kernel/{aptrepo.build_deb(p, workdir / 'next-kernel', incoming).name}"
            for p in (kernel, modules)]
    try:
        alone = runner.in_root(root, "apt-get", "install", "-y", "-q", debs[0], check=False)
        said = alone.stdout + alone.stderr
        assert alone.returncode != 0, said
        refusals = [line for line in said.splitlines() if "nodecert: refusing kernel" in line]
        assert len(refusals) == 1, said
        assert f"refusing kernel {NEXT_KERNEL}: apt brings no {modules_name}" in refusals[0]
        assert not (root / f"boot/vmlinuz-{NEXT_KERNEL}").exists(), "the kernel was unpacked"
        together = runner.in_root(root, "apt-get", "install", "-y", "-q", *debs, check=False)
        assert together.returncode == 0, together.stdout + together.stderr
        assert (root / f"boot/vmlinuz-{NEXT_KERNEL}").exists()
        assert (root / f"lib/modules/{NEXT_KERNEL}/kernel/nvidia-580srv-open/nvidia.ko").exists()
    finally:  # the later tests see the root as provisioned
        runner.in_root(root, "dpkg", "--purge", kernel.name, modules_name, check=False)
        shutil.rmtree(incoming)
    assert not (root / f"boot/vmlinuz-{NEXT_KERNEL}").exists()
