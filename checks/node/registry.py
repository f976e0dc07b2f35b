"""Check declarations. Every module under checks/node/suite/ registers its checks on import."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

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
          scope: str = "host", nvml: Iterable[str] = ()
          ) -> Callable[[CheckFn], CheckFn]:
    """Register a check. `id` is stable and hyphenated; `code` is the stable fault code (its
    troubleshooting entry goes into checks/report/faults.yaml, its value and cost into
    checks/node/budget.yaml: tests name either when it is missing). `scope` says what one
    result is about (SCOPES), `nvml` which GPU fields it reads."""
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
        if id in REGISTRY:
            raise ValueError(f"check id {id} registered twice")
        if any(c.code == code for c in REGISTRY.values()):
            raise ValueError(f"fault code {code} registered twice")
        REGISTRY[id] = Check(id=id, code=code, title=title, func=func, level=level, stage=stage,
                             tags=(stage, *tags), needs=tuple(needs), timeout_s=timeout_s,
                             seq=len(REGISTRY), prepare=prepare, gated_by=tuple(gated_by),
                             gate=gate, scope=scope, nvml=fields)
        return func

    return register


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
