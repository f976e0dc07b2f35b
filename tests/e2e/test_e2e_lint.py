"""Static checks of the playbooks: ansible-lint's production profile, syntax of every playbook,
and role argument specs that agree with the roles' defaults."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
PLAYBOOKS = REPO / "playbooks"
VENV_BIN = REPO / ".venv" / "bin"
ROLES = sorted(p.name for p in (PLAYBOOKS / "roles").iterdir() if (p / "meta/argument_specs.yml").exists())
CLEAN_ENV = {
    "PATH": f"{VENV_BIN}:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
    "HOME": os.environ.get("HOME", "/root"),
    "ANSIBLE_NOCOLOR": "1",
}


def _tool(name: str) -> str:
    path = VENV_BIN / name
    if not path.exists():
        pytest.fail(f"{path} is missing: pip install -e '.[dev]'")
    return str(path)


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_ansible_lint_production_profile():
    proc = subprocess.run(
        [_tool("ansible-lint"), "--profile", "production", "--nocolor"],
        cwd=PLAYBOOKS,
        env=CLEAN_ENV,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-5000:]


@pytest.mark.e2e
@pytest.mark.parametrize(
    "playbook", sorted(p.name for p in PLAYBOOKS.glob("*.yml") if p.name != "requirements.yml")
)
def test_playbook_syntax(playbook):
    proc = subprocess.run(
        [
            _tool("ansible-playbook"),
            "--syntax-check",
            "-i",
            str(REPO / "inventory.example"),
            str(PLAYBOOKS / playbook),
        ],
        cwd=REPO,
        env=CLEAN_ENV,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("role", ROLES)
def test_argument_specs_agree_with_defaults(role):
    """Every default is specified with the same default value and a matching type, and every
    specified option is a default: the two documents of a role's interface cannot drift."""
    defaults = yaml.safe_load((PLAYBOOKS / "roles" / role / "defaults/main.yml").read_text()) or {}
    spec = yaml.safe_load((PLAYBOOKS / "roles" / role / "meta/argument_specs.yml").read_text())
    options = spec["argument_specs"]["main"]["options"]
    assert set(options) == set(defaults)
    python_types = {"str": str, "bool": bool, "int": int, "list": list, "dict": dict, "path": str}
    for name, option in options.items():
        assert name.startswith(f"{role}_"), f"{name} lacks the role prefix"
        assert option.get("description"), f"{name} has no description"
        assert option.get("default") == defaults[name], name
        assert isinstance(defaults[name], python_types[option["type"]]), name
        if "choices" in option and "{{" not in str(defaults[name]):
            # A list's choices are those of its elements (Ansible checks each one).
            values = defaults[name] if option["type"] == "list" else [defaults[name]]
            assert all(value in option["choices"] for value in values), name
