"""What `--size large` takes in memory, per profile: the estimate that sizes it against the
throughput job's own training step traced on fake tensors
(trainer.jobs.throughput.traced_memory_bytes).

No GPU is needed: the trace runs the job's model, AdamW and bf16 autocast on tensors without
storage, so the 2.6 B-parameter shapes of the 141-268 GiB profiles trace on a laptop (about a
minute each). Not in either figure: the CUDA context, NCCL's buffers, the allocator's rounding.

    .venv/bin/python benchmarks/large_memory.py            # print the table
    .venv/bin/python benchmarks/large_memory.py --write    # also record benchmarks/large_memory.json

The recorded run is what docs/trainer.md's traced-memory table shows
(`python -m checks.docgen.trainer_tables --write` after recording).
"""

from __future__ import annotations

import datetime
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args not in ([], ["--write"]):
        print(f"usage: large_memory.py [--write] (got {' '.join(args)})", file=sys.stderr)
        return 2
    from checks import profiles
    from trainer import sizes
    from trainer.jobs import throughput

    by_shape: dict[sizes.GptShape, list[tuple[str, float]]] = {}
    for name in profiles.available():
        memory = profiles.load(name).get("memory_gib")
        if memory:
            shape = sizes.large_gpt(float(memory) * 2 ** 30)
            by_shape.setdefault(shape, []).append((name, float(memory)))
    print("| throughput model (layers × width 2048, batch) | profiles | estimate | traced "
          "(fake tensors) | estimate ÷ traced | traced ÷ GPU memory | trace time |")
    print("|---|---|---|---|---|---|---|")
    records = []
    for shape, named in sorted(by_shape.items(), key=lambda item: (item[0].layers, item[0].batch)):
        start = time.monotonic()
        traced = throughput.traced_memory_bytes(shape)
        seconds = time.monotonic() - start
        smallest = min(memory for _, memory in named)
        print(f"| {shape.layers} × 2048, {shape.batch} | {', '.join(n for n, _ in named)} | "
              f"{shape.memory_bytes() / 2 ** 30:.1f} GiB | {traced / 2 ** 30:.1f} GiB | "
              f"{shape.memory_bytes() / traced:.3f} | {traced / 2 ** 30 / smallest:.0%} | "
              f"{seconds:.0f} s |", flush=True)
        records.append({"vocab": shape.vocab, "context": shape.context, "width": shape.width,
                        "heads": shape.heads, "layers": shape.layers, "batch": shape.batch,
                        "traced_gib": round(traced / 2 ** 30, 3), "seconds": round(seconds, 1)})
    if args == ["--write"]:
        out = ROOT / "benchmarks" / "large_memory.json"
        data = json.loads(out.read_text())
        data.update(date=datetime.datetime.now(datetime.timezone.utc).date().isoformat(),
                    precision="GiB to three decimals, seconds to one", traces=records)
        out.write_text(json.dumps(data, indent=2) + "\n")
        print(f"wrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
