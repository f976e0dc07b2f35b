"""GPU peer-to-peer: which pairs can reach each other directly, and how fast each copies."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..context import Context
from ..hw.base import HardwareError
from ..model import Result, fail, passed, skip
from ..registry import check
from ..workloads import plan, rules

REMEDY = ("check nvlink and pcie-link for these GPUs, nvidia-fabricmanager on NVSwitch systems, "
          "and ACS/IOMMU settings that force P2P through the root complex (PCIe hosts)")


def pair_threshold(ctx: Context) -> rules.Threshold | None:
    p = ctx.profile
    figure = p.get("thresholds.p2p_bw_gbs")
    if figure is not None:
        return rules.Threshold(float(figure), f"profile {p.name} thresholds.p2p_bw_gbs")
    try:
        gpus = ctx.gpus
    except HardwareError:
        return None
    if not gpus:
        return None
    gens = [g for g in (plan.query_int(x, "pcie_gen_max") for x in gpus) if g]
    widths = [w for w in (plan.query_int(x, "pcie_width_max") for x in gpus) if w]
    return rules.derived_link_threshold(
        nvlinks=min(plan.nvlinks_up(g) for g in gpus),
        link_gbs=(p.get("collective.nvlink_link_gbs") or {}).get(str(p.get("compute_capability"))),
        nvlink_fraction=float(p.get("p2p.nvlink_fraction", 0.6)),
        pcie_gen=min(gens, default=None), pcie_width=min(widths, default=None),
        pcie_fraction=float(p.get("p2p.pcie_fraction", 0.5)))


def judge_p2p(m: dict[str, Any], threshold: rules.Threshold | None, straggler_pct: float,
              peer_access_expected: bool) -> Iterator[Result]:
    n = int(m["count"])
    bw = m["bandwidth_gbs"]
    pairs = {(i, j): float(bw[i][j]) for i in range(n) for j in range(n)
             if i != j and bw[i][j] is not None}
    slow = rules.stragglers(pairs, straggler_pct)
    no_access = [(i, j) for i in range(n) for j in range(n) if i != j and not m["access"][i][j]]
    below = {k: v for k, v in pairs.items() if threshold and v < threshold.value}
    median = sorted(pairs.values())[len(pairs) // 2] if pairs else 0.0
    details = {"access": m["access"], "bandwidth_gbs": bw, "pci": m.get("pci"),
               "bytes": m.get("bytes"),
               "figures": {"p2p_min_gbs": round(min(pairs.values(), default=0.0), 2),
                           "p2p_median_gbs": round(median, 2)}}
    expected = f">= {threshold.value:.0f} GB/s ({threshold.source})" if threshold else None
    problems = []
    if no_access and peer_access_expected:
        problems.append(f"no peer access for {', '.join(f'{i}->{j}' for i, j in no_access[:8])}")
    for (i, j), v in sorted(below.items())[:8]:
        problems.append(f"GPU{i}->GPU{j} {v:.0f} GB/s below {threshold.value:.0f}")  # type: ignore[union-attr]
    for (i, j), s in sorted(slow.items())[:8]:
        if (i, j) not in below:
            problems.append(f"GPU{i}->GPU{j} {s.value:.0f} GB/s is {s.shortfall_pct:.0f} % below "
                            f"its peers' median {s.peers_median:.0f}")
    details["slow_pairs"] = [f"{i}-{j}" for i, j in sorted(set(below) | set(slow))]
    if problems:
        yield fail(f"{len(problems)} P2P problem(s): {'; '.join(problems)}",
                   value=round(min(pairs.values(), default=0.0), 2), unit="GB/s",
                   expected=expected, details=details, remedy=REMEDY)
        return
    note = "" if not no_access else f" ({len(no_access)} pair(s) copy through the host)"
    yield passed(f"{len(pairs)} GPU pairs: copy {min(pairs.values(), default=0):.0f}-"
                 f"{max(pairs.values(), default=0):.0f} GB/s, median {median:.0f}{note}",
                 value=round(min(pairs.values(), default=0.0), 2), unit="GB/s",
                 expected=expected, details=details)


@check("p2p-bandwidth", code="COL002", title="GPU peer access and copy bandwidth per pair",
       level="standard", stage="workload", tags=("collective", "gpu"), timeout_s=900)
def p2p_bandwidth(ctx: Context) -> Iterator[Result]:
    """`can_device_access_peer` for every pair and the one-way copy GB/s GPU i -> GPU j. FAIL
    when a pair is below thresholds.p2p_bw_gbs (or a floor derived from NVLink / PCIe), more than
    straggler_pct below the median of the pairs, or lacks peer access on an NVLink/NVSwitch
    system. SKIP on CPU and single-GPU hosts."""
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
    m = ctx.hw.workload("p2p", nbytes=int(ctx.profile.get("p2p.bytes", 256 << 20)))
    p = ctx.profile
    expected_access = bool(p.get("nvswitch")) or int(p.get("nvlink.links") or 0) > 0
    yield from judge_p2p(m, pair_threshold(ctx), float(p.get("straggler_pct", 10)),
                         expected_access)
