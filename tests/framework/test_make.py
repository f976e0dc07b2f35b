"""The Makefile entry points a user types, end to end on this machine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # importlib mode: tests/ for hostdisk
from hostdisk import Window

from checks.report_schema import schema

ROOT = Path(__file__).resolve().parents[2]


def make(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["make", "--no-print-directory", "-C", str(ROOT), *args],
                          capture_output=True, text=True, timeout=timeout, check=False)


def test_make_verify_quick_on_this_host(tmp_path: Path) -> None:
    report = tmp_path / "host.json"
    junit = tmp_path / "junit.xml"
    with Window() as disk:
        proc = make("verify", "LEVEL=quick", f"ARGS=--json {report} --junit {junit}")
    doc = json.loads(report.read_text())
    jsonschema.validate(doc, schema())
    # disk-space judges this host's shared disk: what it must say is read apart (tests/hostdisk.py).
    (space,) = [c for c in doc["checks"] if c["id"] == "disk-space"]
    assert space["status"] in disk.allowed(), space["results"]
    full = space["status"] == "FAIL"
    assert proc.returncode == (2 if full else 0), proc.stdout + proc.stderr
    assert doc["backend"] == "linux" and doc["verdict"] == ("FAIL" if full else "PASS")
    assert junit.read_text().startswith("<?xml")
    assert "os-supported" in proc.stdout


def test_make_provision_without_inventory_says_how(tmp_path: Path) -> None:
    proc = make("provision", f"INVENTORY={tmp_path / 'missing'}")
    assert proc.returncode == 2
    assert "copy inventory.example" in proc.stderr


def _system_deps(tmp_path: Path, packages: list[str], *, user: str | None = None
                 ) -> subprocess.CompletedProcess[str]:
    import tempfile

    # pytest's tmp_path sits under a 0700 directory the unprivileged user cannot enter.
    shared = Path(tempfile.mkdtemp(prefix="nodecert-deps-", dir="/tmp"))
    shared.chmod(0o755)
    listing = shared / "apt-packages.txt"
    listing.write_text("# test list\n" + "\n".join(packages) + "\n")
    listing.chmod(0o644)
    cmd = ["bash", str(ROOT / ".ci" / "system-deps.sh")]
    if user:  # drop root for the run (setpriv is util-linux, present wherever dpkg is)
        cmd = ["setpriv", f"--reuid={user}", "--regid=nogroup", "--clear-groups", *cmd]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False,
                              env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
                                   "NODECERT_APT_PACKAGES": str(listing)})
    finally:
        import shutil

        shutil.rmtree(shared)


def test_system_deps_does_nothing_when_everything_is_installed(tmp_path: Path) -> None:
    proc = _system_deps(tmp_path, ["dpkg", "bash"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "" and proc.stderr == ""


def test_system_deps_without_root_names_the_one_command(tmp_path: Path) -> None:
    import os
    import shutil

    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        import pytest

        pytest.skip("needs root to drop to an unprivileged user")
    missing = "nodecert-no-such-package"
    proc = _system_deps(tmp_path, ["dpkg", missing], user="nobody")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert f"sudo apt-get install -y --no-install-recommends {missing}" in lines[0]
    assert "dpkg " not in lines[0].split("installed:")[1].split(";")[0]
