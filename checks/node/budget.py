"""`python -m checks --budget 5m`: choose the checks and sizes that fit a time budget, most
valuable first, and say what was left out.

The value and cost of every check are data (checks/node/budget.yaml): a value from 1 to 10 (what its
verdict is worth on a node about to run jobs) and a cost in seconds for a host without GPUs and
for a GPU host (a fixed part plus a part per GPU), measured where the source says so, estimated
otherwise. A check may offer a `smaller` size (fewer dtypes, smaller buffers: profile settings
overridden for this run) and the burn-in a `scalable` duration.

Planning: the quick-level checks first (all of them must fit, else the budget is a usage error),
then the others in order of value (then cheaper first); each is taken at full size if it fits
what is left, else at its smaller size if that fits, else left out with the reason. The burn-in,
when taken, gets its minimum duration first and then whatever is left, up to --duration.
The plan goes into the report (`budget`), so a verdict says what it did not look at.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from checks import resources

TABLE = resources.data("node", "budget.yaml")


class BudgetError(Exception):
    """Malformed budget table or budget (one line)."""


@dataclass(frozen=True)
class Cost:
    cpu: float
    gpu: float
    per_gpu: float = 0.0

    def on(self, gpus: int) -> float:
        return self.cpu if gpus == 0 else self.gpu + self.per_gpu * gpus


@dataclass(frozen=True)
class Entry:
    value: float
    cost: Cost
    source: str
    smaller_cost: Cost | None = None
    smaller_profile: Mapping[str, Any] = field(default_factory=dict)
    min_duration_s: float | None = None  # scalable (burn-in): the least worth running
    shared: str | None = None  # a launch shared with other checks, paid by the first chosen
    min_gpus: int = 0  # below this many GPUs (but not on a CPU host) the check SKIPs at once

    def on(self, gpus: int) -> float:
        """Seconds on a host with `gpus` GPUs: a check that needs more GPUs than the host has
        SKIPs at once (a single GPU has no peer for P2P or a collective)."""
        if 0 < gpus < self.min_gpus:
            return SKIP_COST_S
        return self.cost.on(gpus)


@dataclass
class Choice:
    id: str
    size: str  # "full", "smaller" or "<N> s" (burn-in)
    cost_s: float
    value: float

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "size": self.size, "cost_s": round(self.cost_s, 1),
                "value": self.value}


@dataclass
class Plan:
    budget_s: float
    gpus: int
    chosen: list[Choice]
    left_out: list[dict[str, Any]]
    profile_overrides: dict[str, Any]
    duration_s: float | None  # burn-in duration chosen, None when the burn-in is not run

    @property
    def estimated_s(self) -> float:
        return sum(c.cost_s for c in self.chosen)

    @property
    def ids(self) -> set[str]:
        return {c.id for c in self.chosen}

    def to_dict(self) -> dict[str, Any]:
        return {"budget_s": self.budget_s, "gpus": self.gpus,
                "estimated_s": round(self.estimated_s, 1),
                "chosen": [c.to_dict() for c in self.chosen], "left_out": self.left_out,
                "profile_overrides": self.profile_overrides, "burn_in_duration_s": self.duration_s,
                "table": str(TABLE.name)}

    def summary(self) -> str:
        left = ", ".join(x["id"] for x in self.left_out) or "nothing"
        return (f"budget {self.budget_s:g} s: {len(self.chosen)} checks planned "
                f"(~{self.estimated_s:.0f} s); left out: {left}")


def _cost(raw: Any, where: str) -> Cost:
    if not isinstance(raw, Mapping) or "cpu" not in raw or "gpu" not in raw:
        raise BudgetError(f"{where}: cost_s needs cpu and gpu seconds")
    try:
        return Cost(float(raw["cpu"]), float(raw["gpu"]), float(raw.get("per_gpu", 0.0)))
    except (TypeError, ValueError):
        raise BudgetError(f"{where}: cost_s values must be numbers") from None


SHARED = "shared:"  # table keys of shared launches: "shared:acceptance"
SKIP_COST_S = 1.0  # a check that SKIPs at once, as the quick checks are counted


def parse(data: Any) -> dict[str, Entry]:
    """check id -> Entry, and "shared:<name>" -> the Entry of each shared launch."""
    if not isinstance(data, Mapping) or not isinstance(data.get("checks"), Mapping):
        raise BudgetError("budget table: top level needs a `checks:` mapping")
    table = {}
    for name, raw in (data.get("shared") or {}).items():
        if not isinstance(raw, Mapping) or "cost_s" not in raw:
            raise BudgetError(f"budget table, shared {name}: needs cost_s")
        table[SHARED + str(name)] = Entry(0.0, _cost(raw["cost_s"], f"shared {name}"),
                                          str(raw.get("source", "estimated")))
    for check_id, raw in data["checks"].items():
        where = f"budget table, {check_id}"
        if not isinstance(raw, Mapping) or "value" not in raw or "cost_s" not in raw:
            raise BudgetError(f"{where}: needs value and cost_s")
        smaller = raw.get("smaller") or {}
        scalable = raw.get("scalable") or {}
        table[str(check_id)] = Entry(
            float(raw["value"]), _cost(raw["cost_s"], where), str(raw.get("source", "estimated")),
            _cost(smaller["cost_s"], f"{where}.smaller") if smaller else None,
            dict(smaller.get("profile") or {}),
            float(scalable["min_s"]) if scalable else None,
            str(raw["shared"]) if raw.get("shared") else None,
            int(raw.get("min_gpus", 0)))
        if raw.get("shared") and SHARED + str(raw["shared"]) not in table:
            raise BudgetError(f"{where}: unknown shared launch {raw['shared']!r}")
    return table


@functools.cache
def table() -> dict[str, Entry]:
    try:
        return parse(yaml.safe_load(TABLE.read_text()))
    except (OSError, yaml.YAMLError) as exc:
        raise BudgetError(f"{TABLE}: {' '.join(str(exc).split())}") from None


def _merge(into: dict[str, Any], over: Mapping[str, Any]) -> None:
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def make(check_ids: Iterable[str], budget_s: float, *, gpus: int, duration_s: float,
         entries: Mapping[str, Entry] | None = None, required: Iterable[str] = ()) -> Plan:
    """The plan for these checks (in run order) on a host with `gpus` GPUs.

    `required` (the quick level's checks: the node's health) are planned first; a budget that
    cannot hold all of them is a BudgetError (a usage error: a verdict that silently skipped
    the health checks would read as a healthy node). The CLI also refuses an empty plan."""
    if budget_s <= 0:
        raise BudgetError("--budget must be more than 0 s")
    entries = table() if entries is None else entries
    ids = list(check_ids)
    missing = [i for i in ids if i not in entries or i.startswith(SHARED)]
    if missing:
        raise BudgetError(f"budget table has no entry for {', '.join(missing)} (checks/node/budget.yaml)")
    must = [i for i in ids if i in set(required)]
    need = sum(entries[i].on(gpus) for i in must)
    if need > budget_s:
        raise BudgetError(f"--budget {budget_s:g} s is too small: the {len(must)} quick-level "
                          f"checks (the node's health) need ~{need:.0f} s here; give at least "
                          f"--budget {math.ceil(need)}s")
    order = sorted(ids, key=lambda i: (i not in must, -entries[i].value,
                                       entries[i].on(gpus), ids.index(i)))
    left = budget_s
    chosen: dict[str, Choice] = {}
    left_out: list[dict[str, Any]] = []
    overrides: dict[str, Any] = {}
    paid: set[str] = set()
    for check_id in order:
        e = entries[check_id]
        full = e.on(gpus) + (e.min_duration_s or 0.0)  # start-up + the least timed load
        if e.shared and e.shared not in paid:
            full += entries[SHARED + e.shared].cost.on(gpus)
        smaller = e.smaller_cost.on(gpus) if e.smaller_cost and full > SKIP_COST_S else None
        if full <= left:
            chosen[check_id] = Choice(check_id, "full", full, e.value)
            left -= full
            if e.shared:
                paid.add(e.shared)
        elif smaller is not None and smaller <= left:
            chosen[check_id] = Choice(check_id, "smaller", smaller, e.value)
            _merge(overrides, e.smaller_profile)
            left -= smaller
        else:
            need = min(full, smaller) if smaller is not None else full
            left_out.append({"id": check_id, "value": e.value, "cost_s": round(need, 1),
                             "reason": f"needs ~{need:.0f} s, {max(left, 0):.0f} s left"})
    duration = None
    for check_id, choice in chosen.items():
        e = entries[check_id]
        if e.min_duration_s is not None:
            duration = min(duration_s, e.min_duration_s + left)
            extra = duration - e.min_duration_s
            choice.cost_s += extra
            choice.size = f"{duration:.0f} s"
            left -= extra
    run_order = [Choice(**vars(chosen[i])) for i in ids if i in chosen]
    return Plan(budget_s, gpus, run_order, left_out, overrides, duration)


def apply_overrides(profile_data: dict[str, Any], overrides: Mapping[str, Any]) -> None:
    """Merge the smaller sizes the plan chose into the profile data used for this run."""
    _merge(profile_data, overrides)
