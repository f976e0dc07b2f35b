"""playbooks/verify.yml as a person lives it, run for real by ansible-playbook (no GPU, no SSH
server): a host that refuses SSH is MISSING in the fleet report with its SSH error, every host
unreachable still gives a fleet report, and while the checks run the play says which check each
node is in (the file NODECERT_PROGRESS names; that `python -m checks` writes it is tested in
test_slurm_wrapper.py::test_the_checks_write_the_check_they_start)."""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from checks.node import registry

ROOT = Path(__file__).resolve().parents[2]
PLAYBOOK = ROOT / "playbooks" / "verify.yml"
ANSIBLE = Path(sys.executable).with_name("ansible-playbook")
# 127.0.0.2 port 1: nothing listens, so ssh fails at once with "Connection refused"
FAR = "ansible_host=127.0.0.2 ansible_port=1 ansible_connection=ssh ansible_ssh_timeout=2"

pytestmark = pytest.mark.skipif(not ANSIBLE.exists() or shutil.which("ssh") is None,
                                reason="needs ansible-playbook in the venv and an ssh client")


def _play(tmp_path: Path, inventory: str, **extra: object) -> tuple[subprocess.CompletedProcess[str], dict]:
    inv = tmp_path / "inventory.ini"
    inv.write_text(f"[gpu_nodes]\n{inventory}\n")
    reports = tmp_path / "reports"
    extra = {"verify_reports_dir": str(reports), "verify_crosshost": "none", "verify_level": "quick",
             "verify_run_id": "r1", **extra}
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(tmp_path),
           "LANG": "C.UTF-8", "ANSIBLE_NOCOLOR": "1", "ANSIBLE_HOST_KEY_CHECKING": "False",
           "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-local"),
           # async_status finds a local job under the passwd home, the job writes under $HOME:
           # one directory for both
           "ANSIBLE_ASYNC_DIR": str(tmp_path / "async")}
    proc = subprocess.run([str(ANSIBLE), "-i", str(inv), str(PLAYBOOK), "-e", json.dumps(extra)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=240, check=False)
    fleet_json = reports / "r1" / "meta" / "fleet.json"
    assert fleet_json.is_file(), proc.stdout[-4000:] + proc.stderr[-2000:]
    return proc, json.loads(fleet_json.read_text())


def test_every_host_unreachable_still_gives_a_fleet_report(tmp_path: Path) -> None:
    proc, fleet = _play(tmp_path, f"far1 {FAR}\nfar2 {FAR}")
    assert proc.returncode == 2, proc.stdout[-3000:]  # the hosts fail (with their error), not exit 4
    hosts = {h["host"]: (h["status"], h["reason"]) for h in fleet["hosts"]}
    assert set(hosts) == {"far1", "far2"}
    for status, reason in hosts.values():
        assert status == "MISSING"
        assert reason.startswith("unreachable: ") and "port 1: Connection refused" in reason, reason
    assert fleet["verdict"] == "FAIL"
    assert "MISSING 2" in proc.stdout  # the fleet summary the play shows
    assert "Unreachable: Failed to connect to the host via ssh" in proc.stdout
    run = tmp_path / "reports" / "r1" / "meta"
    assert (run / "fleet.html").is_file() and (run / "fleet.xml").is_file()


@pytest.mark.parametrize("interval", [1, 0])
def test_progress_while_the_checks_run_and_one_host_unreachable(tmp_path: Path, interval: int) -> None:
    """A node whose run takes a few seconds: the wait says which check it is in, every second
    here (verify_progress_interval); the other host refuses SSH and is MISSING. With 0 (and
    through a chroot connection) the checks run in the foreground, without progress."""
    slow = tmp_path / "python"
    # what the watchdog's worker does before its first check, then a slow start
    slow.write_text(f'#!/bin/sh\necho gpu-count > "$NODECERT_PROGRESS"\nsleep 4\n'
                    f'exec {sys.executable} "$@"\n')
    slow.chmod(0o755)
    # With 0, a neighbour also holds a lock on the shared temporary directory the whole time:
    # the node writes its report in a private directory of its own, so it neither waits nor fails.
    shared = os.open(os.environ.get("TMPDIR", "/tmp"), os.O_RDONLY)
    try:
        if interval == 0:
            fcntl.flock(shared, fcntl.LOCK_EX | fcntl.LOCK_NB)
        proc, fleet = _play(tmp_path, f"near ansible_connection=local "
                                      f"ansible_python_interpreter={sys.executable}\nfar {FAR}",
                            verify_python=str(slow), verify_progress_interval=interval,
                            verify_extra_args=["--simulate", "cpu-only-healthy"])
    finally:
        os.close(shared)
    # the check id the run wrote last (gpu-count from the stand-in, then the real run's own)
    shown = re.findall(r'"msg": "near: running ([a-z0-9-]+) \(about (\d+) s after the start\)"', proc.stdout)
    if interval:
        assert shown, proc.stdout[-4000:]
        assert {check for check, _ in shown} <= set(registry.load_all())
    else:
        assert not shown
        foreground = re.search(r"TASK \[Run the checks \(quick\)\] \*+\nok: \[near\]", proc.stdout)
        assert foreground, proc.stdout[-4000:]
    hosts = {h["host"]: h for h in fleet["hosts"]}
    assert hosts["near"]["status"] == "PASS"
    assert hosts["far"]["status"] == "MISSING" and "Connection refused" in hosts["far"]["reason"]
    assert (tmp_path / "reports" / "r1" / "near.json").is_file()
    assert proc.returncode == 2
    leftovers = [p for p in Path(os.environ.get("TMPDIR", "/tmp")).glob("nodecert-verify.*")
                 if p.stat().st_mtime >= (tmp_path / "inventory.ini").stat().st_mtime]
    assert leftovers == []  # the private directory of the report and the progress file was removed
