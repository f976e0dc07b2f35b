"""What a check declares with @check(...) holds for what it does: the tests, the fleet, --budget
and the generated docs derive their lists from these declarations (scope, nvml, needs,
gated_by, budget), so they must be true.

A failure names the check and says what to add where."""

from __future__ import annotations

import functools
import sys
import threading
from typing import Any

import pytest

from checks.hw import fixture
from checks.hw.fixture import FixtureBackend
from checks.hw.scenario_file import load_scenario, shipped
from checks.model import Status
from checks.node import budget, node_cli, registry, runner
from checks.node.context import Context, Options

CHECKS = registry.load_all()
HEALTHY_8 = "h100-sxm-8x-healthy"
LOST_GPU = "node-gpu-lost"


def _where(chk: registry.Check) -> str:
    return f"{chk.func.__module__.replace('.', '/')}.py @check({chk.id!r})"


def _run(scenario: str, level: str) -> dict[str, Any]:
    """{check id: CheckOutcome} of an in-process run (no worker process, so reads are seen)."""
    hw = FixtureBackend(load_scenario(scenario))
    ctx = Context(hw, node_cli.choose_profile(hw, None), Options(level=level, duration_s=10))
    return {o.id: o for o in runner.run(registry.select(level), ctx)}


@functools.cache
def _reads() -> dict[str, set[str]]:
    """GPU fields each check read while every shipped scenario ran at the burn-in level. Reads
    the Context makes for itself (names, addresses, cached once) are not a check's."""
    seen: dict[str, set[str]] = {}
    original = fixture.FixtureGpu.query

    def query(self: fixture.FixtureGpu, field_name: str) -> Any:
        thread = threading.current_thread().name  # runner runs each check on "check-<id>"
        if thread.startswith("check-") and \
                not sys._getframe(1).f_code.co_filename.endswith("checks/node/context.py"):
            seen.setdefault(thread.removeprefix("check-"), set()).add(field_name)
        return original(self, field_name)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fixture.FixtureGpu, "query", query)
        for name in shipped():
            _run(name, "burn-in")
    return seen


def test_every_gpu_field_a_check_reads_is_declared() -> None:
    undeclared = []
    for cid, fields in sorted(_reads().items()):
        if fields - set(CHECKS[cid].nvml):
            names = ", ".join(map(repr, sorted(fields - set(CHECKS[cid].nvml))))
            undeclared.append(f"{_where(CHECKS[cid])}: add {names} to its nvml=(...)")
    assert not undeclared, "checks read GPU fields they do not declare:\n  " + "\n  ".join(undeclared)


def test_every_declared_gpu_field_is_read_by_some_shipped_scenario() -> None:
    unread = [f"{_where(c)}: {', '.join(sorted(set(c.nvml) - _reads().get(c.id, set())))}"
              for c in CHECKS.values() if set(c.nvml) - _reads().get(c.id, set())]
    assert not unread, ("declared in nvml=(...) but read in no shipped scenario (remove it, or add "
                        "a scenario under checks/scenarios/ that makes the check read it):\n  "
                        + "\n  ".join(unread))


def _gpus_named(outcome: Any) -> list[str]:
    return [r.device.pci for r in outcome.results if r.device is not None]


def test_a_gpu_scoped_check_gives_every_gpu_one_result() -> None:
    """scope="gpu": one result per GPU on a healthy 8-GPU node; scope host/gpus: not that."""
    outcomes = _run(HEALTHY_8, "standard")
    wrong = []
    for check_id, outcome in outcomes.items():
        if outcome.status is Status.SKIP and not _gpus_named(outcome):
            continue
        named = _gpus_named(outcome)
        per_gpu = len(named) == len(set(named)) == 8
        if per_gpu != (CHECKS[check_id].scope == "gpu"):
            wrong.append(f"{_where(CHECKS[check_id])}: scope={CHECKS[check_id].scope!r} but "
                         f"{len(named)} results name {len(set(named))} of the 8 GPUs")
    assert not wrong, "\n".join(wrong)


def test_a_lost_gpu_is_not_measured_by_exactly_the_checks_that_read_each_gpu() -> None:
    """scope gpu/gpus: the lost GPU is ERROR '(see gpu-count)' (the fleet folds these under
    gpu-count); checks the gpu-occupied gate holds back SKIP instead (it could not measure the
    lost GPU either)."""
    outcomes = _run(LOST_GPU, "burn-in")
    lost = next(g.device.pci for g in _context(LOST_GPU).gpus if g.lost)
    deferring = {cid for cid, o in outcomes.items()
                 if any(r.status is Status.ERROR and r.device is not None and r.device.pci == lost
                        and "(see gpu-count)" in r.message for r in o.results)}
    held = set(registry.depends_on("gpu-occupied"))
    declared = {c.id for c in registry.select("burn-in") if c.scope != "host" and c.id not in held}
    assert deferring == declared, {"not declared scope gpu/gpus": sorted(deferring - declared),
                                   "declared but measured the lost GPU": sorted(declared - deferring)}


def _context(scenario: str) -> Context:
    hw = FixtureBackend(load_scenario(scenario))
    return Context(hw, node_cli.choose_profile(hw, None), Options())


def test_every_check_declares_its_budget() -> None:
    """check() refuses a check without one (naming its line); this holds for the whole suite,
    and --budget plans from exactly these declarations (checks/node/budget.py)."""
    missing = [_where(c) for c in registry.ordered(CHECKS.values()) if c.budget is None]
    assert not missing, ("checks without budget=Budget(value=1-10, cost=Cost(cpu=..., gpu=...), "
                         "source=...) in their @check:\n  " + "\n  ".join(missing))
    table = {k for k in budget.table() if not k.startswith(budget.SHARED)}
    assert table == set(CHECKS)


def test_depends_on_follows_needs_and_gates() -> None:
    found = registry.depends_on("pci-gpus")
    assert {"driver-loaded", "gpu-profile", "persistence-mode"} <= set(found)  # mig-mode: via driver-loaded
    assert found.index("driver-loaded") < found.index("persistence-mode")  # run order
    held = registry.depends_on("gpu-occupied")
    assert {"gpu-matmul", "train-ddp", "burn-in"} <= set(held) and "gpu-count" not in held


def test_a_bad_declaration_is_refused_at_registration() -> None:
    with pytest.raises(ValueError, match="unknown scope"):
        registry.check("zz-test", code="ZZ001", title="t", scope="node")
    with pytest.raises(ValueError, match=r"not in checks\.hw\.base\.GPU_FIELDS"):
        registry.check("zz-test", code="ZZ001", title="t", nvml=("persistance_mode",))
