"""The straggler rule: a GPU or host well below its peers' median, whatever its absolute figure.

Peers are the figures with the same check id, figure name, GPU model profile and scope (per-GPU
figures against per-GPU figures, host-level figures against host-level figures). With X the
profile's ``straggler_pct`` (default 10) and the deficit measured from the peer median in the
figure's bad direction (below it for rates, above it for times):

- deficit > X %      → FAIL
- deficit > X/2 %    → WARN
- otherwise, or fewer than MIN_PEERS peers, or a median of 0 → nothing.
- a figure that is not a finite number (NaN, ±inf: a broken measurement) → FAIL, whatever its
  peers; it is left out of the peer statistics (a NaN would make every comparison false).

A figure that passes its absolute threshold can still be a straggler: an absolute threshold is set
for the slowest acceptable part of a model, a straggler is slow compared with the parts beside it.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from checks.report.figures import Figure, GpuRef, higher_is_better

DEFAULT_PCT = 10.0
WARN_FRACTION = 0.5
MIN_PEERS = 3


@dataclass(frozen=True)
class PeerKey:
    check: str
    name: str
    profile: str
    scope: str  # "gpu" or "host"


@dataclass(frozen=True)
class FigureStats:
    key: PeerKey
    count: int
    median: float
    low: float
    high: float
    threshold_pct: float

    @property
    def higher_is_better(self) -> bool:
        return higher_is_better(self.key.name)

    def to_dict(self) -> dict[str, Any]:
        return {"check": self.key.check, "name": self.key.name, "profile": self.key.profile,
                "scope": self.key.scope, "better": "higher" if self.higher_is_better else "lower",
                "count": self.count, "median": self.median, "min": self.low, "max": self.high,
                "threshold_pct": self.threshold_pct}


@dataclass(frozen=True)
class Straggler:
    host: str
    check: str
    name: str
    gpu: GpuRef | None
    value: float
    median: float
    deficit_pct: float
    threshold_pct: float
    status: str  # "FAIL" or "WARN"

    @property
    def finite(self) -> bool:
        return math.isfinite(self.value)

    def to_dict(self) -> dict[str, Any]:
        # JSON has no NaN or infinity: a figure that is not a finite number is null, and says why.
        return {"host": self.host, "check": self.check, "name": self.name,
                "gpu": self.gpu.to_dict() if self.gpu else None,
                "value": self.value if self.finite else None,
                "median": self.median if math.isfinite(self.median) else None,
                "deficit_pct": round(self.deficit_pct, 2) if self.finite else None,
                "threshold_pct": self.threshold_pct, "status": self.status,
                **({} if self.finite else {"reason": f"not a finite number ({self.value})"})}


def deficit_pct(value: float, median: float, higher_better: bool) -> float:
    """How far `value` is on the bad side of `median`, in percent of it (negative: better)."""
    gap = median - value if higher_better else value - median
    return 100.0 * gap / median


def classify(deficit: float, threshold_pct: float) -> str | None:
    if deficit > threshold_pct:
        return "FAIL"
    if deficit > threshold_pct * WARN_FRACTION:
        return "WARN"
    return None


def group_by_host(hosts: Iterable[tuple[str, Iterable[Any]]]) -> tuple[dict[PeerKey, list[Figure]],
                                                                         list[Figure], list[Any]]:
    """(the finite figures by peer group, the figures that are not finite numbers, everything
    else) of each host's (GPU model profile, figures and curves), in one pass (10 000 hosts:
    200 000 figures)."""
    # keyed by plain tuples while grouping (a dataclass key hashes and compares in Python: 2 s
    # for 10 000 hosts' 180 000 figures), the same order as sorting the PeerKeys' fields
    groups: dict[tuple[str, str, str, str], list[Figure]] = defaultdict(list)
    broken: list[Figure] = []
    other: list[Any] = []
    isfinite = math.isfinite
    for profile, published in hosts:
        for fig in published:
            if type(fig) is not Figure:
                other.append(fig)
            elif isfinite(fig.value):
                groups[(fig.check, fig.name, profile, "gpu" if fig.gpu else "host")].append(fig)
            else:
                broken.append(fig)
    keyed = {PeerKey(*key): members for key, members in sorted(groups.items(), key=lambda kv: kv[0])}
    return keyed, broken, other


def find(groups: dict[PeerKey, list[Figure]],
         pct_of: Callable[[str], float]) -> tuple[list[FigureStats], list[Straggler]]:
    """The median of each peer group and the stragglers in it; `pct_of(profile)` gives the
    profile's straggler_pct."""
    stats: list[FigureStats] = []
    stragglers: list[Straggler] = []
    for key, members in groups.items():
        values = [f.value for f in members]
        median = statistics.median(values)
        pct = pct_of(key.profile)
        stats.append(FigureStats(key, len(values), median, min(values), max(values), pct))
        if len(values) < MIN_PEERS or median <= 0:
            continue
        # deficit_pct's arithmetic, one list per group; classify only past its lower limit
        deficits = ([100.0 * (median - v) / median for v in values] if higher_is_better(key.name)
                    else [100.0 * (v - median) / median for v in values])
        low = min(pct, pct * WARN_FRACTION)
        for fig, deficit in zip(members, deficits, strict=True):
            status = classify(deficit, pct) if deficit > low else None
            if status:
                stragglers.append(Straggler(fig.host, fig.check, fig.name, fig.gpu, fig.value,
                                            median, deficit, pct, status))
    stragglers.sort(key=lambda s: (s.status != "FAIL", -s.deficit_pct, s.host))
    return stats, stragglers


def not_finite(figures: Iterable[Figure], stats: Iterable[FigureStats], profile_of: Callable[[str], str],
               pct_of: Callable[[str], float]) -> list[Straggler]:
    """A FAIL for each figure that is NaN or infinite, against its peers' median when there is one."""
    medians = {s.key: s.median for s in stats}
    out = []
    for fig in figures:
        key = PeerKey(fig.check, fig.name, profile_of(fig.host), "gpu" if fig.gpu else "host")
        pct = pct_of(key.profile)
        out.append(Straggler(fig.host, fig.check, fig.name, fig.gpu, fig.value,
                             medians.get(key, math.nan), math.inf, pct, "FAIL"))
    return out
