"""Pure decision rules of the workload checks, tested on fixture numbers."""

from __future__ import annotations

import math
import statistics
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

K = TypeVar("K", bound=Hashable)


def below(value: float, floor: float) -> bool:
    """`value < floor`, and True for a value that is not a finite number: NaN compares false
    with everything, so a bare `<` would let a NaN measurement pass its threshold."""
    return not math.isfinite(value) or value < floor


@dataclass(frozen=True)
class Straggler:
    value: float
    peers_median: float
    shortfall_pct: float  # how far below the peers' median, in percent


def stragglers(values: Mapping[K, float], pct: float) -> dict[K, Straggler]:
    """Members more than `pct` % below the median of the *other* members.

    Comparing with the peers (not the median including itself) keeps the rule symmetric for
    two GPUs: the slower one is named when it is more than pct % below the faster one.
    Needs at least two members; absolute thresholds are a separate rule.
    """
    out: dict[K, Straggler] = {}
    if len(values) < 2:
        return out
    for key, value in values.items():
        # Peers that are not finite numbers are left out of the median (they are stragglers
        # themselves); a member that is not a finite number is always one.
        peers = [v for k, v in values.items() if k != key and math.isfinite(v)]
        median = statistics.median(peers) if peers else math.nan
        if not math.isfinite(value):
            out[key] = Straggler(value=value, peers_median=median, shortfall_pct=math.inf)
            continue
        if not peers or median <= 0:
            continue
        shortfall = (median - value) / median * 100
        if shortfall > pct:
            out[key] = Straggler(value=value, peers_median=median, shortfall_pct=shortfall)
    return out


def saturation(points: Sequence[Mapping[str, Any]], fraction: float = 0.9) -> Mapping[str, Any]:
    """The first point of a throughput curve that reaches `fraction` of its best."""
    best = max(float(p["samples_per_s"]) for p in points)
    return next(p for p in points if float(p["samples_per_s"]) >= fraction * best)


# PCIe payload bandwidth per lane and direction, GB/s (after 8b/10b or 128b/130b encoding).
PCIE_LANE_GBS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}


def pcie_gbs(gen: int, width: int) -> float:
    return PCIE_LANE_GBS.get(int(gen), 0.0) * int(width)


@dataclass(frozen=True)
class Threshold:
    value: float
    source: str  # where it comes from, for the report


def derived_link_threshold(*, nvlinks: int, link_gbs: float | None, nvlink_fraction: float,
                           pcie_gen: int | None, pcie_width: int | None,
                           pcie_fraction: float) -> Threshold | None:
    """A floor from what the hardware reports: NVLink links x per-link one-way GB/s x fraction,
    or, without NVLink, the PCIe link's one-way GB/s x fraction. None when neither is known."""
    if nvlinks > 0 and link_gbs:
        raw = nvlinks * link_gbs
        return Threshold(raw * nvlink_fraction,
                         f"derived: {nvlinks} NVLinks x {link_gbs:g} GB/s = {raw:g} GB/s "
                         f"x {nvlink_fraction:g}")
    if pcie_gen and pcie_width:
        raw = pcie_gbs(pcie_gen, pcie_width)
        return Threshold(raw * pcie_fraction,
                         f"derived: PCIe Gen{pcie_gen} x{pcie_width} = {raw:.1f} GB/s "
                         f"x {pcie_fraction:g}")
    return None


def shm_needed(*, batch_bytes: int, workers: int, prefetch: int, ranks: int) -> int:
    """Bytes of /dev/shm the DataLoaders of one node hold at once: every rank's workers keep
    `prefetch` batches each in shared memory, plus the batch being handed over."""
    return ranks * (workers * prefetch + 1) * batch_bytes
