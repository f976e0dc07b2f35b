"""The GPU fields of the hardware layer, generated from the code so a new field (or a new check
reading one) shows up in the docs at once:

- docs/hardware-layer.md `gpu-fields`: every field of checks/hw/base.py GPU_FIELDS, the NVML
  functions checks/hw/nvml.py calls for it (read from that module's source: the field's entry in
  `RealGpu._fields` and the `RealGpu` methods it reaches) and the checks that read it (each
  check's `nvml=` declaration in the registry, held to real runs of every shipped scenario by
  tests/framework/test_registry_declarations.py);
- docs/scenarios.md `scenario-keys`: the keys a scenario may give a GPU and the host
  (checks/hw/scenario_file.py, which rejects any other).

    python -m checks.docgen.gpu_fields            # print the tables
    python -m checks.docgen.gpu_fields --write    # refresh both documents in place
    python -m checks.docgen.gpu_fields --check    # exit 1 when one is out of date
"""

from __future__ import annotations

import ast
import re
import sys
import textwrap

from checks.docgen import derive
from checks.docgen.regions import ROOT, Region, RegionError
from checks.docgen.regions import main as regions_main

PROG = "checks.docgen.gpu_fields"
NVML_SOURCE = ROOT / "checks" / "hw" / "nvml.py"
NVML_FUNCTION = re.compile(r"^nvml(?:Device|System)[A-Z]\w*$")


def _real_gpu() -> ast.ClassDef:
    tree = ast.parse(NVML_SOURCE.read_text())
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "RealGpu":
            return node
    raise RegionError(f"{NVML_SOURCE.relative_to(ROOT)}: class RealGpu not found")


def nvml_calls() -> dict[str, list[str]]:
    """{field: NVML functions in the order the code names them}, from RealGpu's source."""
    cls = _real_gpu()
    methods = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}
    table = next((n.value for n in ast.walk(methods["__init__"])
                  if isinstance(n, ast.AnnAssign | ast.Assign) and isinstance(n.value, ast.Dict)), None)
    if not isinstance(table, ast.Dict):
        raise RegionError(f"{NVML_SOURCE.relative_to(ROOT)}: RealGpu._fields not found")

    def names(node: ast.AST, seen: set[str]) -> list[str]:
        out: list[str] = []
        for n in ast.walk(node):
            name = (n.attr if isinstance(n, ast.Attribute) else
                    n.value if isinstance(n, ast.Constant) and isinstance(n.value, str) else None)
            if name and NVML_FUNCTION.match(name) and name not in out:
                out.append(name)
            if (isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self"
                    and n.attr in methods and n.attr not in seen and n.attr not in ("_c", "_older")):
                seen.add(n.attr)
                out += [x for x in names(methods[n.attr], seen) if x not in out]
        return out

    return {k.value: names(v, set()) for k, v in zip(table.keys, table.values, strict=True)
            if isinstance(k, ast.Constant) and isinstance(k.value, str)}


def readers() -> dict[str, list[str]]:
    """{field: ids of the checks that declare it in `nvml=`, in run order}."""
    out: dict[str, list[str]] = {}
    for chk in derive.checks():
        for field in chk.nvml:
            out.setdefault(field, []).append(chk.id)
    return out


def fields_table() -> str:
    from checks.hw.base import GPU_FIELDS

    calls, read = nvml_calls(), readers()
    missing = [f for f in GPU_FIELDS if f not in calls]
    if missing:
        raise RegionError(f"GPU fields without an entry in RealGpu._fields: {', '.join(missing)}")
    rows = ["| field | NVML functions (checks/hw/nvml.py) | read by (checks) |", "|---|---|---|"]
    for field in GPU_FIELDS:
        fns = ", ".join(f"`{f}`" for f in calls[field]) or "-"
        by = ", ".join(f"`{c}`" for c in read.get(field, [])) or "the report and the recorder only"
        rows.append(f"| `{field}` | {fns} | {by} |")
    return "\n".join(rows)


def keys_list() -> str:
    from checks.hw import scenario_file as sf
    from checks.hw.base import GPU_FIELDS

    def listed(label: str, keys: list[str]) -> str:
        return textwrap.fill(f"{label}: " + ", ".join(f"`{k}`" for k in keys) + ".", width=100,
                             break_on_hyphens=False)

    return "\n\n".join([
        listed("- GPU, NVML answers (`GPU_FIELDS`)", list(GPU_FIELDS)),
        listed("- GPU, the PCI side", sorted(sf.GPU_PCI_KEYS)),
        listed("- `host`", sorted(sf.HOST_KEYS)),
        listed("- `driver`", sorted(sf.DRIVER_KEYS)),
        listed("- `torch`", sorted(sf.TORCH_KEYS)),
        listed("- top level", sorted(sf.TOP_KEYS)),
    ])


REGIONS = [
    Region(ROOT / "docs" / "hardware-layer.md", "gpu-fields",
           "checks/hw/base.py GPU_FIELDS, checks/hw/nvml.py and the checks", fields_table),
    Region(ROOT / "docs" / "scenarios.md", "scenario-keys", "checks/hw/scenario_file.py", keys_list),
]


def main(argv: list[str] | None = None) -> int:
    return regions_main(PROG, REGIONS, argv)


if __name__ == "__main__":
    sys.exit(main())
