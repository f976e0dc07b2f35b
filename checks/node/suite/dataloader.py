"""DataLoader checks: workers start and return exact data, /dev/shm fits the configured loaders,
throughput scaling with workers, and a worker killed mid-epoch is reported rather than hung on."""

from __future__ import annotations

from typing import Any

from checks.model import Result, fail, passed, warn
from checks.node import rules
from checks.node import workload_plan as plan
from checks.node.context import Context
from checks.node.registry import Budget, Cost, check

GIB, MIB = 1 << 30, 1 << 20
TAGS = ("dataloader", "cpu")


def _size(n: float) -> str:
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n / MIB:.0f} MiB"


def judge_workers(m: dict[str, Any]) -> Result:
    runs = m["runs"]
    bad = [r for r in runs if r.get("ok") is False]
    unavailable = [r for r in runs if r.get("ok") is None]
    label = {True: "persistent", False: "non-persistent"}
    details = {"runs": runs}
    if bad:
        parts = []
        for r in bad:
            what = r.get("error")
            if not what:
                e: dict[str, Any] = next((x for x in r.get("epochs", []) if not x["ok"]), {})
                what = (f"{e.get('n_missing', 0)} missing, {e.get('n_duplicated', 0)} duplicated, "
                        f"{e.get('n_wrong', 0)} wrong sample(s)")
            parts.append(f"{r['start_method']} {label[bool(r['persistent_workers'])]}: {what}")
        return fail(f"DataLoader workers broken: {'; '.join(parts)}", value=len(bad),
                    expected="every run complete, unique and exact", details=details,
                    remedy="a start method that cannot start workers breaks training scripts "
                           "that use it: check /dev/shm (dataloader-shm), the open-files and "
                           "process limits (ulimit -n, -u) and that the dataset pickles")
    ok = [f"{r['start_method']}/{label[bool(r['persistent_workers'])][:3]}" for r in runs
          if r.get("ok")]
    note = f" ({len(unavailable)} start method(s) unavailable here)" if unavailable else ""
    return passed(f"{len(ok)} runs exact, complete and unique: {', '.join(ok)}{note}",
                  value=len(ok), details=details)


@check("dataloader-workers", code="DAT001",
       title="DataLoader workers: every start method, persistent or not, exact data",
       level="standard", stage="workload", tags=TAGS, timeout_s=600,
       # cpu 8.0-10.6 s
       budget=Budget(value=4, cost=Cost(cpu=15, gpu=15), source="measured cpu"))
def dataloader_workers(ctx: Context) -> Result:
    """Real DataLoaders for each start method (fork, forkserver, spawn) with persistent_workers
    on and off (dataloader.workers each; dataloader.spawn_workers for spawn): the union of the
    indices must be complete and unique, every value exact, and persistent workers must
    survive between epochs."""
    p = ctx.profile
    m = ctx.hw.workload(
        "dataloader_workers", methods=list(p.get("dataloader.start_methods")),
        persistent=[bool(x) for x in p.get("dataloader.persistent_workers")],
        workers=int(p.get("dataloader.workers")),
        spawn_workers=int(p.get("dataloader.spawn_workers")),
        timeout_s=float(p.get("dataloader.timeout_s")))
    return judge_workers(m)


def shm_plan(ctx: Context) -> dict[str, int]:
    p = ctx.profile
    try:
        ranks = len(ctx.gpus) if ctx.pci_gpus else 1
    except Exception:
        ranks = len(ctx.pci_gpus) or 1
    ranks = ctx.options.nproc or ranks or 1
    batch_bytes = int(p.get("dataloader.batch_size")) * int(
        p.get("dataloader.sample_bytes"))
    workers = int(p.get("dataloader.workers_per_rank"))
    prefetch = int(p.get("dataloader.prefetch_factor"))
    return {"ranks": ranks, "batch_bytes": batch_bytes, "workers": workers, "prefetch": prefetch,
            "needed_bytes": rules.shm_needed(batch_bytes=batch_bytes, workers=workers,
                                             prefetch=prefetch, ranks=ranks)}


