"""`make verify INVENTORY=...` refuses an inventory that would make every play skip (and the run
pass): missing, unparsable, empty, or with a host name that is not one node name. Exit 2 and one
line from us (make adds its own `*** Error 2` line, as for `make provision`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not Path(sys.executable).with_name("ansible-inventory").exists(),
                    reason="needs ansible-core in this venv")
@pytest.mark.parametrize(("text", "message"), [
    (None, "does not exist"),
    ("[gpu_nodes\nnode1 ansible_host=\n=[[\n", "does not parse"),
    ("", "lists no hosts in group gpu_nodes"),
    ("[other]\nnode1\n", "lists no hosts in group gpu_nodes"),
    ("[gpu_nodes]\nnode1\n../../tmp/x\n", "is not a node name"),
    ("[gpu_nodes]\ngpu[01:02]x\n", ""),  # an Ansible range is expanded to gpu01x, gpu02x: fine
])
def test_make_verify_refuses_a_bad_inventory(tmp_path: Path, text: str | None, message: str) -> None:
    inventory = tmp_path / "inventory.ini"
    if text is not None:
        inventory.write_text(text)
    # VENV: this interpreter's venv, so nothing is installed; --list-hosts: the playbook only
    # lists, it connects nowhere. Run as an operator would, not as a sub-make of `make test`
    # (whose MAKELEVEL would have make name itself "make[1]").
    env = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}
    proc = subprocess.run(["make", "--no-print-directory", "-C", str(ROOT), "verify",
                           f"VENV={sys.prefix}", f"INVENTORY={inventory}", "ARGS=--list-hosts"],
                          capture_output=True, text=True, timeout=120, check=False, env=env)
    if not message:
        assert proc.returncode == 0, proc.stderr
        assert "gpu01x" in proc.stdout
        return
    assert proc.returncode == 2, proc.stdout + proc.stderr
    ours = [line for line in proc.stderr.splitlines() if not line.startswith("make: ***")]
    assert len(ours) == 1 and ours[0].startswith("error: ") and message in ours[0], proc.stderr
