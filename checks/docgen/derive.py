"""What the docs' check tables are derived from, read off the code rather than kept by hand:

- where a check is defined: the module of its function (`inspect`), so the tables follow a check
  that moves to another module;
- what a check reads beyond its GPU fields (those it declares, `Check.nvml`): the profile keys
  (checks/schema/profile.schema.json) and the hardware-layer methods (`ctx.hw.NAME`) named in
  its function's source and in the functions of its own module that it calls. The registry does
  not declare these; a name built at run time (f"matmul_{dtype}_tflops") is not found;
- which shipped scenarios show a check failing: every shipped scenario run through
  `python -m checks --simulate NAME --level burn-in` in this process (about 30 s for 86
  scenarios, once per process), and each check that is not PASS or SKIP there.

A helper of the generators (checks/docgen/__init__.py HELPERS), not a generator.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import inspect
import io
import json
import tempfile
import textwrap
from pathlib import Path
from types import ModuleType
from typing import Any

from checks.docgen.regions import ROOT
from checks.node import registry

OK = frozenset({"PASS", "SKIP"})
RANK = {"FAIL": 0, "ERROR": 1, "WARN": 2}
PROFILE_SCHEMA = ROOT / "checks" / "schema" / "profile.schema.json"


def checks() -> list[registry.Check]:
    """Every registered check in run order."""
    return registry.ordered(registry.load_all().values())


def source_path(chk: registry.Check) -> Path:
    """The file defining the check's function."""
    func = inspect.unwrap(chk.func)
    return Path(inspect.getsourcefile(func) or "").resolve()


def source_link(chk: registry.Check, doc: Path) -> str:
    """`[health.py](../checks/node/suite/health.py)`: the module, relative to `doc`."""
    path = source_path(chk)
    rel = Path(*([".."] * len(doc.parent.relative_to(ROOT).parts)), path.relative_to(ROOT))
    return f"[`{path.name}`]({rel.as_posix()})"


def _module_functions(module: ModuleType) -> dict[str, ast.FunctionDef]:
    tree = ast.parse(inspect.getsource(module))
    return {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}


def _reached(chk: registry.Check) -> list[ast.AST]:
    """The check's function and every function of its module it calls, directly or not."""
    func = inspect.unwrap(chk.func)
    module = inspect.getmodule(func)
    if module is None:
        return [ast.parse(textwrap.dedent(inspect.getsource(func)))]
    local = _module_functions(module)
    seen: dict[str, ast.AST] = {}
    todo = [func.__name__]
    while todo:
        name = todo.pop()
        if name in seen or name not in local:
            continue
        seen[name] = local[name]
        todo.extend(n.id for n in ast.walk(local[name]) if isinstance(n, ast.Name) and n.id in local)
    return list(seen.values())


def _strings(nodes: list[ast.AST]) -> set[str]:
    return {n.value for node in nodes for n in ast.walk(node)
            if isinstance(n, ast.Constant) and isinstance(n.value, str)}


@functools.cache
def profile_keys() -> frozenset[str]:
    """Every dotted key the profile schema allows."""
    out: set[str] = set()

    def walk(node: dict[str, Any], prefix: str) -> None:
        for key, sub in (node.get("properties") or {}).items():
            out.add(prefix + key)
            if isinstance(sub, dict):
                walk(sub, f"{prefix}{key}.")

    walk(json.loads(PROFILE_SCHEMA.read_text()), "")
    return frozenset(out)


def profile_keys_read(chk: registry.Check) -> list[str]:
    found = {s for s in _strings(_reached(chk)) if "." in s or s == "straggler_pct"}
    keys = found & profile_keys()
    # a section named alone (`ctx.profile.get("dataloader")`) is shown only when none of its
    # keys is named
    return sorted(k for k in keys if not any(o.startswith(k + ".") for o in keys))


def hw_methods(chk: registry.Check) -> list[str]:
    """`ctx.hw.NAME(...)` calls: what the check asks the hardware layer beyond GPU fields."""
    names = set()
    for node in _reached(chk):
        for n in ast.walk(node):
            if (isinstance(n, ast.Attribute) and isinstance(n.value, ast.Attribute)
                    and n.value.attr == "hw"):
                names.add(n.attr)
    return sorted(names)


@functools.cache
def scenario_verdicts() -> dict[str, dict[str, str]]:
    """{shipped scenario: {check id: status}} for every check not PASS or SKIP in a burn-in
    level run of that scenario (the run's own report, written to a temporary file)."""
    from checks.hw.fixture import shipped
    from checks.node import node_cli

    out: dict[str, dict[str, str]] = {}
    with tempfile.TemporaryDirectory(prefix="nodecert-docgen-") as tmp:
        report = Path(tmp) / "report.json"
        for name in shipped():
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                node_cli.main(["--simulate", name, "--level", "burn-in", "--json", str(report), "-q"])
            doc = json.loads(report.read_text())
            out[name] = {c["id"]: c["status"] for c in doc["checks"] if c["status"] not in OK}
    return out


def scenarios_showing(check_id: str) -> list[str]:
    """Shipped scenarios in which the check is FAIL, ERROR or WARN: the most specific first
    (fewest other checks not passing), then FAIL before ERROR before WARN, then by name."""
    verdicts = scenario_verdicts()
    hits = [(len(v), RANK.get(v[check_id], 3), name) for name, v in verdicts.items() if check_id in v]
    return [name for *_, name in sorted(hits)]
