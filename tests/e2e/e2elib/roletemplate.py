"""Evaluate the roles' variables with Ansible's own templating, without a play.

The regular expressions and package lists in a role's defaults/ and vars/ are Jinja expressions;
this renders them exactly as a play would (same Templar, same filters), with the facts a test
chooses. Fast enough to run over whole tables of package names.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# Ansible is imported when a test renders, not when this module is collected: ansible-core 2.19
# replaces sys.intern with an object of its own on import, and torch._dynamo, imported by the
# trainer tests' modules, refuses to start once it sees that (a collection error in one pytest
# process that collects both).

ROLES = Path(__file__).resolve().parents[3] / "playbooks" / "roles"


def _trusted(value: Any) -> Any:
    from ansible.template import trust_as_template

    # Variables from a role's files are templates a play would render; the loader alone does not
    # mark them so.
    if isinstance(value, str):
        return trust_as_template(value)
    if isinstance(value, list):
        return [_trusted(item) for item in value]
    if isinstance(value, dict):
        return {key: _trusted(item) for key, item in value.items()}
    return value


def role_variables(*roles: str) -> dict[str, Any]:
    """defaults/main.yml then vars/main.yml of each role, in order."""
    from ansible.parsing.dataloader import DataLoader

    loader = DataLoader()
    variables: dict[str, Any] = {}
    for role in roles:
        for part in ("defaults", "vars"):
            path = ROLES / role / part / "main.yml"
            if path.exists():
                variables.update(_trusted(loader.load_from_file(str(path))) or {})
    return variables


def render(expression: str, *roles: str, **facts: Any) -> Any:
    """The value of a Jinja expression over the roles' variables and the given facts."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    variables = {**role_variables(*roles), **facts}
    templar = Templar(loader=DataLoader(), variables=variables)
    return templar.template(trust_as_template("{{ " + expression + " }}"))


def render_text(text: str, *roles: str, **facts: Any) -> Any:
    """A template (a task's message, a file's text) rendered as a play would."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    variables = {"ansible_managed": "Ansible managed", **role_variables(*roles), **facts}
    templar = Templar(loader=DataLoader(), variables=variables)
    return templar.template(trust_as_template(text))


def render_file(template: Path, *roles: str, **facts: Any) -> str:
    """A role's template file rendered as the template module would (ansible_managed included)."""
    return render_text(template.read_text(), *roles, **facts)
