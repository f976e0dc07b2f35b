"""Check declarations. Every module under checks/node/suite/ registers its checks on import."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from checks.hw.base import GPU_FIELDS
from checks.model import CheckOutcome, Result

if TYPE_CHECKING:
    from checks.node.context import Context

LEVELS = ("quick", "standard", "burn-in")
# What one check judges (`scope`), so that tests and the fleet derive their lists from it:
#   host  one verdict for the host (it may name a GPU or device at fault);
#   gpu   one result for every GPU NVML lists (checks.node.perdevice.each_gpu): a GPU NVML has
#         lost is ERROR "not measured ... (see gpu-count)", the fleet folds it under gpu-count;
#   gpus  one verdict over all the GPUs, naming only those at fault; a lost GPU is ERROR
#         "(see gpu-count)" as for `gpu` (torch-arch: one arch list, every GPU's capability).
SCOPES = ("host", "gpu", "gpus")
# Stages order the run: cheap inventory first, acceptance jobs last.
STAGES = ("host", "inventory", "health", "workload", "acceptance", "burn-in")

CheckFn = Callable[["Context"], Result | Iterable[Result]]
# Runs before the first check of a run, for each selected check that has one (the same function
# once): starts slow preparation (a launcher importing torch) that overlaps the checks before
# it; returns what closes the preparation if its check never uses it, or None. An exception is
# ignored: the check itself then does the work and reports what went wrong.
PrepareFn = Callable[["Context"], Callable[[], None] | None]
# A check other checks may be gated on: given its outcome, why they must not run (None: they
# may). The runner asks it for every check that names it in `gated_by` (runner._gated).
GateFn = Callable[["Context", CheckOutcome], str | None]
# Where a budget's figures come from (checks/node/budget.py says how each is measured).
SOURCES = ("measured cpu", "estimated")
SKIP_COST_S = 1.0  # a check that SKIPs at once, as the quick checks are counted


@dataclass(frozen=True)
class Cost:
    """Seconds a check takes: `cpu` on a host without GPUs, `gpu` + `per_gpu` x GPUs on a GPU
    host."""
    cpu: float
    gpu: float
    per_gpu: float = 0.0

    def __post_init__(self) -> None:  # seconds as floats, as the report records them
        for name in ("cpu", "gpu", "per_gpu"):
            object.__setattr__(self, name, float(getattr(self, name)))

    def on(self, gpus: int) -> float:
        return self.cpu if gpus == 0 else self.gpu + self.per_gpu * gpus


@dataclass(frozen=True)
class Budget:
    """What a check is worth and costs, for `--budget` (checks/node/budget.py: how `value` is
    judged and how `cost` is measured)."""
    value: float  # 1-10
    cost: Cost
    source: str  # SOURCES
    # An optional cheaper size: its cost, and the profile settings overridden for this run.
    smaller_cost: Cost | None = None
    smaller_profile: Mapping[str, Any] = field(default_factory=dict, hash=False, compare=False)
    min_duration_s: float | None = None  # scalable (burn-in): the least worth running
    shared: str | None = None  # a launch shared with other checks (shared_launch)
    min_gpus: int = 0  # below this many GPUs (but not on a CPU host) the check SKIPs at once

    def __post_init__(self) -> None:  # value 7 is recorded as 7.0, as any other figure
        object.__setattr__(self, "value", float(self.value))
        if self.min_duration_s is not None:
            object.__setattr__(self, "min_duration_s", float(self.min_duration_s))

    def on(self, gpus: int) -> float:
        """Seconds on a host with `gpus` GPUs: a check that needs more GPUs than the host has
        SKIPs at once (a single GPU has no peer for P2P or a collective)."""
        if 0 < gpus < self.min_gpus:
            return SKIP_COST_S
        return self.cost.on(gpus)


# Launches several checks share (the acceptance jobs' one launch): name -> its cost, paid by
# the first of them a budget plan chooses. Declared with shared_launch() before those checks.
LAUNCHES: dict[str, Budget] = {}


def shared_launch(name: str, *, cost: Cost, source: str) -> str:
    """Declare a launch checks share (their Budget(shared=NAME)); returns the name."""
    if source not in SOURCES:
        raise ValueError(f"shared launch {name}: source {source!r} is not one of {SOURCES}")
    if name in LAUNCHES:
        raise ValueError(f"shared launch {name} declared twice")
    LAUNCHES[name] = Budget(0.0, cost, source)
    return name


@dataclass(frozen=True)
class Check:
    id: str
    code: str
    title: str
    func: CheckFn
    level: str = "quick"
    stage: str = "health"
    tags: tuple[str, ...] = ()
    needs: tuple[str, ...] = ()
    timeout_s: float = 60.0
    seq: int = 0  # registration order, the last tie-breaker of `ordered`
    prepare: PrepareFn | None = None
    # Checks whose gate may SKIP this one with its reason (a busy GPU: gpu-occupied). Unlike
    # `needs`, a gate is asked even when its check was not selected for the run.
    gated_by: tuple[str, ...] = ()
    gate: GateFn | None = None
    scope: str = "host"
    # The checks.hw.base.GPU_FIELDS it reads through GpuHandle.query, as declared (held to the
    # code by tests/framework/test_registry_declarations.py).
    nvml: tuple[str, ...] = ()
    budget: Budget | None = None  # required by check(); None only for checks tests build by hand

    @property
    def doc(self) -> str:
        return (self.func.__doc__ or self.title).strip()

    def runs_at(self, level: str) -> bool:
        return LEVELS.index(self.level) <= LEVELS.index(level)


REGISTRY: dict[str, Check] = {}


def check(id: str, *, code: str, title: str, level: str = "quick", stage: str = "health",
          tags: Iterable[str] = (), needs: Iterable[str] = (),
          timeout_s: float = 60.0, prepare: PrepareFn | None = None,
          gated_by: Iterable[str] = (), gate: GateFn | None = None,
          scope: str = "host", nvml: Iterable[str] = (), budget: Budget | None = None
          ) -> Callable[[CheckFn], CheckFn]:
    """Register a check. `id` is stable and hyphenated; `code` is the stable fault code (its
    troubleshooting entry goes into checks/report/faults.yaml: a test names it when missing).
    `scope` says what one result is about (SCOPES), `nvml` which GPU fields it reads, `budget`
    its value and cost for --budget (required: a check without one is refused here)."""
    if level not in LEVELS:
        raise ValueError(f"{id}: unknown level {level}")
    if stage not in STAGES:
        raise ValueError(f"{id}: unknown stage {stage}")
    if scope not in SCOPES:
        raise ValueError(f"{id}: unknown scope {scope} (one of {', '.join(SCOPES)})")
    fields = tuple(nvml)
    unknown = [f for f in fields if f not in GPU_FIELDS]
    if unknown:
        raise ValueError(f"{id}: nvml names {', '.join(unknown)}, not in checks.hw.base.GPU_FIELDS")

    def register(func: CheckFn) -> CheckFn:
        _check_budget(id, budget, func)
        if id in REGISTRY:
            raise ValueError(f"check id {id} registered twice")
        if any(c.code == code for c in REGISTRY.values()):
            raise ValueError(f"fault code {code} registered twice")
        REGISTRY[id] = Check(id=id, code=code, title=title, func=func, level=level, stage=stage,
                             tags=(stage, *tags), needs=tuple(needs), timeout_s=timeout_s,
                             seq=len(REGISTRY), prepare=prepare, gated_by=tuple(gated_by),
                             gate=gate, scope=scope, nvml=fields, budget=budget)
        return func

    return register


def _where(func: Callable[..., Any]) -> str:
    """`checks/node/suite/gpu_state.py:55`: the decorator's line (the first line of a decorated
    function's code), relative to the checkout when it is in one."""
    path = Path(func.__code__.co_filename)
    root = Path(__file__).resolve().parents[2]
    shown = path.relative_to(root) if path.is_relative_to(root) else path
    return f"{shown}:{func.__code__.co_firstlineno}"


