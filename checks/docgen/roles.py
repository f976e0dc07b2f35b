"""Role READMEs generated from each role's meta/argument_specs.yml (and what its files say).

    python -m checks.docgen.roles            # list the roles and whether their README is current
    python -m checks.docgen.roles --write    # (re)write playbooks/roles/<role>/README.md
    python -m checks.docgen.roles --check    # exit 1 when a README is out of date

Sources, so nothing is typed twice: what the role does and every variable come from the spec;
what it installs from a `# installs:` comment block at the top of the spec (argument_specs
admits no extra keys, ansible-lint's schema forbids them), cross-checked against the literal
package names in its apt/pip tasks and its `*_packages` defaults; tags from tasks/main.yml and the
playbooks that apply the role; reboots from handlers (or tasks) using the reboot module and the
tasks that notify them.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLES = ROOT / "playbooks" / "roles"
PLAYBOOKS = ROOT / "playbooks"
GENERATOR = "python -m checks.docgen.roles --write"
REBOOT_MODULES = {"ansible.builtin.reboot", "reboot"}
PACKAGE_MODULES = {"ansible.builtin.apt", "apt", "ansible.builtin.package", "package",
                   "ansible.builtin.pip", "pip"}
# Task keys that are not the module (everything else with a dict/str value may be).
TASK_KEYWORDS = {"name", "when", "tags", "notify", "register", "loop", "loop_control", "vars",
                 "become", "become_user", "delegate_to", "run_once", "check_mode", "changed_when",
                 "failed_when", "environment", "throttle", "listen", "block", "rescue", "always",
                 "no_log", "ignore_errors", "retries", "delay", "until", "args", "module_defaults",
                 "any_errors_fatal", "diff", "timeout", "with_items", "local_action"}


class SpecError(Exception):
    """A role's files cannot be read into a README; the message names the file."""


@dataclass
class Role:
    name: str
    spec: dict[str, Any]
    installs: list[str] | None  # None: no `# installs:` block
    tags: list[tuple[str, str, str]]  # (tag, what, where)
    reboots: list[str]
    depends: list[str]
    problems: list[str] = field(default_factory=list)


# --- reading ---------------------------------------------------------------------------------

def _load(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text())
    except FileNotFoundError:
        return None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise SpecError(f"{path.relative_to(ROOT)}{where}: not valid YAML") from None


def tasks_of(path: Path) -> list[dict[str, Any]]:
    """Every task in a task file, blocks flattened."""
    out: list[dict[str, Any]] = []

    def walk(items: Any) -> None:
        for task in items or []:
            if not isinstance(task, dict):
                continue
            out.append(task)
            for key in ("block", "rescue", "always"):
                walk(task.get(key))

    walk(_load(path))
    return out


def _module(task: dict[str, Any]) -> tuple[str, Any]:
    for key, value in task.items():
        if key not in TASK_KEYWORDS:
            return key, value
    return "", None


