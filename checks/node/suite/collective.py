"""Collective checks: NCCL (or gloo) correctness and bus bandwidth across the node."""

from __future__ import annotations

from typing import Any

from checks.hw.base import HardwareError
from checks.hw.measure import busbw
from checks.hw.measure import nccl_log as nccl_capture
from checks.model import Result, error, fail, passed, skip, warn
from checks.node import rules
from checks.node import workload_plan as plan
from checks.node.context import Context
from checks.node.registry import Budget, Cost, check

REMEDY_HANG = ("rerun with NCCL_DEBUG=INFO (and NCCL_DEBUG_SUBSYS=INIT,COLL) to see where the "
               "named rank stops; check that GPU's xid-events, nvlink and pcie-link results and "
               "nvidia-fabricmanager; NCCL_P2P_DISABLE=1 / NCCL_NVLS_ENABLE=0 isolate the "
               "transport")
REMEDY_WRONG = ("silent data corruption on the named rank's path: drain the node, run the "
                "burn-in level and the DCGM diagnostics (dcgmi diag -r 3); reseat or RMA the GPU "
                "or NVSwitch tray if it repeats")
REMEDY_SLOW = ("check nvlink (links down), fabric-manager, pcie-link (downtrained), NCCL_* "
               "variables that disable transports (NCCL_P2P_DISABLE, NCCL_SHM_DISABLE, "
               "NCCL_NVLS_ENABLE=0), and that no other job shares the GPUs")
REMEDY_REACH = ("free the GPUs' memory (gpu-occupied names processes holding it) or give the "
                "launch more time (profile collective.timeout_s_gpu, stall_s_gpu), then rerun; "
                "each rank needs about 3.25 message-sized buffers of free GPU memory at the "
                "floor's size")
FIGURE = {"all_reduce": "allreduce_busbw_gbs", "all_gather": "allgather_busbw_gbs",
          "reduce_scatter": "reducescatter_busbw_gbs", "broadcast": "broadcast_busbw_gbs",
          "all_to_all": "alltoall_busbw_gbs"}


def _profile_floor_applies(ctx: Context, nranks: int) -> bool:
    per_node = ctx.profile.get("gpus_per_node")
    return (ctx.profile.get("thresholds.allreduce_busbw_gbs") is not None
            and (per_node is None or int(per_node) == nranks))


def floor_size(ctx: Context, nranks: int) -> int | None:
    """The message size the profile's floor was published at (collective.floor_bytes), when
    that floor is the one judged for this many ranks; None when it is not judged, or its source
    states no size (collective.floor_bytes_unstated says why)."""
    at = ctx.profile.get("collective.floor_bytes")
    return int(at) if at and _profile_floor_applies(ctx, nranks) else None


def gpu_sweep(ctx: Context, sweep: dict[str, Any], nranks: int) -> dict[str, Any]:
    """The GPU sweep, with all-reduce going on to the size the profile's floor was published at
    when that floor is judged: a floor published at 16 GiB (Azure's gate) is not judged at the
    default 256 MiB top. The other ops stop at max_bytes; the ranks leave out what their free
    memory or the launch's time cannot hold (checks/hw/measure/collective_rank.py)."""
    at = floor_size(ctx, nranks)
    if at and at > int(sweep.get("max_bytes") or 0):
        return {**sweep, "floor_bytes": at}
    return dict(sweep)


def _judged_at(ctx: Context, nranks: int) -> str:
    """Which sizes the floor is judged on, and why those."""
    p = ctx.profile
    sweep = gpu_sweep(ctx, dict(p.get("collective.sweep_gpu") or {}), nranks)
    top = int(sweep.get("floor_bytes") or sweep.get("max_bytes") or 0)
    at = floor_size(ctx, nranks)
    if at:
        return (f"published at {busbw.human_bytes(at)}: judged on the peak busbw of sizes up to "
                f"{busbw.human_bytes(top)}")
    unstated = ("its source states no message size; " if _profile_floor_applies(ctx, nranks)
                and p.get("collective.floor_bytes_unstated") else "")
    return f"{unstated}judged on the peak busbw of sizes up to {busbw.human_bytes(top)}" if top else ""


