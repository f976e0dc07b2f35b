"""GPU peer-to-peer: which pairs can reach each other directly, and how fast each copies.

Pairs are judged within their path class (checks/node/topology.py): a cross-socket copy
on a healthy two-socket PCIe server is slower than a copy inside one PCIe switch, so comparing
it with every other pair would fail a healthy machine and hide a slow pair inside a switch.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from checks.hw.base import HardwareError
from checks.model import Result, fail, passed, skip
from checks.node import rules, topology
from checks.node import workload_plan as plan
from checks.node.context import Context, Gpu
from checks.node.registry import Budget, Cost, check

REMEDY = ("check nvlink and pcie-link for these GPUs, nvidia-fabricmanager on NVSwitch systems, "
          "and ACS/IOMMU settings that force P2P through the root complex (PCIe hosts)")
Pair = tuple[int, int]


@dataclass
class Layout:
    """The measured GPUs (measurement order) with their places and report labels."""

    places: list[topology.GpuPlace]
    labels: list[str]
    gpus: list[Gpu | None]
    nvswitch: bool

    def classes(self) -> dict[Pair, str]:
        return topology.classify(self.places, nvswitch=self.nvswitch)


def _nvlink_remotes(gpu: Gpu) -> tuple[str, ...]:
    return tuple(str(link["remote_pci"]).lower() for link in plan.active_links(gpu)
                 if link.get("remote_pci"))


def _nvlink_to_switch(gpu: Gpu) -> bool:
    return any(link.get("remote_type") == "switch" for link in plan.active_links(gpu))


def _nvlink_p2p(gpu: Gpu) -> tuple[str, ...]:
    try:
        peers = gpu.handle.query("nvlink_p2p_peers") or []
    except HardwareError:
        return ()
    return tuple(str(p).lower() for p in peers)


def layout(ctx: Context, m: dict[str, Any]) -> Layout:
    """Match every measured device to its NVML GPU (by PCI address, else index) and PCI device."""
    n = int(m["count"])
    pcis = list(m.get("pci") or [None] * n)
    try:
        gpus = list(ctx.gpus)
    except HardwareError:
        gpus = []
    by_pci = {(g.device.pci or "").lower(): g for g in gpus if g.device.pci}
    places, labels, found = [], [], []
    for k in range(n):
        pci = (pcis[k] or "").lower() or None
        gpu = by_pci.get(pci) if pci else (gpus[k] if k < len(gpus) and not any(pcis) else None)
        address = pci or (gpu.device.pci.lower() if gpu and gpu.device.pci else None)
        dev = ctx.pci_device(address) if address else None
        if dev is None and address:  # sysfs spelling may differ in case
            dev = next((d for d in ctx.pci if d.address.lower() == address), None)
        places.append(topology.GpuPlace(
            pci=address, pci_path=dev.pci_path if dev else (),
            numa_node=dev.numa_node if dev else None,
            nvlinks_active=plan.nvlinks_up(gpu) if gpu else 0,
            nvlink_remotes=_nvlink_remotes(gpu) if gpu else (),
            nvlink_to_switch=_nvlink_to_switch(gpu) if gpu else False,
            nvlink_p2p=_nvlink_p2p(gpu) if gpu else (),
            fabric_clique=plan.fabric_clique(gpu) if gpu else None))
        labels.append(f"GPU{gpu.device.index}" if gpu and gpu.device.index is not None
                      else f"cuda:{k}")
        found.append(gpu)
    return Layout(places, labels, found,
                  nvswitch=plan.nvswitch_system(ctx, [g for g in found if g is not None]))


def _capability(ctx: Context, gpus: list[Gpu | None]) -> str | None:
    cc = ctx.profile.get("compute_capability")
    if cc is not None:
        return str(cc)
    for gpu in gpus:
        try:
            major, minor = gpu.handle.query("compute_capability")  # type: ignore[union-attr]
            return f"{major}.{minor}"
        except (AttributeError, HardwareError, TypeError, ValueError):
            continue
    return None


def pair_thresholds(ctx: Context, lay: Layout, classes: dict[Pair, str]
                    ) -> dict[Pair, rules.Threshold | None]:
    """Floor of every pair, for its class.

    An explicit `p2p.min_gbs.<class>` wins (`thresholds.p2p_bw_gbs` is the nvlink class's).
    Otherwise a floor derived from links applies only to the class whose path those links are:
    NVLink pairs from the NVLinks of the pair, PCIe-switch and same-socket pairs (and pairs with
    no topology information) from the narrower PCIe link of the two. A cross-socket copy also
    crosses the CPUs' interconnect, which no GPU link describes: only the straggler rule and an
    explicit profile floor judge it."""
    p = ctx.profile
    link_gbs = (p.get("collective.nvlink_link_gbs") or {}).get(_capability(ctx, lay.gpus) or "")
    out: dict[Pair, rules.Threshold | None] = {}
    class_min = p.get("p2p.min_gbs") or {}
    for (i, j), cls in classes.items():
        if class_min.get(cls) is not None:
            out[(i, j)] = rules.Threshold(float(class_min[cls]),
                                          f"profile {p.name} p2p.min_gbs.{cls}")
            continue
        if cls == topology.NVLINK and p.get("thresholds.p2p_bw_gbs") is not None:
            out[(i, j)] = rules.Threshold(float(p.get("thresholds.p2p_bw_gbs")),
                                          f"profile {p.name} thresholds.p2p_bw_gbs")
            continue
        a, b = lay.places[i], lay.places[j]
        ga, gb = lay.gpus[i], lay.gpus[j]
        if cls == topology.NVLINK:
            links = topology.nvlinks_between(a, b, nvswitch=lay.nvswitch)
            out[(i, j)] = rules.derived_link_threshold(
                nvlinks=links, link_gbs=link_gbs,
                nvlink_fraction=float(p.get("p2p.nvlink_fraction")),
                pcie_gen=None, pcie_width=None, pcie_fraction=0.0)
        elif cls in (topology.SWITCH, topology.SOCKET, topology.UNKNOWN) and ga and gb:
            gens = [g for g in (plan.query_int(ga, "pcie_gen_max"),
                                plan.query_int(gb, "pcie_gen_max")) if g]
            widths = [w for w in (plan.query_int(ga, "pcie_width_max"),
                                  plan.query_int(gb, "pcie_width_max")) if w]
            out[(i, j)] = rules.derived_link_threshold(
                nvlinks=0, link_gbs=None, nvlink_fraction=0.0,
                pcie_gen=min(gens, default=None), pcie_width=min(widths, default=None),
                pcie_fraction=float(p.get("p2p.pcie_fraction")))
        else:
            out[(i, j)] = None
    return out


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def judge_p2p(m: dict[str, Any], classes: dict[Pair, str],
              thresholds: dict[Pair, rules.Threshold | None], straggler_pct: float, *,
              labels: list[str] | None = None,
              access_expected: dict[Pair, bool] | None = None) -> Iterator[Result]:
    """Verdict over every ordered pair: floor per pair, straggler rule within each class, peer
    access where the path needs it."""
    n = int(m["count"])
    names = labels or [f"GPU{i}" for i in range(n)]
    bw = m["bandwidth_gbs"]
    pairs = {(i, j): float(bw[i][j]) for i in range(n) for j in range(n)
             if i != j and bw[i][j] is not None}
    slow: dict[Pair, rules.Straggler] = {}
    summary: dict[str, dict[str, Any]] = {}
    for cls in topology.CLASSES:
        members = {k: v for k, v in pairs.items() if classes.get(k) == cls}
        if not members:
            continue
        slow.update(rules.stragglers(members, straggler_pct))
        floors = {t.value for k, t in thresholds.items() if classes.get(k) == cls and t}
        summary[cls] = {"pairs": len(members), "min_gbs": round(min(members.values()), 2),
                        "median_gbs": round(_median(list(members.values())), 2),
                        "floor_gbs": round(min(floors), 2) if floors else None}
    expected_access = access_expected or {}
    no_access = [(i, j) for i in range(n) for j in range(n)
                 if i != j and not m["access"][i][j]]
    floor_of = {k: t for k, t in thresholds.items() if t is not None}
    below = {k: v for k, v in pairs.items() if k in floor_of and rules.below(v, floor_of[k].value)}

    def name(k: Pair) -> str:
        return f"{names[k[0]]}->{names[k[1]]} ({classes.get(k, topology.UNKNOWN)})"

    figures: dict[str, float] = {
        "p2p_min_gbs": round(min(pairs.values(), default=0.0), 2),
        "p2p_median_gbs": round(_median(list(pairs.values())), 2)}
    for cls, entry in summary.items():
        figures[f"p2p_{cls.replace('-', '_')}_median_gbs"] = entry["median_gbs"]
    details: dict[str, Any] = {
        "access": m["access"], "bandwidth_gbs": bw, "pci": m.get("pci"), "bytes": m.get("bytes"),
        "pairs": [{"src": names[i], "dst": names[j], "class": classes.get((i, j)),
                   "gbs": round(pairs[(i, j)], 2) if (i, j) in pairs else None,
                   "access": bool(m["access"][i][j]),
                   "floor_gbs": round(floor_of[(i, j)].value, 2) if (i, j) in floor_of
                   else None}
                  for i in range(n) for j in range(n) if i != j],
        "classes": summary, "straggler_pct": straggler_pct,
        "threshold_sources": sorted({t.source for t in thresholds.values() if t}),
        "figures": figures}
    problems = []
    missing = [k for k in no_access if expected_access.get(k)]
    if missing:
        problems.append(f"no peer access for {', '.join(name(k) for k in missing[:8])}")
    for k, v in sorted(below.items())[:8]:
        t = floor_of[k]
        problems.append(f"{name(k)} {v:.1f} GB/s below {t.value:.1f} ({t.source})")
    for k, s in sorted(slow.items())[:8]:
        if k not in below:
            problems.append(f"{name(k)} {s.value:.1f} GB/s is {s.shortfall_pct:.0f} % below the "
                            f"median of its class's other pairs ({s.peers_median:.1f})")
    details["slow_pairs"] = [f"{names[i]}-{names[j]}" for i, j in sorted(set(below) | set(slow))]
    per_class = "; ".join(f"{cls} {e['pairs']} pair(s) {e['min_gbs']:.1f}-"
                          f"{max(v for k, v in pairs.items() if classes.get(k) == cls):.1f} GB/s"
                          for cls, e in summary.items())
    if problems:
        yield fail(f"{len(problems)} P2P problem(s): {'; '.join(problems)}",
                   value=figures["p2p_min_gbs"], unit="GB/s",
                   expected=f"each pair within {straggler_pct:g} % of its class and above its "
                            f"floor", details=details, remedy=REMEDY)
        return
    note = "" if not no_access else f" ({len(no_access)} pair(s) copy through the host)"
    yield passed(f"{len(pairs)} GPU pairs by path class: {per_class}{note}",
                 value=figures["p2p_min_gbs"], unit="GB/s",
                 expected=f"each pair within {straggler_pct:g} % of its class and above its floor",
                 details=details)


@check("p2p-bandwidth", code="COL002", title="GPU peer access and copy bandwidth per pair",
       level="standard", stage="workload", tags=("collective", "gpu"), timeout_s=900,
       gated_by=("gpu-occupied",),
       nvml=("compute_capability", "pcie_gen_max", "pcie_width_max", "nvlink", "fabric_info",
             "compute_mode", "nvlink_p2p_peers"),
       # n x (n-1) pairs of 256 MiB copies; smaller: 64 MiB copies, still past the bandwidth knee
       budget=Budget(value=6, cost=Cost(cpu=1, gpu=15, per_gpu=4), source="measured cpu",
                     min_gpus=2, smaller_cost=Cost(cpu=1, gpu=12, per_gpu=1.5),
                     smaller_profile={"p2p": {"bytes": 67108864}}))
def p2p_bandwidth(ctx: Context) -> Iterator[Result]:
    """`can_device_access_peer` for every pair and the one-way copy GB/s GPU i -> GPU j, each pair
    classed by its path (NVLink/NVSwitch, one PCIe switch, one socket, across sockets). FAIL
    when a pair is below its class's floor (p2p.min_gbs.<class>, thresholds.p2p_bw_gbs for
    NVLink, or one derived from the NVLinks / PCIe link its path runs over), more than
    straggler_pct below the median of the other pairs of its class, or lacks peer access on an
    NVLink path or an NVSwitch system. SKIP on CPU and single-GPU hosts."""
    plat = plan.platform(ctx)
    if plat.kind == "blocked":
        yield skip(plan.BLOCKED)
        return
    if not plat.cuda:
        yield skip("no GPU: peer-to-peer needs at least two GPUs")
        return
    if plat.devices < 2:
        yield skip("a single GPU has no peer")
        return
    gate = plan.compute_mode_gate(ctx, processes_per_gpu=1)
    if gate:
        yield skip(gate)
        return
    m = ctx.hw.workload("p2p", nbytes=int(ctx.profile.get("p2p.bytes")))
    p = ctx.profile
    lay = layout(ctx, m)
    classes = lay.classes()
    expected = {k: cls == topology.NVLINK or lay.nvswitch for k, cls in classes.items()}
    yield from judge_p2p(m, classes, pair_thresholds(ctx, lay, classes),
                         float(p.get("straggler_pct", 10)), labels=lay.labels,
                         access_expected=expected)
