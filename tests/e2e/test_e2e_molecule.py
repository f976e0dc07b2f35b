"""The Molecule scenario (playbooks/molecule/default) runs here as users would run it:
`molecule converge` (create: roots unpacked from the cached Debian 12 tarball, stand-in NVIDIA
repository served; converge: provision.yml over the chroot connection), `molecule verify`, and
`molecule destroy`, with a stand-in torch wheel (NODECERT_MOLECULE_STANDIN_TORCH=1). Idempotence
is not repeated here (the Debian cluster test checks changed=0); `molecule test` runs the whole
sequence including it (measured: docs/provisioning.md).
"""

from __future__ import annotations

import re
import subprocess
import time

import pytest
from e2elib import runner

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

PLAYBOOKS = runner.REPO / "playbooks"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def molecule(action: str, env: dict) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [str(runner.VENV_BIN / "molecule"), action],
        cwd=PLAYBOOKS,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=600,
    )
    proc.stdout = ANSI.sub("", proc.stdout)
    return proc


def test_molecule_converge_and_verify(debian12_tarball, wheels, workdir):
    if not (runner.VENV_BIN / "molecule").exists():
        pytest.fail(f"no molecule in {runner.VENV_BIN}: pip install -e '.[dev]'")
    home = workdir / "home" / "molecule"
    home.mkdir(parents=True)
    # Clean environment (no controller pip variables), the venv's bin/ first (Molecule looks for
    # ansible-config on PATH), and a HOME of its own: the scenario's ephemeral directory (roots,
    # repository) lives under $HOME and cannot meet a user's own run.
    env = {
        "PATH": f"{runner.VENV_BIN}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "ANSIBLE_NOCOLOR": "1",
        "NO_COLOR": "1",
        "ANSIBLE_COLLECTIONS_PATH": str(home / "collections"),
        # A stand-in wheel named torch instead of the real ~190 MB one: this test is about the
        # Molecule wiring (the Debian cluster test installs real torch); about 1 min saved.
        "NODECERT_MOLECULE_STANDIN_TORCH": "1",
    }
    start = time.monotonic()
    try:
        converge = molecule("converge", env)
        assert converge.returncode == 0, converge.stdout[-8000:]
        # Converge reached both platforms (without groups: it would match no host and succeed).
        for host in ("molecule-hgx", "molecule-image"):
            recap = rf"{host}\s+: ok=\d+\s+changed=[1-9]\d*\s+unreachable=0\s+failed=0"
            assert re.search(recap, converge.stdout), converge.stdout[-8000:]
        verify = molecule("verify", env)
        assert verify.returncode == 0, verify.stdout[-8000:]
        for host in ("molecule-hgx", "molecule-image"):
            assert re.search(rf"{host}\s+: ok=4\s+changed=0\s+unreachable=0\s+failed=0", verify.stdout), (
                verify.stdout[-8000:]
            )
    finally:
        destroy = molecule("destroy", env)
        print(f"\nmolecule converge + verify + destroy: {time.monotonic() - start:.0f}s")
    assert destroy.returncode == 0, destroy.stdout[-8000:]
    # Molecule's ephemeral directory for the scenario: $HOME/.ansible/tmp/molecule.<hash>.default
    # (Molecule 25; older releases used $HOME/.cache/molecule/<project>/default).
    ephemerals = [*home.glob(".ansible/tmp/molecule.*.default"), *home.glob(".cache/molecule/*/default")]
    assert len(ephemerals) == 1, ephemerals
    ephemeral = ephemerals[0]
    assert (ephemeral / "inventory").exists(), "not Molecule's ephemeral directory"
    assert not (ephemeral / "roots").exists() and not (ephemeral / "repo.info").exists()
    leftover = subprocess.run(["pgrep", "-f", f"e2elib.aptrepo {ephemeral}"], capture_output=True, text=True)
    assert leftover.stdout == "", f"the stand-in repository server outlived destroy: {leftover.stdout}"
