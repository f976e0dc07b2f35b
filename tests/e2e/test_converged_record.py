"""The fast path of a rerun (playbooks/roles/preflight: library/ and action_plugins/
nodecert_converged.py), on this machine: the module run as Ansible runs it (its arguments in a
file), and the action plugin through a real ansible-playbook over the local connection. What it
must get right: a node unchanged since the record takes the fast path; any change the roles
would repair (a file, a venv's distributions, the inputs) runs every task and says what changed;
what changes on its own (bytecode, the run's own registered variables and facts, Ansible's
per-run `omit`) does not. The whole path on real roots, with drift repaired: test_e2e_provision."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "playbooks" / "roles" / "preflight"
MODULE = ROLE / "library" / "nodecert_converged.py"
ANSIBLE_PLAYBOOK = Path(sys.executable).with_name("ansible-playbook")


def load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def converged():
    return load(MODULE, "nodecert_converged_module")


@pytest.fixture(scope="module")
def action():
    return load(ROLE / "action_plugins" / "nodecert_converged.py", "nodecert_converged_action")


def run_module(tmp_path: Path, **args) -> dict:
    arguments = tmp_path / "args.json"
    arguments.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    proc = subprocess.run(
        [sys.executable, str(MODULE), str(arguments)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture
def node(tmp_path: Path) -> dict:
    """A node's managed paths: a config file and a venv with one distribution."""
    etc = tmp_path / "etc"
    (etc / "modprobe.d").mkdir(parents=True)
    (etc / "modprobe.d" / "nodecert-nvidia-options.conf").write_text("options nvidia NVreg_X=1\n")
    site = tmp_path / "venv" / "lib" / "python3.12" / "site-packages"
    (site / "torch" / "__pycache__").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("")
    (site / "torch-2.13.0.dist-info").mkdir()
    (site / "torch-2.13.0.dist-info" / "RECORD").write_text("torch/__init__.py,,\n")
    (tmp_path / "venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    return {
        "record": str(tmp_path / "state" / "converged.json"),
        "paths": [str(etc), str(tmp_path / "venv")],
        "inputs": "inputs-1",
    }


def test_no_record_runs_every_task(tmp_path, node):
    result = run_module(tmp_path, **node)
    assert result["converged"] is False and result["reason"] == "no record of a converged run"
    assert not Path(node["record"]).exists()  # reading writes nothing


def test_unchanged_node_takes_the_fast_path_and_keeps_its_notes(tmp_path, node):
    note = "Loaded driver none is not the installed 580.126.20: reboot it yourself."
    recorded = run_module(tmp_path, state="record", notes=[note], **node)
    assert recorded["recorded"] and recorded["notes"] == [note]
    # Digests of every file under /etc (/etc/shadow too): root's alone.
    assert oct(Path(node["record"]).stat().st_mode & 0o777) == "0o600"
    result = run_module(tmp_path, **node)
    assert result["converged"] is True and result["reason"] == ""
    assert result["notes"] == [note] and result["recorded"] == recorded["recorded"]


def test_changed_file_is_named(tmp_path, node):
    run_module(tmp_path, state="record", **node)
    Path(node["paths"][0], "modprobe.d", "nodecert-nvidia-options.conf").write_text("options nvidia\n")
    (Path(node["paths"][0]) / "modprobe.d" / "blacklist-extra.conf").write_text("blacklist x\n")
    result = run_module(tmp_path, **node)
    assert result["converged"] is False
    assert result["reason"] == (
        f"changed since: files ({node['paths'][0]}/modprobe.d/blacklist-extra.conf, "
        f"{node['paths'][0]}/modprobe.d/nodecert-nvidia-options.conf)"
    )


def test_mode_change_counts(tmp_path, node):
    run_module(tmp_path, state="record", **node)
    os.chmod(Path(node["paths"][0], "modprobe.d", "nodecert-nvidia-options.conf"), 0o600)
    assert run_module(tmp_path, **node)["converged"] is False


def test_venv_counts_by_distributions_not_bytecode(tmp_path, node):
    run_module(tmp_path, state="record", **node)
    site = Path(node["paths"][1], "lib", "python3.12", "site-packages")
    (site / "torch" / "__pycache__" / "__init__.cpython-312.pyc").write_bytes(b"\0")
    (site / "torch" / "_generated.py").write_text("")  # inside a package: pip's business
    assert run_module(tmp_path, **node)["converged"] is True
    (site / "torch-2.13.0.dist-info").rename(site / "torch-2.14.0.dist-info")
    result = run_module(tmp_path, **node)
    assert result["converged"] is False and "torch-2.14.0.dist-info" in result["reason"]


def test_other_inputs_run_every_task(tmp_path, node):
    run_module(tmp_path, state="record", **node)
    result = run_module(tmp_path, **{**node, "inputs": "inputs-2"})
    assert result["converged"] is False
    assert result["reason"] == "the playbooks, this project's sources or the host's variables changed"


def test_a_record_that_cannot_be_written_warns_and_fails_nothing(tmp_path, node):
    Path(node["record"]).parent.write_text("a file where the record's directory should be")
    result = run_module(tmp_path, state="record", **node)
    assert result["recorded"] == ""
    assert "could not record the converged node" in json.dumps(result["warnings"])


@pytest.mark.parametrize("content", ["{not json", "[]", json.dumps({"version": 0})])
def test_unreadable_or_foreign_record_runs_every_task(tmp_path, node, content):
    Path(node["record"]).parent.mkdir(parents=True)
    Path(node["record"]).write_text(content)
    result = run_module(tmp_path, **node)
    assert result["converged"] is False
    assert result["reason"] in ("its record is unreadable", "its record is from another nodecert version")