def installs_block(text: str) -> list[str] | None:
    """Items of the `# installs:` comment block; [] for `# installs: nothing ...`."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"#\s*installs:\s*(.*)$", line.strip())
        if not m:
            continue
        if m.group(1).strip():
            return [m.group(1).strip()]
        items: list[str] = []
        for follow in lines[i + 1:]:
            body = re.match(r"#(\s+)(.*)$", follow.strip())
            if not body or not body.group(2):
                break
            if body.group(2).startswith("- "):
                items.append(body.group(2)[2:].strip())
            elif items:  # continuation line of the item above
                items[-1] += " " + body.group(2).strip()
            else:
                break
        return items
    return None


def _literal_packages(role_dir: Path) -> list[tuple[str, str]]:
    """(package, file) for package names written literally (no Jinja) in apt/pip tasks."""
    found = []
    for path in sorted((role_dir / "tasks").glob("*.yml")):
        for task in tasks_of(path):
            module, args = _module(task)
            if module not in PACKAGE_MODULES or not isinstance(args, dict):
                continue
            names = args.get("name", args.get("pkg", []))
            for name in names if isinstance(names, list) else [names]:
                if isinstance(name, str) and "{{" not in name and "{%" not in name:
                    found.append((re.split(r"[=<>!~ ]", name, maxsplit=1)[0],
                                  str(path.relative_to(role_dir))))
    return found


def _main_tags(role: str, role_dir: Path) -> list[tuple[str, str, str]]:
    rows = []
    for playbook in sorted(PLAYBOOKS.glob("*.yml")):
        for play in _load(playbook) or []:
            for entry in (play or {}).get("roles", []) if isinstance(play, dict) else []:
                name = entry.get("role") if isinstance(entry, dict) else entry
                if name == role and isinstance(entry, dict):
                    for tag in _as_list(entry.get("tags")):
                        row = (tag, "the whole role", f"playbooks/{playbook.name}")
                        if row not in rows:  # a role that two plays apply (provision.yml) is one row
                            rows.append(row)
    return rows + _phase_tags(role_dir / "tasks", "main.yml")


def _phase_tags(tasks_dir: Path, name: str) -> list[tuple[str, str, str]]:
    """(tag, task, file) for the tagged tasks of a task file. A phase that only some hosts need
    is included (include_tasks, tagged `always` so that it is reached whatever the tags): its
    phases are the tagged tasks of the file it includes."""
    rows = []
    for task in tasks_of(tasks_dir / name):
        module, args = _module(task)
        target = args if isinstance(args, str) else (args or {}).get("file", "") \
            if isinstance(args, dict) else ""
        if module.endswith("include_tasks") and target:
            rows.extend(_phase_tags(tasks_dir, target))
            continue
        for tag in _as_list(task.get("tags")):
            where = f"tasks/{target}" if "import" in module or "include" in module else f"tasks/{name}"
            rows.append((tag, str(task.get("name", module)), where))
    return rows


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]


def _reboots(role_dir: Path) -> list[str]:
    handlers = tasks_of(role_dir / "handlers" / "main.yml")
    tasks = {p: tasks_of(p) for p in sorted((role_dir / "tasks").glob("*.yml"))}
    out = []
    for h in handlers:
        if _module(h)[0] not in REBOOT_MODULES:
            continue
        names = {h.get("name"), *_as_list(h.get("listen"))} - {None}
        why = []
        for path, items in tasks.items():
            for t in items:
                if names & set(_as_list(t.get("notify"))):
                    cond = " and ".join(_as_list(t.get("when"))) or "it reports a change"
                    why.append(f"task *{t.get('name')}* (tasks/{path.name}) notifies it when "
                               f"`{' '.join(cond.split())}`")
        throttle = f", {h['throttle']} host at a time" if "throttle" in h else ""
        out.append(f"Handler **{h.get('name')}** (`{_module(h)[0]}`{throttle}); "
                   + ("; ".join(why) or "no task notifies it") + ".")
    for path, items in tasks.items():
        for t in items:
            if _module(t)[0] in REBOOT_MODULES:
                out.append(f"Task *{t.get('name')}* (tasks/{path.name}) reboots directly.")
    # A role may only decide that its host needs a reboot (a `_<role>_reboot_needed` fact) and
    # leave the reboot to the playbook, which rolls through the hosts one at a time.
    fact = f"_{role_dir.name}_reboot_needed"
    for path, items in tasks.items():
        for t in items:
            if fact in ((t.get("ansible.builtin.set_fact") or t.get("set_fact") or {}) or {}):
                out.append(f"Reboot to load the NVIDIA driver: task *{t.get('name')}* "
                           f"(tasks/{path.name}) sets `{fact}` when the loaded driver is not the "
                           "installed one; playbooks/provision.yml then reboots those hosts one at "
                           "a time and checks the driver loads before the next "
                           "(playbooks/tasks/reboot-and-verify.yml).")
    return out


def read_role(role_dir: Path) -> Role:
    spec_path = role_dir / "meta" / "argument_specs.yml"
    if not spec_path.exists():
        raise SpecError(f"{spec_path.relative_to(ROOT)}: missing")
    data = _load(spec_path)
    try:
        spec = data["argument_specs"]["main"]
    except (TypeError, KeyError):
        raise SpecError(f"{spec_path.relative_to(ROOT)}: no argument_specs.main") from None
    meta = _load(role_dir / "meta" / "main.yml") or {}
    depends = [d.get("role", "") if isinstance(d, dict) else str(d)
               for d in meta.get("dependencies") or []]
    role = Role(name=role_dir.name, spec=spec, installs=installs_block(spec_path.read_text()),
                tags=_main_tags(role_dir.name, role_dir), reboots=_reboots(role_dir),
                depends=depends)
    role.problems = _problems(role, role_dir)
    return role


def _problems(role: Role, role_dir: Path) -> list[str]:
    where = f"playbooks/roles/{role.name}/meta/argument_specs.yml"
    if role.installs is None:
        return [f"{where}: no '# installs:' comment block (write '# installs: nothing' if so)"]
    block = " ".join(role.installs)
    out = [f"{where}: '# installs:' does not name {pkg} (installed in {src})"
           for pkg, src in _literal_packages(role_dir) if pkg not in block]
    out += [f"{where}: '# installs:' does not name the variable {var}"
            for var, opt in (role.spec.get("options") or {}).items()
            if var.endswith("_packages") and (opt or {}).get("type") == "list" and var not in block]
    return out


def roles() -> list[Role]:
    return [read_role(d) for d in sorted(ROLES.iterdir()) if (d / "meta").is_dir()]


# --- writing ---------------------------------------------------------------------------------

_MARKUP = [(re.compile(r"[CMOV]\(([^)]*)\)"), r"`\1`"), (re.compile(r"B\(([^)]*)\)"), r"**\1**"),
           (re.compile(r"I\(([^)]*)\)"), r"*\1*"), (re.compile(r"U\(([^)]*)\)"), r"[\1](\1)"),
           (re.compile(r"L\(([^,)]*),\s*([^)]*)\)"), r"[\1](\2)")]


def prose(value: Any) -> str:
    """Spec text (str or list of paragraphs) with Ansible markup turned into Markdown."""
    text = "\n\n".join(" ".join(str(p).split()) for p in _as_list(value))
    for pattern, repl in _MARKUP:
        text = pattern.sub(repl, text)
    # Outside code spans, <branch> would be read as an HTML tag and vanish.
    parts = text.split("`")
    parts[::2] = [p.replace("<", "&lt;").replace(">", "&gt;") for p in parts[::2]]
    return "`".join(parts)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n\n", "<br>")


def _default(opt: dict[str, Any]) -> str:
    if "default" not in opt:
        return "**required**" if opt.get("required") else "-"
    value = opt["default"]
    shown = " ".join(value.split()) if isinstance(value, str) else json.dumps(value)
    return f"`{shown}`" if shown else '`""`'


def _type(opt: dict[str, Any]) -> str:
    kind = opt.get("type", "str")
    return f"{kind} of {opt['elements']}" if "elements" in opt else kind


def markdown(role: Role) -> str:
    spec = role.spec
    out = [f"# {role.name}", "",
           f"<!-- Generated from meta/argument_specs.yml by `{GENERATOR}`; edit the spec, "
           "not this file. -->", "",
           f"**{prose(spec.get('short_description', ''))}**", "", prose(spec.get("description")), ""]
    if role.depends:
        out += ["Depends on: " + ", ".join(f"[{d}](../{d}/README.md)" for d in role.depends)
                + " (meta/main.yml).", ""]
    out += ["## Variables", "", "| variable | type | default | choices | description |",
            "|---|---|---|---|---|"]
    for name, opt in (spec.get("options") or {}).items():
        opt = opt or {}
        choices = ", ".join(f"`{c if isinstance(c, str) else json.dumps(c)}`"
                            for c in opt.get("choices", [])) or "-"
        out.append(f"| `{name}` | {_type(opt)} | {_cell(_default(opt))} | {choices} "
                   f"| {_cell(prose(opt.get('description', '')))} |")
    out += ["", "## What it installs", ""]
    if role.installs is None:
        out.append("Not declared (no `# installs:` block in meta/argument_specs.yml).")
    elif not role.installs:
        out.append("Nothing.")
    else:
        out += [f"- {prose(item)}" for item in role.installs]
    out += ["", "## Tags", ""]
    if role.tags:
        out += ["| tag | runs | from |", "|---|---|---|"]
        out += [f"| `{t}` | {_cell(what)} | {where} |" for t, what, where in role.tags]
    else:
        out.append("None.")
    out += ["", "## Reboots", ""]
    out += [f"- {r}" for r in role.reboots] or ["Never reboots the node."]
    return "\n".join(out) + "\n"


def readme_path(role: Role) -> Path:
    return ROLES / role.name / "README.md"


def stale(all_roles: list[Role]) -> list[str]:
    """Roles whose README differs from what the spec generates."""
    return [r.name for r in all_roles
            if not readme_path(r).exists() or readme_path(r).read_text() != markdown(r)]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args not in ([], ["--write"], ["--check"]):
        print(f"usage: python -m checks.docgen.roles [--write | --check] (got {' '.join(args)})",
              file=sys.stderr)
        return 2
    try:
        all_roles = roles()
    except SpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    problems = [p for r in all_roles for p in r.problems]
    for p in problems:
        print(f"error: {p}", file=sys.stderr)
    if args == ["--write"]:
        for r in all_roles:
            readme_path(r).write_text(markdown(r))
        print(f"wrote {len(all_roles)} role READMEs")
        return 1 if problems else 0
    out_of_date = stale(all_roles)
    if args == ["--check"]:
        for name in out_of_date:
            print(f"error: playbooks/roles/{name}/README.md is out of date; run: {GENERATOR}",
                  file=sys.stderr)
        return 1 if out_of_date or problems else 0
    for r in all_roles:
        print(f"{r.name}: {'out of date' if r.name in out_of_date else 'current'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