def judge_shm(total: int, free: int, need: dict[str, int], headroom: float) -> Result:
    wanted = int(need["needed_bytes"] * headroom)
    what = (f"{need['ranks']} rank(s) x {need['workers']} workers x (prefetch {need['prefetch']} "
            f"+ 1) x {_size(need['batch_bytes'])} batches = {_size(need['needed_bytes'])}")
    details = {**need, "shm_total_bytes": total, "shm_free_bytes": free, "headroom": headroom}
    expected = f">= {_size(wanted)} free ({what}, x {headroom:g})"
    remedy = ("containers: docker run --shm-size=<size> (or --ipc=host), Kubernetes: mount an "
              "emptyDir with medium: Memory at /dev/shm; hosts: mount -o remount,size=<size> "
              "/dev/shm (and in /etc/fstab); or lower workers / prefetch_factor / batch size")
    if free < need["needed_bytes"]:
        return fail(f"/dev/shm has {_size(free)} free of {_size(total)}; the configured "
                    f"DataLoaders need {_size(need['needed_bytes'])}: workers will die with "
                    f"'bus error'", value=free, unit="bytes", expected=expected, details=details,
                    remedy=remedy)
    if free < wanted:
        return warn(f"/dev/shm has {_size(free)} free; the configured DataLoaders need "
                    f"{_size(need['needed_bytes'])}, leaving less than {headroom:g}x headroom",
                    value=free, unit="bytes", expected=expected, details=details, remedy=remedy)
    return passed(f"/dev/shm {_size(free)} free covers {what}", value=free, unit="bytes",
                  expected=expected, details=details)


@check("dataloader-shm", code="DAT002", title="/dev/shm fits the configured DataLoaders",
       level="standard", stage="workload", tags=TAGS, timeout_s=60,
       budget=Budget(value=6, cost=Cost(cpu=1, gpu=1), source="measured cpu"))
def dataloader_shm(ctx: Context) -> Result:
    """Shared memory the node's loaders hold at once (ranks x workers_per_rank x
    (prefetch_factor + 1) x batch bytes, profile `dataloader.*`) against /dev/shm free space.
    FAIL when it does not fit (the 64 MB container default dies with 'bus error'), WARN below
    dataloader.shm_headroom."""
    shm = ctx.hw.shm()
    return judge_shm(shm.total_bytes, shm.free_bytes, shm_plan(ctx),
                     float(ctx.profile.get("dataloader.shm_headroom")))


def scaling_counts(cpus: int, cap: int) -> list[int]:
    """0, 1, 2, 4, ... up to min(cpus, cap), always ending at that limit."""
    limit = max(1, min(cpus, cap))
    counts, n = [0, 1], 2
    while n < limit:
        counts.append(n)
        n *= 2
    if limit not in counts:
        counts.append(limit)
    return counts


def judge_scaling(m: dict[str, Any], fraction: float, cpus: int) -> Result:
    points = m["points"]
    curve = [{"workers": p["workers"], "samples_per_s": p["samples_per_s"]} for p in points]
    sat = rules.saturation(points, fraction)
    best = max(points, key=lambda p: p["samples_per_s"])
    base = points[0]["samples_per_s"] or 1e-9
    details: dict[str, Any] = {
        "curve": curve, "saturation_workers": sat["workers"], "cpus": cpus,
        "figures": {"dataloader_max_samples_per_s": best["samples_per_s"],
                    "dataloader_saturation_workers": sat["workers"]},
        "digests": {str(p["workers"]): p["digest"] for p in points}}
    reference = points[0]["digest"]
    differ = [p["workers"] for p in points if p["digest"] != reference]
    if differ:
        return fail(f"the data differ with {differ} workers from the in-process (0 workers) "
                    f"reference", value=differ, expected="identical samples for every worker count",
                    details=details,
                    remedy="worker processes compute different samples: look for per-process "
                           "random state or globals in the dataset, and for memory errors")
    pin = m.get("pin_memory")
    if pin is not None:
        details["pin_memory"] = pin
        if not pin.get("all_pinned"):
            return fail("pin_memory=True returned unpinned batches", value=False,
                        expected="every batch pinned", details=details,
                        remedy="check memlock-limit (pinned memory needs a large RLIMIT_MEMLOCK) "
                               "and that the CUDA driver is usable from this process")
    text = ", ".join(f"{p['workers']}: {p['samples_per_s']:.0f}" for p in points)
    pin_text = (f"; pin_memory OK, {pin['h2d_gbs']:.1f} GB/s to the GPU" if pin else "")
    where = (f"still rising at {sat['workers']} workers" if sat is points[-1] and len(points) > 1
             else f"saturates at {sat['workers']} worker(s)")
    return passed(f"samples/s by workers {text}; {where} "
                  f"({best['samples_per_s'] / base:.1f}x over 0 workers){pin_text}; data "
                  f"identical for every worker count", value=sat["workers"], unit="workers",
                  details=details)


