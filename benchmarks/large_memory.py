"""What `--size large` takes in memory, per profile: the estimate that sizes it against the
throughput job's own training step traced on fake tensors
(trainer.jobs.throughput.traced_memory_bytes).

No GPU is needed: the trace runs the job's model, AdamW and bf16 autocast on tensors without
storage, so the 2.6 B-parameter shapes of the 141-268 GiB profiles trace on a laptop (about a
minute each). Not in either figure: the CUDA context, NCCL's buffers, the allocator's rounding.

    .venv/bin/python benchmarks/large_memory.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
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
    for shape, named in sorted(by_shape.items(), key=lambda item: (item[0].layers, item[0].batch)):
        start = time.monotonic()
        traced = throughput.traced_memory_bytes(shape)
        seconds = time.monotonic() - start
        smallest = min(memory for _, memory in named)
        print(f"| {shape.layers} × 2048, {shape.batch} | {', '.join(n for n, _ in named)} | "
              f"{shape.memory_bytes() / 2 ** 30:.1f} GiB | {traced / 2 ** 30:.1f} GiB | "
              f"{shape.memory_bytes() / traced:.3f} | {traced / 2 ** 30 / smallest:.0%} | "
              f"{seconds:.0f} s |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
