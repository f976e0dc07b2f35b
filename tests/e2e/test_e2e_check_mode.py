"""`provision.yml --check` on a fresh root must leave it byte-identical."""

from __future__ import annotations

import pytest
from e2elib import rootfs, runner

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

# Ansible's own working directory in the root (remote_tmp); everything else counts.
ANSIBLE_WORKDIR = ("root/.ansible",)


def test_check_mode_on_a_fresh_root_changes_nothing(
    make_host, debian12_tarball, base_vars, chroot_wrapper, ansible_home, workdir
):
    root = make_host("check-mode", debian12_tarball)
    runner.hgx_h100(root)  # the fullest path: open modules, Fabric Manager
    before = rootfs.tree_digest(root, exclude=ANSIBLE_WORKDIR)

    inventory = runner.write_inventory(
        workdir / "check-mode.yml", {"check-mode": root}, chroot_wrapper, base_vars
    )
    result = runner.run_playbook("provision.yml", inventory, ansible_home("check-mode"), "--check", "--diff")

    assert result.rc == 0, result
    assert result.recap["check-mode"]["changed"] > 0, "check mode should report what it would change"
    after = rootfs.tree_digest(root, exclude=ANSIBLE_WORKDIR)
    changed = rootfs.changed_paths(before, after)
    assert changed == [], f"check mode changed the root: {changed[:20]}"
    # What the real run would do is still said.
    assert "a real run installs cuda-toolkit-12-8" in result.output