def _check_budget(id: str, budget: Budget | None, func: Callable[..., Any]) -> None:
    if budget is None:
        raise ValueError(
            f"{_where(func)}: @check({id!r}) has no budget; add "
            'budget=Budget(value=1-10, cost=Cost(cpu=1, gpu=1), source="estimated") to it '
            "(checks/node/budget.py says how to judge the value and measure the cost)")
    if not 1 <= budget.value <= 10:
        raise ValueError(f"{_where(func)}: @check({id!r}) budget value {budget.value:g} is not 1-10")
    costs = [budget.cost] + ([budget.smaller_cost] if budget.smaller_cost else [])
    if any(c.cpu <= 0 or c.gpu <= 0 or c.per_gpu < 0 for c in costs):
        raise ValueError(f"{_where(func)}: @check({id!r}) budget cost needs cpu and gpu seconds > 0")
    if budget.source not in SOURCES:
        raise ValueError(f"{_where(func)}: @check({id!r}) budget source {budget.source!r} is not "
                         f"one of {', '.join(SOURCES)}")
    if budget.shared is not None and budget.shared not in LAUNCHES:
        raise ValueError(f"{_where(func)}: @check({id!r}) budget shares the launch "
                         f"{budget.shared!r}, which no shared_launch() declares")


def depends_on(check_id: str) -> list[str]:
    """The checks that name `check_id` in `needs` or `gated_by`, directly or through another,
    in registry order."""
    load_all()
    found: list[str] = []
    todo = [check_id]
    while todo:
        cause = todo.pop(0)
        for c in REGISTRY.values():
            if c.id not in found and c.id != check_id and cause in (*c.needs, *c.gated_by):
                found.append(c.id)
                todo.append(c.id)
    return [c.id for c in ordered(REGISTRY.values()) if c.id in found]