def test_volatile_files_and_the_record_itself_are_left_out(converged, tmp_path):
    (tmp_path / "a").write_text("x")
    listed = converged.files([str(tmp_path)], str(tmp_path / "record.json"))
    (tmp_path / "record.json").write_text("{}")
    assert converged.files([str(tmp_path)], str(tmp_path / "record.json")) == listed
    assert "/etc/adjtime" in converged.VOLATILE and "/etc/resolv.conf" in converged.VOLATILE


def test_sources_digest_ignores_bytecode_and_sees_content(action, tmp_path):
    (tmp_path / "checks").mkdir()
    (tmp_path / "checks" / "a.py").write_text("x = 1\n")
    before = action.sources_digest([str(tmp_path / "checks"), str(tmp_path / "missing")])
    (tmp_path / "checks" / "__pycache__").mkdir()
    (tmp_path / "checks" / "__pycache__" / "a.cpython-312.pyc").write_bytes(b"\0")
    assert action.sources_digest([str(tmp_path / "checks"), str(tmp_path / "missing")]) == before
    (tmp_path / "checks" / "a.py").write_text("x = 2\n")
    assert action.sources_digest([str(tmp_path / "checks"), str(tmp_path / "missing")]) != before


PLAYBOOK = """
- name: A run that registers and sets facts, as the roles do
  hosts: gpu_nodes
  gather_facts: true
  gather_subset: [min]
  tasks:
    - name: Register something
      ansible.builtin.command: "true"
      register: registered_during_the_run
      changed_when: false
    - name: Set a fact
      ansible.builtin.set_fact:
        fact_of_the_run: "{{ 999999 | random }}"
    - name: Record
      when: lookup('ansible.builtin.env', 'RECORD') != 'no'
      nodecert_converged:
        state: record
        sources: ["{{ sources }}"]
        paths: ["{{ managed }}"]
        record: "{{ record }}"

- name: The next play compares
  hosts: gpu_nodes
  gather_facts: false
  tasks:
    - name: Compare
      nodecert_converged:
        sources: ["{{ sources }}"]
        paths: ["{{ managed }}"]
        record: "{{ record }}"
        force: "{{ nodecert_full_run | default(false) | bool }}"
      register: compared
    - name: Say
      ansible.builtin.debug:
        msg: "COMPARED {{ compared.converged }} {{ compared.reason }}"
"""


def play(tmp_path: Path, *args: str, record: bool = True) -> str:
    """Runs PLAYBOOK (recording first unless told not to); what the compare said."""
    if not (tmp_path / "sources").exists():
        (tmp_path / "sources").mkdir()
        (tmp_path / "sources" / "role.yml").write_text("---\n")
    (tmp_path / "managed").mkdir(exist_ok=True)
    (tmp_path / "play.yml").write_text(PLAYBOOK)
    (tmp_path / "inventory.yml").write_text(
        json.dumps(
            {
                "gpu_nodes": {
                    "hosts": {
                        "node": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
                    },
                    "vars": {
                        "sources": str(tmp_path / "sources"),
                        "managed": str(tmp_path / "managed"),
                        "record": str(tmp_path / "converged.json"),
                        "preflight_min_free_disk_mb": 1024,
                    },
                }
            }
        )
    )
    env = {
        **os.environ,
        "ANSIBLE_LIBRARY": str(ROLE / "library"),
        "ANSIBLE_ACTION_PLUGINS": str(ROLE / "action_plugins"),
        "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-tmp"),
        "ANSIBLE_NOCOLOR": "1",
        "RECORD": "yes" if record else "no",
    }
    proc = subprocess.run(
        [str(ANSIBLE_PLAYBOOK), "-i", str(tmp_path / "inventory.yml"), str(tmp_path / "play.yml"), *args],
        capture_output=True, text=True, env=env, cwd=tmp_path, check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    said = next(line for line in proc.stdout.splitlines() if "COMPARED" in line)
    return said.split("COMPARED ", 1)[1].rstrip('"')


@pytest.mark.skipif(not ANSIBLE_PLAYBOOK.exists(), reason="ansible-playbook is not in this venv")
def test_variables_of_the_run_are_not_inputs_but_the_inventorys_are(tmp_path):
    # Registered variables, set_fact, facts and `omit` differ between the two plays' views; the
    # host's inventory variables and the sources are the same: the fast path, in the run that
    # recorded and in the next.
    assert play(tmp_path) == "True "
    assert play(tmp_path, record=False) == "True "
    # An extra variable is an input, and so is the content of the sources.
    assert "the host's variables changed" in play(tmp_path, "-e", "nvidia_driver_branch=570", record=False)
    assert play(tmp_path, "-e", "nodecert_full_run=false", record=False) == "True "
    (tmp_path / "sources" / "role.yml").write_text("---\n# changed\n")
    assert "the playbooks, this project's sources" in play(tmp_path, record=False)


@pytest.mark.skipif(not ANSIBLE_PLAYBOOK.exists(), reason="ansible-playbook is not in this venv")
def test_full_run_switch_check_mode_and_tags_run_every_task(tmp_path):
    # A run of every task records the node all the same.
    assert "nodecert_full_run is set" in play(tmp_path, "-e", "nodecert_full_run=true")
    recorded = (tmp_path / "converged.json").read_text()
    # Check mode and tags compare nothing and record nothing: a record vouches for every task.
    (tmp_path / "managed" / "new.conf").write_text("x\n")
    assert "check mode runs every task" in play(tmp_path, "--check")
    assert "a run limited by tags" in play(tmp_path, "--tags", "all,never")
    assert (tmp_path / "converged.json").read_text() == recorded
