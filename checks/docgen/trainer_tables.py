"""docs/trainer.md's two tables of the `--size large` throughput job, generated from the data the
code uses:

- what `large` costs per profile: `trainer.sizes.profile_table()` (the shapes and estimates the
  job is sized with, from checks/profiles/*.yaml);
- the memory estimate against the job's traced training step: the shapes and estimates from
  `trainer.sizes`, the traced figures from benchmarks/large_memory.json, which
  `python benchmarks/large_memory.py --write` records (a trace takes minutes: no doc check runs
  it). A shape with no recorded trace says so in its row.

    python -m checks.docgen.trainer_tables            # print the tables
    python -m checks.docgen.trainer_tables --write    # refresh docs/trainer.md in place
    python -m checks.docgen.trainer_tables --check    # exit 1 when docs/trainer.md is out of date
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from checks import profiles
from checks.docgen.regions import ROOT, Region, RegionError
from checks.docgen.regions import main as regions_main

PROG = "checks.docgen.trainer_tables"
TRACES = ROOT / "benchmarks" / "large_memory.json"
SHAPE_KEYS = ("vocab", "context", "width", "heads", "layers", "batch")


def sizes_table() -> str:
    from trainer import sizes

    return sizes.profile_table()


def shapes_by_profile() -> dict[Any, list[tuple[str, float]]]:
    """{large GptShape: [(profile, GPU memory GiB)]} for every profile with a memory size."""
    from trainer import sizes

    found: dict[Any, list[tuple[str, float]]] = {}
    for name in profiles.available():
        memory = profiles.load(name).get("memory_gib")
        if memory:
            found.setdefault(sizes.large_gpt(float(memory) * 2 ** 30), []).append((name, float(memory)))
    return found


def load_traces(path: Path = TRACES) -> tuple[dict[tuple[int, ...], dict[str, Any]], str]:
    """({shape key: trace}, date) from the recorded benchmark run."""
    try:
        data = json.loads(path.read_text())
        traces = {tuple(int(t[k]) for k in SHAPE_KEYS): t for t in data["traces"]}
        for trace in traces.values():
            float(trace["traced_gib"]), float(trace["seconds"])
        return traces, str(data["date"])
    except (ValueError, KeyError, TypeError) as exc:
        raise RegionError(f"{path.name}: not a recorded large_memory.py run "
                          f"({type(exc).__name__}: {' '.join(str(exc).split())})") from None


def traced_table(path: Path = TRACES) -> str:
    traces, date = load_traces(path)
    rows = [f"Traced {date} (`{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}`).", "",
            "| throughput model (layers × width, batch) | profiles | estimate | traced (fake tensors) "
            "| estimate ÷ traced | traced ÷ GPU memory | trace time |", "|---|---|---|---|---|---|---|"]
    shapes = shapes_by_profile()
    for shape in sorted(shapes, key=lambda s: (s.layers, s.batch)):
        named = shapes[shape]
        estimate = shape.memory_bytes() / 2 ** 30
        head = (f"| {shape.layers} × {shape.width}, {shape.batch} | {', '.join(n for n, _ in named)} "
                f"| {estimate:.1f} GiB |")
        trace = traces.get(tuple(int(getattr(shape, k)) for k in SHAPE_KEYS))
        if trace is None:
            rows.append(f"{head} not traced yet: run `python benchmarks/large_memory.py --write` "
                        "| - | - | - |")
            continue
        traced = float(trace["traced_gib"])
        smallest = min(memory for _, memory in named)
        rows.append(f"{head} {traced:.1f} GiB | {estimate / traced:.2f} | {traced / smallest:.0%} "
                    f"| {float(trace['seconds']):.0f} s |")
    return "\n".join(rows)


REGIONS = [
    Region(ROOT / "docs" / "trainer.md", "trainer-sizes",
           "trainer/sizes.py and checks/profiles/*.yaml", sizes_table),
    Region(ROOT / "docs" / "trainer.md", "trainer-traced",
           "trainer/sizes.py, checks/profiles/*.yaml and benchmarks/large_memory.json", traced_table),
]


def main(argv: list[str] | None = None) -> int:
    return regions_main(PROG, REGIONS, argv)


if __name__ == "__main__":
    sys.exit(main())
