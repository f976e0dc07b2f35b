"""The runner isolates checks: crashes, hangs, empty results and blocked dependencies."""

from __future__ import annotations

import time

import pytest

from checks.hw.fixture import FixtureBackend, load_scenario
from checks.model import Result, Status, fail, passed
from checks.node import registry, runner
from checks.node.context import Context, Options
from checks.profiles import load


@pytest.fixture
def ctx() -> Context:
    return Context(FixtureBackend(load_scenario("cpu-only-healthy")), load("generic"), Options())


def make(id: str, func, **kw) -> registry.Check:  # type: ignore[no-untyped-def]
    return registry.Check(id=id, code="TST001", title=id, func=func, **kw)


def test_crashing_check_is_error_and_suite_goes_on(ctx: Context) -> None:
    def boom(_: Context) -> Result:
        raise ZeroDivisionError("division by zero")

    outcomes = runner.run([make("boom", boom), make("fine", lambda _: passed("ok"))], ctx)
    assert [o.status for o in outcomes] == [Status.ERROR, Status.PASS]
    assert "check crashed: ZeroDivisionError" in outcomes[0].results[0].message
    assert outcomes[0].results[0].fault_code == "TST001-E"


def test_hanging_check_times_out_as_error(ctx: Context) -> None:
    def hang(_: Context) -> Result:
        time.sleep(30)
        return passed("never")

    start = time.monotonic()
    (outcome,) = runner.run([make("hang", hang, timeout_s=0.3)], ctx)
    assert time.monotonic() - start < 5
    assert outcome.status is Status.ERROR
    assert "did not finish within 0.3 s" in outcome.results[0].message


@pytest.mark.parametrize("produced", [None, [], ["not a result"]])
def test_check_returning_nothing_is_error_never_pass(ctx: Context, produced) -> None:  # type: ignore[no-untyped-def]
    (outcome,) = runner.run([make("empty", lambda _: produced)], ctx)
    assert outcome.status is Status.ERROR


def test_failed_dependency_blocks_dependents(ctx: Context) -> None:
    base = make("base", lambda _: fail("broken"))
    dependent = make("dependent", lambda _: passed("ran"), needs=("base",))
    outcomes = runner.run(registry.ordered([dependent, base]), ctx)
    assert [o.id for o in outcomes] == ["base", "dependent"]
    assert outcomes[1].status is Status.SKIP
    assert outcomes[1].results[0].message == "blocked by base"


def test_worst_status_wins() -> None:
    from checks.model import worst

    assert worst([Status.PASS, Status.WARN, Status.SKIP]) is Status.WARN
    assert worst([Status.ERROR, Status.FAIL]) is Status.FAIL
    assert worst([]) is Status.SKIP


def test_registered_ids_and_codes_are_unique_and_well_formed() -> None:
    checks = registry.load_all()
    assert len({c.code for c in checks.values()}) == len(checks)
    for chk in checks.values():
        assert chk.id == chk.id.lower() and " " not in chk.id
        assert chk.doc, f"{chk.id} has no doc"


def test_prepare_hooks_run_once_before_the_first_check_and_are_closed_after(ctx: Context,
                                                                            ) -> None:
    events: list[str] = []

    def hook(_: Context):  # type: ignore[no-untyped-def]
        events.append("prepare")
        return lambda: events.append("close")

    def broken_hook(_: Context):  # type: ignore[no-untyped-def]
        events.append("broken")
        raise OSError("cannot start")

    def body(_: Context) -> Result:
        events.append("check")
        return passed("ok")

    checks = [make("a", body, prepare=hook), make("b", body, prepare=hook),
              make("c", body, prepare=broken_hook)]
    outcomes = runner.run(checks, ctx)
    # one call per hook function; a hook that raises changes nothing about its check
    assert events == ["prepare", "broken", "check", "check", "check", "close"]
    assert [o.status for o in outcomes] == [Status.PASS] * 3


def test_what_a_hook_prepared_is_closed_when_a_check_raises_out_of_the_run(ctx: Context) -> None:
    closed: list[bool] = []

    def interrupted(*_: object) -> None:
        raise KeyboardInterrupt  # SIGINT arrives as an exception between checks

    with pytest.raises(KeyboardInterrupt):
        runner.run([make("x", lambda _: passed("ok"),
                         prepare=lambda _: lambda: closed.append(True))], ctx, interrupted)
    assert closed == [True]
