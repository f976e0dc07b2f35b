"""One converge of provision.yml for the Blackwell paths, on two Debian 12 roots playing Ubuntu
nodes with the stand-in repository (as test_e2e_provision does): an HGX B200 board (8x 0x2901, no
NVSwitch on the PCI bus) and a GB200 NVL72 compute tray (4x 0x2941, an x86_64 root standing in for
a Grace host: the arm64 selection is tested as data in test_blackwell_provisioning.py). torch is
left out with NCCL and rdma (--skip-tags): tested elsewhere, the venv dominates the time. Then a second
run that must change nothing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest
from e2elib import aptrepo, runner

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

DOMAIN = ["10.0.7.1", "10.0.7.2", "10.0.7.3"]
DRIVER = aptrepo.DRIVER_VERSIONS["580"]


@dataclass
class Converged:
    roots: dict[str, Path]
    first: runner.Result
    second: runner.Result


@pytest.fixture(scope="module")
def converged(make_host, debian12_tarball, base_vars, chroot_wrapper, ansible_home, workdir) -> Converged:
    roots = {name: make_host(name, debian12_tarball) for name in ("hgx-b200", "gb200-tray")}
    for index in range(8):
        runner.fake_pci_device(roots["hgx-b200"], f"0000:{0x18 + index * 0x10:02x}:00.0", "2901", "0x030200")
    for index in range(4):
        runner.fake_pci_device(roots["gb200-tray"], f"0000:{0x01 + index:02x}:00.0", "2941", "0x030200")
    inventory = runner.write_inventory(
        workdir / "blackwell.yml",
        roots,
        chroot_wrapper,
        base_vars,
        host_vars={"gb200-tray": {"imex_nodes": DOMAIN}},
    )
    args = ("--skip-tags", "pytorch,nccl,rdma")
    first = runner.run_playbook("provision.yml", inventory, ansible_home("blackwell"), *args, forks=2)
    second = (
        runner.run_playbook("provision.yml", inventory, ansible_home("blackwell"), *args, forks=2)
        if first.rc == 0
        else first
    )
    print(f"\nBlackwell converge, 2 hosts: first run {first.seconds:.0f}s, second run {second.seconds:.0f}s")
    return Converged(roots, first, second)


def _query(root: Path) -> dict[str, str]:
    fields = "--showformat=${Package} ${Version} ${db:Status-Want}\n"
    out = runner.in_root(root, "dpkg-query", "--show", fields).stdout
    return {line.split()[0]: " ".join(line.split()[1:]) for line in out.splitlines() if line.strip()}


def test_both_runs_pass_and_the_second_changes_nothing(converged):
    assert converged.first.rc == 0, converged.first
    assert converged.second.rc == 0, converged.second
    changed = converged.second.changed()
    assert {host: changed.get(host) for host in converged.roots} == {"hgx-b200": 0, "gb200-tray": 0}, {
        h: converged.second.changed_tasks(h) for h in converged.roots}


def test_hgx_b200_gets_fabric_manager_nvlsm_and_libnvsdm_at_the_driver_version(converged):
    root = converged.roots["hgx-b200"]
    packages = _query(root)
    # The driver's exact version, although an older build of each is offered; held.
    assert packages["nvidia-fabricmanager-580"] == f"{DRIVER}-1 hold"
    assert packages["libnvsdm"] == f"{DRIVER}-1 hold"
    assert packages["nvlsm"] == f"{aptrepo.NVLSM_VERSIONS['amd64']} hold"
    assert packages["infiniband-diags"].endswith(" install")  # Debian's, not held
    assert packages["nvidia-headless-no-dkms-580-server-open"].endswith(" hold")  # open modules
    assert "nvidia-imex" not in packages
    assert (root / "etc/modules-load.d/nodecert-nvlink5.conf").read_text().splitlines()[-1] == "ib_umad"
    dropin = (root / "etc/systemd/system/nvidia-fabricmanager.service.d/nodecert-nvlink5.conf").read_text()
    assert "After=nvidia-persistenced.service systemd-modules-load.service" in dropin
    wants = root / "etc/systemd/system/multi-user.target.wants"
    unit = "nvidia-fabricmanager.service"
    assert os.readlink(wants / unit) == f"/lib/systemd/system/{unit}"
    assert "is hgx-b200: Fabric Manager with nvlsm, infiniband-diags, libnvsdm" in converged.first.output


def test_gb200_tray_gets_imex_with_the_domain_and_no_fabric_manager(converged):
    root = converged.roots["gb200-tray"]
    packages = _query(root)
    assert packages["nvidia-imex"] == f"{DRIVER}-1 hold"
    assert not [p for p in packages if p.startswith(("nvidia-fabricmanager", "nvlsm", "libnvsdm"))]
    assert (root / "etc/nvidia-imex/nodes_config.cfg").read_text() == "\n".join(DOMAIN) + "\n"
    wants = root / "etc/systemd/system/multi-user.target.wants"
    assert os.readlink(wants / "nvidia-imex.service") == "/lib/systemd/system/nvidia-imex.service"
    assert "After=nvidia-persistenced.service" in (
        root / "etc/systemd/system/nvidia-imex.service.d/nodecert.conf"
    ).read_text()
    assert "IMEX is enabled for the next boot with 3 node(s)" in converged.first.output
    skipped = "Fabric Manager skipped on gb200-tray: no NVSwitch on the PCI bus and platform gb200-nvl72-tray"
    assert skipped in converged.first.output