def derived_threshold(ctx: Context, nranks: int) -> rules.Threshold | None:
    """A floor derived from the links the GPUs the ranks run on report (the slowest GPU sets
    the pace of a ring); None when they are unknown."""
    p = ctx.profile
    try:
        # The GPUs the ranks run on: CUDA_VISIBLE_DEVICES' selection (NVML indices, in its
        # order), not the first N in NVML order.
        visible = ctx.cuda_visible().indices
        gpus = ([ctx.gpus[i] for i in visible] if visible is not None else ctx.gpus)[:nranks]
    except HardwareError:
        gpus = []
    if not gpus:
        return None
    cc = p.get("compute_capability")
    if cc is None:
        try:
            major, minor = gpus[0].handle.query("compute_capability")
            cc = f"{major}.{minor}"
        except (HardwareError, TypeError, ValueError):
            cc = None
    gens = [plan.query_int(g, "pcie_gen_max") for g in gpus]
    widths = [plan.query_int(g, "pcie_width_max") for g in gpus]
    nvlinks = min(plan.nvlinks_up(g) for g in gpus)
    if nvlinks and _ring_crosses_pcie(ctx, gpus, nranks):
        nvlinks = 0  # bridged pairs: the ring's hop between pairs is PCIe, which sets its pace
    return rules.derived_link_threshold(
        nvlinks=nvlinks,
        link_gbs=(p.get("collective.nvlink_link_gbs") or {}).get(str(cc)),
        nvlink_fraction=float(p.get("collective.nvlink_fraction")),
        pcie_gen=min((g for g in gens if g), default=None),
        pcie_width=min((w for w in widths if w), default=None),
        pcie_fraction=float(p.get("collective.pcie_fraction")))


def _ring_crosses_pcie(ctx: Context, gpus: list[Any], nranks: int) -> bool:
    """On a node without NVSwitch whose cards NVLink bridges join in pairs (H100/H200 NVL, A100
    PCIe with NV12 bridges: nccl-tests#178), a ring over more than one pair crosses PCIe between
    pairs, so the NVLink count of each GPU says nothing of the ring's pace. The pairs are classed
    as nccl-transport classes them (fabric_transport.rank_paths)."""
    if nranks <= 2 or plan.nvswitch_system(ctx, gpus):
        return False
    from checks.node.suite.fabric_transport import rank_paths

    _, pcie, _ = rank_paths(ctx)
    return any(i < nranks and j < nranks for i, j in pcie)


def busbw_threshold(ctx: Context, nranks: int) -> rules.Threshold | None:
    """The profile's figure when it is for this many GPUs, else one derived from the links the
    GPUs report."""
    p = ctx.profile
    if _profile_floor_applies(ctx, nranks):
        judged = _judged_at(ctx, nranks)
        return rules.Threshold(float(p.get("thresholds.allreduce_busbw_gbs")),
                               f"profile {p.name} thresholds.allreduce_busbw_gbs "
                               f"({p.get('gpus_per_node') or nranks} GPUs"
                               f"{', ' + judged if judged else ''})")
    return derived_threshold(ctx, nranks)


def _describe_error(e: dict[str, Any]) -> str:
    where = (f"data from rank {e['source']}" if e.get("source") is not None else "result")
    text = (f"{e['op']} on rank {e['rank']}, iteration {e['iteration']}: {e['wrong']} wrong "
            f"element(s), first at index {e['index']} ({where}: got {e['got']:g}, expected "
            f"{e['expected']:g})")
    senders = e.get("senders_wrong")
    if senders:
        text += f"; the contribution of rank(s) {', '.join(map(str, senders))} was already wrong"
    elif senders == []:
        text += "; every rank's contribution was right: the transport or reduction broke"
    return text


def _top(rows: list[dict[str, Any]] | None) -> int:
    return max((int(r["bytes"]) for r in rows or []), default=0)


def culprit_ranks(errors: list[dict[str, Any]]) -> list[int]:
    """Senders of wrong data when known, else the ranks that saw wrong results."""
    named = {r for e in errors for r in (e.get("senders_wrong") or [])}
    named |= {int(e["source"]) for e in errors if e.get("source") is not None}
    return sorted(named) or sorted({int(e["rank"]) for e in errors})


