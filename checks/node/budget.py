"""`python -m checks --budget 5m`: choose the checks and sizes that fit a time budget, most
valuable first, and say what was left out.

Every check declares its value and cost with itself: `@check(..., budget=Budget(value=...,
cost=Cost(cpu=..., gpu=..., per_gpu=...), source=...))` (checks/node/registry.py refuses a check
without one, naming the line); a note on how a figure was measured sits beside the declaration.

- value: 1-10, what the check's verdict is worth on a node about to run training jobs
  (judgement, written down so it can be argued with): 10 = finds a fault that kills or corrupts
  every job (a GPU off the bus, uncorrectable ECC, no Fabric Manager); 7-9 = a fault that makes
  jobs fail or crawl; 4-6 = slow or misconfigured but working; 1-3 = information.
- cost: seconds; cpu = a host without GPUs, gpu + per_gpu x GPUs = a GPU host.
- source "measured cpu": `python -m checks --level burn-in --duration 10s` on a 2-core shared
  development VM (torch 2.13 CPU build, real backend), the check's duration_s from the report,
  rounded up. The quick checks (NVML, sysfs and the kernel log) measured 0.00-0.12 s each and
  are counted as 1 s; the checks estimated "like the quick checks" (NVML, sysfs, systemd,
  statvfs, /proc reads: Blackwell platform, fabric and peer checks) are counted the same.
  GPU costs are estimates from the sizes in checks/profiles/generic.yaml (8192^3 matmuls,
  2 GiB copies, 256 MiB P2P copies, collective sweeps to 256 MiB, child processes that import
  torch and create a CUDA context: ~10 s each, torchrun launches: ~20-30 s,
  shared/notes/torch-cpu.md) unless the note says measured. Source "estimated": no measurement.
- smaller_cost, smaller_profile: an optional cheaper size, as profile settings overridden for
  this run (fewer dtypes, smaller buffers).
- min_duration_s: scalable (the burn-in): it runs at least this long, then whatever the budget
  has left (up to --duration).
- min_gpus: on a GPU host with fewer GPUs the check SKIPs at once ("a single GPU has nobody to
  talk to" / "has no peer") and is counted as 1 s (SKIP_COST_S), not as a launch.
- shared: a launch several checks share (registry.shared_launch: the acceptance jobs' one
  launch, declared with its measurement in checks/node/suite/acceptance.py), paid by the first
  of them that is chosen.

Planning: the quick-level checks first (all of them must fit, else the budget is a usage error),
then the others in order of value (then cheaper first); each is taken at full size if it fits
what is left, else at its smaller size if that fits, else left out with the reason. The burn-in,
when taken, gets its minimum duration first and then whatever is left, up to --duration.
The plan goes into the report (`budget`), so a verdict says what it did not look at.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from checks.node import registry
from checks.node.registry import SKIP_COST_S, Budget, Cost

__all__ = ["SHARED", "SKIP_COST_S", "Budget", "BudgetError", "Choice", "Cost", "Plan",
           "apply_overrides", "make", "table"]


class BudgetError(Exception):
    """A budget the checks cannot be planned in, or a check without a budget (one line)."""


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
                "profile_overrides": self.profile_overrides, "burn_in_duration_s": self.duration_s}

    def summary(self) -> str:
        left = ", ".join(x["id"] for x in self.left_out) or "nothing"
        return (f"budget {self.budget_s:g} s: {len(self.chosen)} checks planned "
                f"(~{self.estimated_s:.0f} s); left out: {left}")


SHARED = "shared:"  # table keys of shared launches: "shared:acceptance"


def table() -> dict[str, Budget]:
    """check id -> the Budget its @check declares, and "shared:<name>" -> each shared launch
    (registry.shared_launch). Read from the registry each time: a test's own checks count."""
    checks = registry.load_all()
    out = {SHARED + name: launch for name, launch in registry.LAUNCHES.items()}
    out.update({c.id: c.budget for c in checks.values() if c.budget is not None})
    return out


def _merge(into: dict[str, Any], over: Mapping[str, Any]) -> None:
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def make(check_ids: Iterable[str], budget_s: float, *, gpus: int, duration_s: float,
         entries: Mapping[str, Budget] | None = None, required: Iterable[str] = ()) -> Plan:
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
        raise BudgetError(f"no budget for {', '.join(missing)} (declare budget=Budget(...) in its @check)")
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
