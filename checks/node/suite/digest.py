"""Same bits everywhere, on the node: every GPU computes the fixed reference (workloads/
reference.py) and publishes its SHA-256; the fleet report compares the digests across nodes of the
same GPU model and stack (checks/report/digest_groups.py)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

from checks.model import Result, fail, passed, skip, warn
from checks.node import workload_plan as plan
from checks.node.context import Context
from checks.node.perdevice import each_gpu
from checks.node.registry import Budget, Cost, check
from checks.node.suite.burnin import REMEDY_SDC

NONDETERMINISTIC = ("a GPU that cannot repeat its own result is faulty or runs non-deterministic "
                    "kernels: rerun; if it repeats, drain the node and run the burn-in")


def majority(digests: list[str]) -> str | None:
    """The digest held by more than half of them; None without a strict majority."""
    if not digests:
        return None
    top, n = Counter(digests).most_common(1)[0]
    return top if n * 2 > len(digests) else None


@check("reference-digest", code="SDC001",
       title="deterministic reference computation: same SHA-256 on every GPU, run after run",
       level="standard", stage="workload", tags=("compute", "gpu", "sdc"), timeout_s=300,
       gated_by=("gpu-occupied",), scope="gpu", nvml=("compute_capability", "compute_mode"),
       # cpu 7 s
       budget=Budget(value=7, cost=Cost(cpu=10, gpu=12, per_gpu=1), source="measured cpu"))
def reference_digest(ctx: Context) -> Iterator[Result]:
    """A fixed fp32 matmul chain (fixed seed and sizes, deterministic algorithms, TF32 off) run
    twice on every GPU; the SHA-256 of its result goes into the report for the fleet comparison.
    FAIL: a GPU whose two runs differ, whose result is not finite, or whose digest differs from
    the majority of the node's GPUs of the same model. WARN: GPUs of one model split with no
    majority. On a host without a GPU the CPU's digest is recorded as information (SKIP)."""
    plat = plan.platform(ctx)
    if plat.kind == "blocked":
        yield skip(plan.BLOCKED)
        return
    untouched = plan.prohibited(ctx) if plat.cuda else {}
    rows = ctx.hw.workload("digest", device="cuda" if plat.cuda else "cpu", repeats=2,
                           exclude_pci=sorted(untouched))
    if not plat.cuda:
        row = rows[0]
        yield skip(f"no GPU on this host; computed the reference on the CPU: {row['digest'][:16]} "
                   "(information: the fleet compares GPU digests)",
                   details={"digest": row["digest"], "digests": row["digests"],
                            "reference": row["reference"], "measured_on": "cpu"})
        return
    by_index: dict[int, dict[str, Any]] = {}
    for gpu in ctx.gpus:
        row = plan.find_row(rows, gpu)
        if row is not None:
            by_index[int(gpu.device.index or 0)] = row
    models = {int(g.device.index or 0): g.device.name or "?" for g in ctx.gpus}
    reference: dict[str, str | None] = {}
    for model in set(models.values()):
        reference[model] = majority([r["digest"] for i, r in by_index.items()
                                     if models.get(i) == model and len(set(r["digests"])) == 1])

    def measure(gpu: Any) -> Result:
        index = int(gpu.device.index or 0)
        row = by_index.get(index)
        if row is None:
            return skip(untouched.get((gpu.device.pci or "").lower(), plan.NOT_MEASURED))
        digest, model = row["digest"], models[index]
        details = {"digest": digest, "digests": row["digests"], "reference": row["reference"],
                   "model": model}
        short = digest[:16]
        if "non-finite" in row["digests"]:
            return fail("the reference computation gave non-finite values", details=details,
                        expected="finite values", remedy=REMEDY_SDC)
        if len(set(row["digests"])) > 1:
            return fail(f"{len(row['digests'])} runs of the reference gave "
                        f"{len(set(row['digests']))} different digests", details=details,
                        expected="the same digest every run", remedy=NONDETERMINISTIC)
        peers = sum(1 for i in by_index if models.get(i) == model)
        ref = reference[model]
        if ref is None and peers > 1:
            return warn(f"digest {short}: the node's {model} GPUs split with no majority",
                        details=details, expected="one digest for all GPUs of a model",
                        remedy=REMEDY_SDC)
        if ref is not None and digest != ref:
            return fail(f"digest {short} differs from {ref[:16]} of the other {model} GPUs",
                        details=details, expected=f"digest {ref[:16]}", remedy=REMEDY_SDC)
        return passed(f"digest {short} (same on {peers} {model} GPU(s), repeatable)",
                      details=details)

    yield from each_gpu(ctx, measure)
