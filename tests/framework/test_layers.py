"""The package layout says which side a module runs on, and imports follow the layers.

    checks.hw, checks.supervise       foundation: the machine (real or a fixture) and supervised
                                      process groups; import nothing above them
    checks.node                       the node check suite (`python -m checks`)
    checks.report                     the report model both sides use (load, figures, aggregate,
                                      stragglers, findings); checks.render draws a host's HTML page
                                      through it as a fleet of one
    checks.fleet                      the controller (`python -m checks.fleet`): may read node code;
                                      nothing of the node side, the report model or the renderers
                                      imports it
    trainer                           reference jobs: use the foundation only, never the suite

Read from the source with `ast` (every import, also those inside functions and TYPE_CHECKING
blocks), so a violation fails here rather than at some later refactor.
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("checks", "trainer")


def _modules() -> dict[str, Path]:
    mods: dict[str, Path] = {}
    for pkg in PACKAGES:
        for f in (ROOT / pkg).rglob("*.py"):
            parts = list(f.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join(parts)] = f
    return mods


MODULES = _modules()


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            assert node.level == 0, f"{path}: relative import; the project imports absolutely"
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in MODULES else node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {m for m in found if m.split(".")[0] in PACKAGES}


GRAPH = {mod: _imports(path) for mod, path in MODULES.items()}


def _within(mod: str, prefixes: tuple[str, ...]) -> bool:
    return any(mod == p or mod.startswith(p + ".") for p in prefixes)


def test_every_project_import_resolves_to_a_module() -> None:
    missing = sorted(f"{m} -> {d}" for m, deps in GRAPH.items() for d in deps if d not in MODULES)
    assert not missing, missing


@pytest.mark.parametrize(("layer", "allowed"), [
    ("checks.resources", ()),
    ("checks.safeio", ()),
    ("checks.safeyaml", ()),
    ("checks.environment", ("checks.resources",)),
    ("checks.kernlog", ("checks.kernlog", "checks.resources")),
    ("checks.supervise", ("checks.supervise",)),
    ("checks.hw", ("checks.hw", "checks.supervise", "checks.model", "checks.resources",
                   "checks.safeyaml", "checks.environment")),
    # the reference jobs read the profiles' sizes (data), never the check suite
    ("trainer", ("trainer", "checks.hw", "checks.supervise", "checks.cliutil", "checks.profiles",
                 "checks.model", "checks.resources")),
    ("checks.model", ("checks.model",)),
    ("checks.profiles", ("checks.profiles", "checks.model", "checks.resources", "checks.safeyaml")),
    ("checks.site", ("checks.site", "checks.profiles", "checks.safeyaml")),
    ("checks.report_schema", ("checks.report_schema", "checks.model", "checks.resources",
                              "checks.safeio", "checks.environment")),
    # output_file remembers the file an output option names (safeio.remember: concurrent runs)
    ("checks.cliutil", ("checks.safeio",)),
    ("checks.report", ("checks.report", "checks.model", "checks.profiles", "checks.report_schema",
                       "checks.resources", "checks.safeio", "checks.safeyaml", "checks.cliutil")),
    ("checks.render", ("checks.render", "checks.model", "checks.profiles", "checks.report_schema",
                       "checks.report", "checks.resources", "checks.safeio", "checks.cliutil")),
    ("checks.node", ("checks.node", "checks.hw", "checks.supervise", "checks.model", "checks.render",
                     "checks.resources", "checks.kernlog", "checks.report", "checks.safeio",
                     "checks.safeyaml", "checks.environment",
                     "checks.profiles", "checks.site", "checks.report_schema", "checks.cliutil",
                     "trainer")),
])
def test_imports_follow_the_layers(layer: str, allowed: tuple[str, ...]) -> None:
    # the bare `checks` package (its __version__) is open to every layer
    bad = sorted(f"{m} -> {d}" for m, deps in GRAPH.items() if _within(m, (layer,))
                 for d in deps if d != "checks" and not _within(d, allowed))
    assert not bad, f"{layer} may import only {allowed}: {bad}"


def test_no_import_cycles() -> None:
    """Tarjan's strongly connected components over module imports; any component of two or more
    modules is a cycle (a package importing its own submodules is not counted)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def edges(mod: str) -> list[str]:
        # an import of a package runs its __init__, not its submodules: skip parent -> child
        return [d for d in GRAPH[mod] if d in GRAPH and not d.startswith(mod + ".")]

    def visit(mod: str) -> None:
        index[mod] = low[mod] = len(index)
        stack.append(mod)
        on_stack.add(mod)
        for dep in edges(mod):
            if dep not in index:
                visit(dep)
                low[mod] = min(low[mod], low[dep])
            elif dep in on_stack:
                low[mod] = min(low[mod], index[dep])
        if low[mod] == index[mod]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == mod:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for mod in sorted(GRAPH):
        if mod not in index:
            visit(mod)
    assert not cycles, cycles


def test_no_two_modules_share_a_name() -> None:
    names = Counter(p.stem for p in MODULES.values() if p.stem not in ("__init__", "__main__"))
    dupes = {name: sorted(str(p.relative_to(ROOT)) for p in MODULES.values() if p.stem == name)
             for name, n in names.items() if n > 1}
    assert not dupes, dupes


def test_the_product_never_imports_the_tools_the_wheel_leaves_out() -> None:
    """checks.docgen and checks.devtools are not in the wheel (pyproject.toml): an import of
    them from the product would fail on every node."""
    tools = ("checks.docgen", "checks.devtools")
    bad = sorted(f"{m} -> {d}" for m, deps in GRAPH.items() if not _within(m, tools)
                 for d in deps if _within(d, tools))
    assert not bad, bad


# Processes, sockets, torch and NVML are started or opened only by the hardware layer, the
# supervised process groups and the reference jobs (the tools the wheel leaves out aside):
# everything else asks them, so a fixture can stand in and no child escapes supervision.
MACHINE_LAYERS = ("checks.hw", "checks.supervise", "trainer", "checks.docgen", "checks.devtools")
MACHINE_CALLS = {("subprocess", n) for n in ("run", "Popen", "call", "check_call", "check_output",
                                             "getoutput")} | {("socket", "socket"),
                                                             ("socket", "create_connection")}


def test_only_the_machine_layers_start_processes_open_sockets_or_import_torch_and_nvml() -> None:
    bad = []
    for mod, path in MODULES.items():
        if _within(mod, MACHINE_LAYERS):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name)
                    and (node.func.value.id, node.func.attr) in MACHINE_CALLS):
                bad.append(f"{mod}:{node.lineno} {node.func.value.id}.{node.func.attr}")
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            bad += [f"{mod}:{node.lineno} import {n}" for n in names
                    if n.split(".")[0] in ("torch", "pynvml")]
    assert not bad, bad