def judge_collectives(m: dict[str, Any], threshold: rules.Threshold | None,
                      on_gpu: bool, *, floor_bytes: int | None = None,
                      fallback: rules.Threshold | None = None) -> Result:
    """The verdict of one launch. `floor_bytes`: the size `threshold` was published at; a sweep
    whose all-reduce stopped short of it does not judge that floor at a smaller size (WARN, or
    FAIL below `fallback`, the floor derived from the GPUs' links, at the sizes it reached)."""
    n = int(m["world_size"])
    details: dict[str, Any] = {
        "backend": m.get("backend"), "world_size": n, "env": m.get("env", {}),
        "launch": {k: m.get(k) for k in ("summary", "duration_s", "returncode", "command",
                                         "phase_s", "orphans_killed", "workdir") if k in m},
        "check_iters": m.get("check_iters"), "check_elems": m.get("check_elems"),
        "exact_ops": m.get("exact_ops", []), "exact_skipped": m.get("exact_skipped", {}),
        "fsdp_checked": m.get("fsdp_checked", {})}
    if not m.get("ok"):
        culprits = list(m.get("culprits") or [])
        what = "hung" if m.get("hung") else "failed"
        details.update(ranks=m.get("ranks"), log_tail=m.get("log_tail"), culprits=culprits)
        leftover = m.get("leftover_pids") or []
        extra = f"; {len(leftover)} process(es) could not be killed: {leftover}" if leftover else ""
        return fail(f"collective {what}: {m.get('summary')}{extra}", value=culprits,
                    expected="every rank finishes", details=details,
                    remedy=REMEDY_HANG if m.get("hung") else
                    "see the named rank's error and log tail; " + REMEDY_HANG)
    ops = {op: [busbw.complete_row(op, r, n) for r in rows] for op, rows in m["ops"].items()}
    figures = {FIGURE[op]: round(busbw.peak_busbw(rows), 3) for op, rows in ops.items() if rows}
    if ops.get("all_reduce"):
        figures["allreduce_latency_us"] = round(float(ops["all_reduce"][0]["time_us"]), 2)
    details.update(figures=figures, curve=ops.get("all_reduce", []), ops=ops,
                   table=m.get("table", ""))
    errors = list(m.get("errors") or [])
    sweep_wrong = {op: sum(int(r.get("wrong", 0)) for r in rows) for op, rows in ops.items()}
    if errors or any(sweep_wrong.values()):
        culprits = culprit_ranks(errors)
        details.update(errors=errors, culprits=culprits)
        text = "; ".join(_describe_error(e) for e in errors[:3]) or ", ".join(
            f"{op}: {w} wrong element(s) in the sweep" for op, w in sweep_wrong.items() if w)
        return fail(f"wrong results ({m.get('backend')}, {n} ranks): {text}", value=culprits,
                    expected="exact results", details=details, remedy=REMEDY_WRONG)
    peak = figures.get("allreduce_busbw_gbs", 0.0)
    exact = list(ops) + list(m.get("exact_ops") or [])
    fsdp = m.get("fsdp_checked") or {}
    skipped = m.get("exact_skipped") or {}
    cut = dict(m.get("cut") or {})
    reached = max((int(r["bytes"]) for r in ops.get("all_reduce", [])), default=0)
    details["sweep_reach"] = {"floor_bytes": floor_bytes, "all_reduce_reached_bytes": reached,
                              "asked_bytes": m.get("asked_bytes") or {},
                              "free_bytes": m.get("free_bytes"), "cut": cut}
    summary = (f"{n} ranks {m.get('backend')}: {len(exact)} collectives exact ({', '.join(exact)})"
               + (f", reduce-scatter/all-gather also at {max(fsdp.values()) * 4 / 2 ** 20:.3g} MiB"
                  if fsdp else "")
               + "".join(f"; {op} skipped: {why}" for op, why in skipped.items())
               + "".join(f"; {op} swept only up to {busbw.human_bytes(_top(ops.get(op)))}: {why}"
                         for op, why in cut.items() if op != "all_reduce")
               + f"; all-reduce peak busbw {peak:.2f} GB/s")
    if not on_gpu:
        return passed(f"{summary} (CPU processes: bandwidth is information)", value=peak,
                      unit="GB/s", details=details)
    if threshold is None:
        return passed(f"{summary} (no threshold: profile has none and the links are unknown)",
                      value=peak, unit="GB/s", details=details)
    expected = f">= {threshold.value:.0f} GB/s ({threshold.source})"
    details["threshold_source"] = threshold.source
    if floor_bytes and reached < floor_bytes:
        # Busbw grows with the message size: a floor published at 16 GiB judged at 8 GiB would
        # fail healthy nodes, and a pass there says nothing about 16 GiB.
        why = cut.get("all_reduce") or f"its largest all-reduce was {busbw.human_bytes(reached)}"
        short = (f"could not reach the size the floor is published at "
                 f"({busbw.human_bytes(floor_bytes)}): {why}")
        details["floor_not_judged"] = short
        if fallback is not None and rules.below(peak, fallback.value):
            return fail(f"{summary}, below {fallback.value:.0f} GB/s derived from its links at "
                        f"sizes up to {busbw.human_bytes(reached)}; the profile's floor: {short}",
                        value=peak, unit="GB/s", details=details, remedy=REMEDY_SLOW,
                        expected=f">= {fallback.value:.0f} GB/s ({fallback.source})")
        return warn(f"{summary} up to {busbw.human_bytes(reached)}, not judged against the "
                    f"{threshold.value:.0f} GB/s floor: {short}", value=peak, unit="GB/s",
                    expected=expected, details=details, remedy=REMEDY_REACH)
    if rules.below(peak, threshold.value):
        return fail(f"{summary}, below {threshold.value:.0f} GB/s", value=peak, unit="GB/s",
                    expected=expected, details=details, remedy=REMEDY_SLOW)
    return passed(summary, value=peak, unit="GB/s", expected=expected, details=details)


