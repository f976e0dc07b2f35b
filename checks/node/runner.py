"""Runs checks in order: dependencies, per-check timeouts, crash isolation."""

from __future__ import annotations

import contextlib
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from checks.hw.base import HardwareError, NotSupported, NvmlUnavailable
from checks.model import CheckOutcome, Result, Status, error, finite_or_error, skip
from checks.node.context import Context
from checks.node.registry import REGISTRY, Check

Listener = Callable[[Check, CheckOutcome | None], None]


def _blocked(chk: Check, ctx: Context) -> Result | None:
    for need in chk.needs:
        outcome = ctx.outcomes.get(need)
        if outcome is None:
            continue  # not selected this run: the check must cope on its own
        if outcome.status in (Status.FAIL, Status.ERROR):
            return skip(f"blocked by {need}")
        if outcome.status is Status.SKIP:
            # Pass the root cause down unchanged ("no NVIDIA device on the PCI bus").
            return skip(outcome.results[0].message if outcome.results else f"skipped: {need}")
    for name in chk.gated_by:
        reason = _gated(name, ctx)
        if reason:
            return skip(reason)
    return None


# Outcomes of gate checks run only to answer a gate (not selected): never in the report.
_unrecorded: weakref.WeakKeyDictionary[Context, dict[str, CheckOutcome]] = \
    weakref.WeakKeyDictionary()


def _gated(name: str, ctx: Context) -> str | None:
    """Why the gate check `name` keeps its dependents from running, or None. Its outcome in this
    run, or, when it was not selected, its results computed here once and kept out of the
    report. A gate that cannot answer (its own check blocked or broken) blocks nothing: the
    gate check reports that itself when it runs."""
    gate_check = REGISTRY.get(name)
    if gate_check is None or gate_check.gate is None:
        return None
    done = ctx.outcomes.get(name)
    if done is None:
        cache = _unrecorded.setdefault(ctx, {})
        if name not in cache:
            blocked = _blocked(gate_check, ctx)
            cache[name] = outcome(gate_check, [blocked] if blocked else _results(gate_check, ctx),
                                  0.0)
        done = cache[name]
    try:
        return gate_check.gate(ctx, done)
    except Exception:  # a bug in the gate must not stop the measurements
        return None


def _normalise(chk: Check, produced: Any) -> list[Result]:
    if produced is None:
        return [error("check returned no result (bug in the check)")]
    results = [produced] if isinstance(produced, Result) else list(produced)
    if not results:
        return [error("check returned no result (bug in the check)")]
    for r in results:
        if not isinstance(r, Result):
            return [error(f"check returned {type(r).__name__}, not a Result (bug in the check)")]
    return [finite_or_error(r) for r in results]


def _results(chk: Check, ctx: Context) -> list[Result]:
    try:
        return _normalise(chk, chk.func(ctx))
    except NotSupported as exc:
        return [skip(f"not supported on this device/driver: {exc}")]
    except NvmlUnavailable as exc:
        return [error(f"NVML unavailable: {exc}")]
    except HardwareError as exc:
        return [error(f"could not measure: {exc}")]
    except Exception as exc:
        last = traceback.extract_tb(exc.__traceback__)[-1]
        where = f"{last.filename.rsplit('/', 1)[-1]}:{last.lineno}"
        return [error(f"check crashed: {type(exc).__name__}: {exc} ({where})")]


def _call(chk: Check, ctx: Context) -> list[Result]:
    box: dict[str, Any] = {}

    def target() -> None:
        box["results"] = _results(chk, ctx)

    # A daemon thread: a check stuck in a call that releases the GIL (NVML, CUDA, a sleep) is
    # abandoned at its timeout and cannot keep the process alive. A check holding the GIL (a
    # regex on a huge line) cannot be abandoned this way: `python -m checks` runs the checks in
    # a worker process that checks/node/watchdog.py kills instead.
    thread = threading.Thread(target=target, name=f"check-{chk.id}", daemon=True)
    thread.start()
    thread.join(chk.timeout_s)
    if thread.is_alive():
        return [timed_out(chk, "abandoned")]
    return box["results"]


def timed_out(chk: Check, what: str) -> Result:
    return error(f"timed out: did not finish within {chk.timeout_s:g} s (hung); {what}",
                 remedy="look for a hung driver call (nvidia-smi hanging too?) and check the "
                        "kernel log")


def outcome(chk: Check, results: list[Result], duration_s: float) -> CheckOutcome:
    """The outcome of `chk`, with the check's fault code on every problem it did not code."""
    for r in results:
        if r.status in (Status.FAIL, Status.WARN) and r.fault_code is None:
            r.fault_code = chk.code
        elif r.status is Status.ERROR and r.fault_code is None:
            r.fault_code = f"{chk.code}-E"  # "could not collect" has its own code
    return CheckOutcome(id=chk.id, code=chk.code, title=chk.title, level=chk.level,
                        tags=chk.tags, results=results, duration_s=duration_s)


def run_one(chk: Check, ctx: Context, *, in_thread: bool = True) -> CheckOutcome:
    """Run one check (or report it blocked) and record its outcome in `ctx`. `in_thread`: under
    the check's timeout in a thread; otherwise in this thread, for a caller that enforces the
    timeout from outside (the watchdog's worker process)."""
    start = time.monotonic()
    blocked = _blocked(chk, ctx)
    run_it = _call if in_thread else _results
    results = [blocked] if blocked else run_it(chk, ctx)
    done = outcome(chk, results, time.monotonic() - start)
    ctx.outcomes[chk.id] = done
    return done


def prepare(checks: list[Check], ctx: Context) -> Callable[[], None]:
    """Run the checks' prepare hooks (each function once); returns what closes what they
    started and no check used. A hook that raises is ignored: its check does the work then."""
    closers: list[Callable[[], None]] = []
    seen: set[Any] = set()
    for chk in checks:
        if chk.prepare is None or chk.prepare in seen:
            continue
        seen.add(chk.prepare)
        try:
            closer = chk.prepare(ctx)
        except Exception:  # an optimisation only; the check reports the problem
            continue
        if closer is not None:
            closers.append(closer)

    def close() -> None:
        for closer in closers:
            with contextlib.suppress(Exception):
                closer()

    return close


def run(checks: Iterable[Check], ctx: Context, listener: Listener | None = None
        ) -> list[CheckOutcome]:
    checks = list(checks)
    outcomes = []
    close = prepare(checks, ctx)
    try:
        for chk in checks:
            if listener:
                listener(chk, None)
            done = run_one(chk, ctx)
            outcomes.append(done)
            if listener:
                listener(chk, done)
    finally:
        close()
    return outcomes


def exit_code(outcomes: list[CheckOutcome]) -> int:
    return 1 if any(o.status.is_problem for o in outcomes) else 0
