"""The root lint configuration agrees with `make lint`: ansible-lint run at the repository root
(pre-commit, editors) lints playbooks/ only, with the profile the Makefile asks for."""

from __future__ import annotations

import configparser
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def test_root_ansible_lint_config_matches_make_lint() -> None:
    root = yaml.safe_load((ROOT / ".ansible-lint").read_text())
    playbooks = yaml.safe_load((ROOT / "playbooks" / ".ansible-lint").read_text())
    make_profile = re.search(r"ansible-lint\"? --profile (\w+)", (ROOT / "Makefile").read_text())
    assert make_profile, "make lint no longer names an ansible-lint profile"
    assert root["profile"] == playbooks["profile"] == make_profile.group(1)
    excluded = {p.rstrip("/") for p in root["exclude_paths"]}
    other = {p.name for p in ROOT.iterdir() if p.is_dir() and p.name != "playbooks"
             and not p.name.startswith(".")} | {".cache", ".ci", ".venv"}
    assert other <= excluded, f"scanned by a root ansible-lint: {sorted(other - excluded)}"
    assert "playbooks" not in excluded


def test_pre_commit_runs_ruff_mypy_and_ansible_lint_locally() -> None:
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    hooks = {h["id"]: h for repo in config["repos"] if repo["repo"] == "local" for h in repo["hooks"]}
    assert {"ruff", "mypy", "ansible-lint"} <= set(hooks)
    assert all(h["language"] == "system" and ".venv/bin/" in h["entry"] for h in hooks.values())
    assert [r["repo"] for r in config["repos"]] == ["local"], "a hook that needs the network"


def test_ansible_cfg_does_not_fail_a_root_ansible_lint() -> None:
    """ansible-lint's syntax check runs `ansible-playbook --syntax-check` without an inventory,
    with ansible.cfg read at the root, and turns off only `any_unparsed_is_failed` for itself:
    `unparsed_is_failed = True` failed every playbook and role there (15 internal-error)."""
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "ansible.cfg")
    assert not cfg.getboolean("inventory", "unparsed_is_failed", fallback=False)
    # ... while an inventory no plugin parses still stops `make provision` with its parse error.
    assert cfg.getboolean("inventory", "any_unparsed_is_failed", fallback=False)
    hook = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())["repos"][0]["hooks"]
    assert [h["entry"] for h in hook if h["id"] == "ansible-lint"] == [".venv/bin/ansible-lint"]