@check("nccl-allreduce", code="COL001",
       title="collectives exact and fast: all-reduce sweep, all-gather, reduce-scatter, broadcast",
       level="standard", stage="workload", tags=("collective", "multiprocess"), timeout_s=3600,
       gated_by=("gpu-occupied",),
       nvml=("compute_capability", "pcie_gen_max", "pcie_width_max", "nvlink", "fabric_info",
             "compute_mode", "nvlink_p2p_peers"),
       # cpu 3.1-5.5 s
       budget=Budget(value=8, cost=Cost(cpu=8, gpu=60, per_gpu=2), source="measured cpu", min_gpus=2))
def nccl_allreduce(ctx: Context) -> Result:
    """One process per GPU (NCCL), or N CPU processes with gloo: exact integer
    patterns through all-reduce, all-gather, reduce-scatter and broadcast, all-to-all (MoE) and
    the float8 all-gather (SKIP with the reason below compute capability 8.9), reduce-scatter and
    all-gather again at FSDP size (collective.sweep fsdp_elems), then an nccl-tests sweep. FAIL on
    a hang or crash (names the ranks), any wrong element (names rank and op), or peak all-reduce
    busbw below the profile threshold (thresholds.allreduce_busbw_gbs) or one derived from NVLink
    count / PCIe generation. On CPU the bandwidth is information."""
    plat = plan.platform(ctx)
    if plat.kind == "blocked":
        return skip(plan.BLOCKED)
    nproc = ctx.options.nproc or (plat.devices if plat.cuda
                                  else int(ctx.profile.get("collective.nproc_cpu")))
    if nproc < 2:
        return skip("a single GPU has nobody to talk to" if plat.cuda
                    else "one rank has nobody to talk to (--nproc 2 or more)")
    if plat.cuda:
        # One rank per GPU: the ranks are the only processes with a CUDA context (this process
        # creates none), so EXCLUSIVE_PROCESS GPUs are fine unless ranks would have to share.
        per_gpu = -(-nproc // plat.devices)
        gate = plan.compute_mode_gate(ctx, processes_per_gpu=per_gpu)
        if gate:
            return skip(gate)
        if per_gpu > 1:
            return skip(f"{nproc} ranks on {plat.devices} GPU(s): NCCL needs a GPU of its own "
                        f"for every rank (--nproc at most {plat.devices})")
    sweep = plan.setting(ctx, "collective.sweep", plat)
    if plat.cuda:
        sweep = gpu_sweep(ctx, sweep, nproc)
    extra: dict[str, Any] = {}
    with nccl_capture.capture(ctx.options.workdir and f"{ctx.options.workdir}/collective",
                              plat.cuda) as cap:
        if plat.cuda:  # NCCL's INFO log says which transport each channel used (nccl-transport)
            extra["env"] = nccl_capture.debug_env(ctx.profile)
        try:
            m = ctx.hw.workload(
                "collectives", nproc=nproc, sweep=sweep, backend="nccl" if plat.cuda else "gloo",
                timeout_s=float(plan.setting(ctx, "collective.timeout_s", plat, 300)),
                stall_s=float(plan.setting(ctx, "collective.stall_s", plat, 60)),
                start_timeout_s=float(ctx.profile.get("collective.start_timeout_s")),
                workdir=cap.workdir, **extra)
        except FileNotFoundError as exc:
            return error(f"could not launch torchrun: {exc}")
        log = cap.parse(m, simulated=ctx.hw.simulated)
    result = judge_collectives(m, busbw_threshold(ctx, nproc) if plat.cuda else None, plat.cuda,
                               floor_bytes=floor_size(ctx, nproc) if plat.cuda else None,
                               fallback=derived_threshold(ctx, nproc) if plat.cuda else None)
    if log is not None:
        result.details["nccl_log"] = log.to_dict()
        result.details["transports"] = log.kinds
    return result
