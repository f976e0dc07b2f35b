# Copyright: nodecert contributors
# Apache License 2.0 (see pyproject.toml)
"""Action plugin: the controller half of nodecert_converged. It digests what the node is
provisioned from (the playbooks, this project's sources, the host's variables, ansible-core's
version), says when a run must run every task anyway, and runs the module on the node.

A run takes the fast path only when the node is what the last converged run left and the inputs
are the ones it ran from: then every task would find its work done (the second run's changed=0,
which the end-to-end tests assert for each release). Anything else runs every task."""

from __future__ import annotations

import hashlib
import json
import os

from ansible import context
from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible.release import __version__ as ANSIBLE_VERSION

# Variables that are not inputs: Ansible's own (facts, connection settings, magic variables
# such as `omit`, whose value changes every run), and the switch that asks for a full run.
NOT_INPUTS = frozenset(
    [
        "groups", "group_names", "inventory_hostname", "inventory_hostname_short", "inventory_dir",
        "inventory_file", "omit", "playbook_dir", "nodecert_full_run",
    ]
)
SKIPPED_NAMES = frozenset(["__pycache__", ".git", ".pytest_cache", ".mypy_cache", ".ruff_cache"])


def sources_digest(paths: list[str]) -> str:
    """Every file under `paths` by relative name and content (bytecode and VCS data left out)."""
    digest = hashlib.sha256()
    for top in paths:
        digest.update(f"\0top {top}\0".encode())
        if os.path.isfile(top):
            with open(top, "rb") as handle:
                digest.update(handle.read())
            continue
        if not os.path.isdir(top):
            digest.update(b"absent")
            continue
        for directory, subdirs, names in os.walk(top):
            subdirs[:] = sorted(d for d in subdirs if d not in SKIPPED_NAMES)
            for name in sorted(n for n in names if not n.endswith(".pyc")):
                path = os.path.join(directory, name)
                digest.update(f"\0{os.path.relpath(path, top)}\0".encode())
                if os.path.isfile(path):
                    with open(path, "rb") as handle:
                        digest.update(handle.read())
    return digest.hexdigest()


def variables_digest(task_vars: dict) -> str:
    """The host's variables as the inventory, its group_vars and host_vars and the extra vars set
    them (hostvars without a play: no role defaults, which the playbooks' digest covers), before
    templating: a template's inputs are variables too, or facts, which the node's state covers.
    Left out: facts, what set_fact and register added during this run, Ansible's own variables,
    and the roles' internal ones (named with a leading underscore)."""
    hostvars = task_vars["hostvars"]
    host = task_vars["inventory_hostname"]
    raw = hostvars.raw_get(host)
    manager = hostvars._variable_manager
    added = set(manager._nonpersistent_fact_cache.get(host, {})) | set(manager._vars_cache.get(host, {}))
    added |= set(raw.get("ansible_facts", {}))
    chosen = {
        str(name): raw[name]
        for name in raw
        if not str(name).startswith(("ansible_", "_", "discovered_interpreter"))
        and name not in NOT_INPUTS
        and name not in added
    }
    return hashlib.sha256(json.dumps(chosen, sort_keys=True, default=str).encode()).hexdigest()


def full_run_reason(args: dict, task_vars: dict, check_mode: bool) -> str:
    """Why this run must run every task (state=read), or may not write the record (state=record):
    a record certifies that every task ran and found nothing left to do. Empty when neither."""
    if args.get("force") and args.get("state", "read") == "read":
        return "nodecert_full_run is set"
    if check_mode:
        return "check mode runs every task"
    if list(task_vars.get("ansible_run_tags", ["all"])) != ["all"] or task_vars.get("ansible_skip_tags"):
        return "a run limited by tags runs those tasks"
    if context.CLIARGS.get("start_at_task") or context.CLIARGS.get("step"):
        return "a run with --start-at-task or --step runs those tasks"
    return ""


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(["state", "sources", "paths", "record", "notes", "force"])

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        args = self._task.args
        state = args.get("state", "read")
        if state not in ("read", "record"):
            raise AnsibleActionFail(f"state must be read or record, not {state!r}")
        reason = full_run_reason(args, task_vars, bool(self._play_context.check_mode))
        if reason:
            result.update(changed=False, converged=False, recorded="", notes=[], reason=reason)
            return result
        try:
            variables = variables_digest(task_vars)
        except (AttributeError, KeyError, TypeError) as error:  # another ansible-core's internals
            result.update(changed=False, converged=False, recorded="", notes=[],
                          reason=f"cannot read the host's variables ({type(error).__name__}: {error})")
            return result
        inputs = hashlib.sha256(
            "\n".join([ANSIBLE_VERSION, sources_digest(list(args.get("sources", []))), variables]).encode()
        ).hexdigest()
        module_args = {"state": state, "inputs": inputs}
        module_args.update({k: args[k] for k in ("paths", "record", "notes") if k in args})
        result.update(
            self._execute_module(
                module_name="nodecert_converged", module_args=module_args, task_vars=task_vars
            )
        )
        return result