def load_all() -> dict[str, Check]:
    from checks.node import suite

    for info in sorted(pkgutil.iter_modules(suite.__path__), key=lambda m: m.name):
        importlib.import_module(f"{suite.__name__}.{info.name}")
    return REGISTRY


def ordered(checks: Iterable[Check]) -> list[Check]:
    """Stage order, then registration order; a check always comes after what it needs."""
    # Independent of import order (tests import single suite modules first): stage, then
    # module, then position in the module, then registration order. So within a stage the
    # suite modules' names order the report: a new module lands where its name sorts.
    pool = sorted(checks, key=lambda c: (STAGES.index(c.stage), c.func.__module__,
                                         c.func.__code__.co_firstlineno, c.seq))
    placed: list[Check] = []
    ids = {c.id for c in pool}
    done: set[str] = set()
    while pool:
        for c in pool:
            if all(n in done or n not in ids for n in (*c.needs, *c.gated_by)):
                placed.append(c)
                done.add(c.id)
                pool.remove(c)
                break
        else:
            raise ValueError(f"dependency cycle among {[c.id for c in pool]}")
    return placed


def select(level: str, only: Iterable[str] = (), skip: Iterable[str] = ()) -> list[Check]:
    """Checks for a level, narrowed by --only/--skip (ids or tags). Unknown names raise KeyError."""
    load_all()
    only, skip = list(only), list(skip)
    known = set(REGISTRY) | {t for c in REGISTRY.values() for t in c.tags} | set(LEVELS)
    unknown = [n for n in [*only, *skip] if n not in known]
    if unknown:
        raise KeyError(", ".join(unknown))

    def matches(c: Check, names: list[str]) -> bool:
        return any(n == c.id or n in c.tags for n in names)

    chosen = [c for c in REGISTRY.values()
              if (matches(c, only) if only else c.runs_at(level)) and not matches(c, skip)]
    return ordered(chosen)
