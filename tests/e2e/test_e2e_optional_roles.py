"""The optional roles for real: container_toolkit and dcgm on fresh Debian 12 roots.

Three hosts in one inventory: "optional" has both roles on and Docker's configuration directory
(with a daemon.json of its own, which must survive), "containerd" has the container toolkit on at
its default version and containerd's configuration (a config.toml of its own) but no Docker,
"defaults" leaves both roles at their defaults (off) and has /etc/docker too. Three runs of
provision.yml, each limited to the tags these roles need: preflight (its facts and apt settings),
cuda_toolkit (DCGM comes from the CUDA repository it adds; the stand-in toolkit is small),
container_toolkit and dcgm; the driver, NCCL, Fabric Manager, RDMA and the torch venv play no part
here and would only add minutes.

1. --check on the fresh roots: nothing may change.
2. The real run: the packages at their pins and held, the nvidia runtime in daemon.json.
3. The same run again: changed=0 (nvidia-ctk rewrites daemon.json, the role must see it is the same).

The container toolkit comes from a second stand-in repository with a key of its own, as NVIDIA
serves it apart from the CUDA repository (e2elib.aptrepo.build_and_serve_container_toolkit).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from e2elib import aptrepo, rootfs, runner

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

ROLES = Path(__file__).resolve().parents[2] / "playbooks" / "roles"
TAGS = "preflight,cuda_toolkit,container_toolkit,dcgm"
# Older than the newest the stand-in offers (1.20.1-1): all four packages must follow the pin, which
# apt only does when each is named at it (their Depends are exact and apt does not backtrack).
PINNED_TOOLKIT = aptrepo.CONTAINER_TOOLKIT_VERSIONS[0]
TOOLKIT_PACKAGES = ("nvidia-container-toolkit", "nvidia-container-toolkit-base",
                    "libnvidia-container-tools", "libnvidia-container1")
DCGM_PACKAGES = ("datacenter-gpu-manager-4-core", "datacenter-gpu-manager-4-cuda12")
OWN_DAEMON_JSON = {"log-driver": "journald"}
OWN_CONTAINERD = 'version = 2\n\n[grpc]\n  address = "/run/containerd/containerd.sock"\n'
HOSTS = ("optional", "containerd", "defaults")
ANSIBLE_WORKDIR = ("root/.ansible",)


@dataclass
class Runs:
    roots: dict[str, Path]
    check: runner.Result
    check_changed: dict[str, list[str]]  # host -> paths the check run changed in its root
    first: runner.Result
    second: runner.Result


@pytest.fixture(scope="module")
def toolkit_repo(workdir):
    repo = aptrepo.build_and_serve_container_toolkit(workdir / "container-toolkit-repo")
    yield repo
    repo.stop()


@pytest.fixture(scope="module")
def runs(make_host, debian12_tarball, base_vars, toolkit_repo, chroot_wrapper, ansible_home, workdir) -> Runs:
    roots = {name: make_host(name, debian12_tarball) for name in HOSTS}
    for name in ("optional", "defaults"):
        (roots[name] / "etc/docker").mkdir()
    (roots["optional"] / "etc/docker/daemon.json").write_text(json.dumps(OWN_DAEMON_JSON) + "\n")
    (roots["containerd"] / "etc/containerd").mkdir()
    (roots["containerd"] / "etc/containerd/config.toml").write_text(OWN_CONTAINERD)
    inventory = runner.write_inventory(
        workdir / "optional-roles.yml",
        roots,
        chroot_wrapper,
        {
            **base_vars,
            "container_toolkit_repo_url": toolkit_repo.url,
            "container_toolkit_repo_key_checksum": toolkit_repo.key_checksum,
        },
        host_vars={
            "optional": {
                "container_toolkit_install": True,
                "container_toolkit_version": PINNED_TOOLKIT,
                "dcgm_install": True,
            },
            "containerd": {"container_toolkit_install": True},
        },
    )
    home = ansible_home("optional-roles")
    before = {name: rootfs.tree_digest(root, exclude=ANSIBLE_WORKDIR) for name, root in roots.items()}
    run = ("provision.yml", inventory, home, "--tags", TAGS)
    check = runner.run_playbook(*run, "--check", "--diff", forks=len(roots))
    check_changed = {}
    for name, root in roots.items():
        after = rootfs.tree_digest(root, exclude=ANSIBLE_WORKDIR)
        check_changed[name] = sorted(p for p in before[name].keys() | after.keys()
                                     if before[name].get(p) != after.get(p))
    first = runner.run_playbook(*run, forks=len(roots))
    second = runner.run_playbook(*run, forks=len(roots)) if first.rc == 0 else first
    print(f"\noptional roles, {len(roots)} hosts: check {check.seconds:.0f}s, first {first.seconds:.0f}s, "
          f"second {second.seconds:.0f}s")
    return Runs(roots, check, check_changed, first, second)



def test_check_mode_on_fresh_roots_changes_nothing(runs):
    assert runs.check.rc == 0, runs.check
    assert runs.check_changed == {host: [] for host in HOSTS}
    # What the real run would do is said, not simulated.
    assert ("a real run installs nvidia-container-toolkit, nvidia-container-toolkit-base, "
            f"libnvidia-container-tools, libnvidia-container1 {PINNED_TOOLKIT}") in runs.check.output
    dcgm = "a real run installs datacenter-gpu-manager-4-core, datacenter-gpu-manager-4-cuda12"
    assert dcgm in runs.check.output


def test_first_run_succeeds(runs):
    assert runs.first.rc == 0, runs.first
    assert all(runs.first.recap[host]["failed"] == 0 for host in runs.roots), runs.first


def test_second_run_changes_nothing(runs):
    assert runs.second.rc == 0, runs.second
    changed = {host: runs.second.recap[host]["changed"] for host in runs.roots}
    assert changed == dict.fromkeys(HOSTS, 0), {
        host: runs.second.changed_tasks(host) for host in runs.roots}


def test_container_toolkit_is_pinned_and_held(runs):
    root = runs.roots["optional"]
    held = runner.selections(root)
    for package in TOOLKIT_PACKAGES:
        assert runner.package_version(root, package) == PINNED_TOOLKIT, package
        assert held.get(package) == "hold", package


def test_container_toolkit_repository_is_signed_by_its_own_pinned_key(runs, toolkit_repo):
    root = runs.roots["optional"]
    source = (root / "etc/apt/sources.list.d/nvidia-container-toolkit.list").read_text()
    line = (f"deb [signed-by=/etc/apt/keyrings/nvidia-container-toolkit.asc] "
            f"{toolkit_repo.url}/stable/deb/$(ARCH) /")
    assert line in source.splitlines()
    key = (root / "etc/apt/keyrings/nvidia-container-toolkit.asc").read_bytes()
    assert "sha256:" + hashlib.sha256(key).hexdigest() == toolkit_repo.key_checksum
    assert not (root / "etc/apt/trusted.gpg").exists()


def test_docker_gets_the_nvidia_runtime_and_keeps_its_own_settings(runs):
    text = (runs.roots["optional"] / "etc/docker/daemon.json").read_text()
    assert json.loads(text) == {
        **OWN_DAEMON_JSON, "runtimes": {"nvidia": {"args": [], "path": "nvidia-container-runtime"}}}
    assert "nvidia-ctk added the nvidia runtime to docker" in runs.first.output
    # The second run ran nvidia-ctk again (it rewrites the file) and saw the same contents.
    assert "nvidia-ctk added the nvidia runtime" not in runs.second.output
    # No containerd here: nothing written for it.
    assert not (runs.roots["optional"] / "etc/containerd").exists()


def test_containerd_gets_the_nvidia_runtime_in_a_drop_in_its_config_imports(runs):
    root = runs.roots["containerd"]
    for package in TOOLKIT_PACKAGES:  # no pin given: the role's default version
        assert runner.package_version(root, package) == aptrepo.CONTAINER_TOOLKIT_VERSIONS[-1], package
    drop_in = (root / "etc/containerd/conf.d/99-nvidia.toml").read_text()
    assert "runtimes.nvidia]" in drop_in and 'BinaryName = "/usr/bin/nvidia-container-runtime"' in drop_in
    top = (root / "etc/containerd/config.toml").read_text()
    assert top.startswith('imports = ["/etc/containerd/conf.d/*.toml"]\n'), top
    assert OWN_CONTAINERD.strip() in top  # the operator's own settings stay
    assert "nvidia-ctk added the nvidia runtime to containerd" in runs.first.output
    assert "nvidia-ctk added the nvidia runtime to containerd" not in runs.second.output
    assert not (root / "etc/docker").exists()
    assert not [p for p in runner.selections(root) if p.startswith("datacenter-gpu-manager")]


def test_dcgm_is_pinned_held_and_enabled(runs):
    root = runs.roots["optional"]
    held = runner.selections(root)
    for package in DCGM_PACKAGES:
        assert runner.package_version(root, package) == aptrepo.DCGM_VERSION, package
        assert held.get(package) == "hold", package
    assert "datacenter-gpu-manager-4-cuda13" not in held  # the toolkit is CUDA 12.8
    unit = "/usr/lib/systemd/system/nvidia-dcgm.service"
    assert os.readlink(root / "etc/systemd/system/multi-user.target.wants/nvidia-dcgm.service") == unit
    assert os.readlink(root / "etc/systemd/system/dcgm.service") == unit
    # A chroot: no systemd to start it in; said so.
    assert "not started now because systemd is not running" in runs.first.output


def test_defaults_install_neither(runs):
    root = runs.roots["defaults"]
    held = runner.selections(root)
    optional = ("datacenter-gpu-manager", "nvidia-container", "libnvidia-container")
    assert not [p for p in held if p.startswith(optional)]
    assert not (root / "etc/apt/sources.list.d/nvidia-container-toolkit.list").exists()
    assert not (root / "etc/docker/daemon.json").exists()
    assert not (root / "etc/systemd/system/dcgm.service").exists()
    assert "Container toolkit skipped on defaults: container_toolkit_install is false." in runs.first.output
    assert "DCGM skipped on defaults: dcgm_install is false." in runs.first.output
    # The CUDA repository (cuda_toolkit) is there all the same: only the optional roles are off.
    assert held.get("cuda-toolkit-12-8") == "hold"


def test_role_defaults_pin_what_the_stand_ins_model():
    """The stand-ins are built at the versions the roles pin by default (the newest published)."""
    toolkit = yaml.safe_load((ROLES / "container_toolkit/defaults/main.yml").read_text())
    dcgm = yaml.safe_load((ROLES / "dcgm/defaults/main.yml").read_text())
    assert toolkit["container_toolkit_version"] == aptrepo.CONTAINER_TOOLKIT_VERSIONS[-1]
    assert dcgm["dcgm_version"] == aptrepo.DCGM_VERSION