@check("dataloader-scaling", code="DAT003",
       title="DataLoader throughput vs worker count (curve and saturation point)",
       level="standard", stage="workload", tags=TAGS, timeout_s=900,
       nvml=("compute_capability", "compute_mode"),
       # cpu 20.4 s
       budget=Budget(value=3, cost=Cost(cpu=25, gpu=25), source="measured cpu"))
def dataloader_scaling(ctx: Context) -> Result:
    """samples/s on a synthetic CPU-heavy dataset for 0, 1, 2, 4 ... workers up to the CPU
    count (capped by dataloader.scaling_max_workers); reports the curve and where it reaches
    dataloader.saturation_fraction of the best. The samples must be identical for every worker
    count (FAIL otherwise); the speed-up is information (a loaded host need not show one).
    On GPU hosts pin_memory=True batches must come back pinned."""
    p = ctx.profile
    cpus = ctx.hw.cpu_count()
    counts = scaling_counts(cpus, int(p.get("dataloader.scaling_max_workers")))
    plat = plan.platform(ctx)
    # Pinned batches are copied to the current GPU (the first one torch sees); a GPU where no
    # process may run (compute mode PROHIBITED) leaves the pin_memory part out, with the reason.
    banned = plan.compute_mode_gate(ctx, processes_per_gpu=1) if plat.cuda else None
    m = ctx.hw.workload("dataloader_scaling", worker_counts=counts,
                        length=int(p.get("dataloader.scaling_length")),
                        rounds=int(p.get("dataloader.scaling_rounds")),
                        pin_memory=plat.cuda and banned is None)
    result = judge_scaling(m, float(p.get("dataloader.saturation_fraction")), cpus)
    if banned:
        result.details["pin_memory_skipped"] = banned
        result.message += f" (pin_memory not tried: {banned})"
    return result


def judge_worker_death(m: dict[str, Any]) -> Result:
    details = dict(m)
    if m.get("hung"):
        return fail(f"a DataLoader worker killed mid-epoch was not noticed: the loader was still "
                    f"waiting after {m['deadline_s']:g} s (timeout={m['timeout_s']:g})",
                    value=m["deadline_s"], unit="s", expected="an error naming the dead worker",
                    details=details,
                    remedy="training jobs here would hang instead of failing: check that the "
                           "container has an init process reaping children (docker --init) and "
                           "set DataLoader(timeout=...) in training code")
    if not m.get("detected"):
        return fail("the DataLoader finished the epoch although a worker was killed (samples "
                    "lost silently)", value=m.get("batches_before"), details=details,
                    expected="an error naming the dead worker",
                    remedy="report this torch build; do not train with workers on this host")
    return passed(f"killed worker detected after {m['seconds']:.1f} s "
                  f"(batch {m['batches_before']}/{m['expected_batches']}): {m['error']}",
                  value=m["seconds"], unit="s", details=details)


@check("dataloader-worker-death", code="DAT004",
       title="a DataLoader worker killed mid-epoch is reported, not hung on",
       level="standard", stage="workload", tags=TAGS, timeout_s=120,
       # cpu 3.2 s
       budget=Budget(value=4, cost=Cost(cpu=5, gpu=5), source="measured cpu"))
def dataloader_worker_death(ctx: Context) -> Result:
    """A worker SIGKILLs itself in the middle of an epoch (as an OOM kill would). The loader
    (with timeout=dataloader.worker_timeout_s) must raise an error within
    dataloader.worker_deadline_s; a hang or a silently short epoch FAILs."""
    p = ctx.profile
    m = ctx.hw.workload("dataloader_worker_death",
                        timeout_s=float(p.get("dataloader.worker_timeout_s")),
                        deadline_s=float(p.get("dataloader.worker_deadline_s")))
    return judge_worker_death(m)
