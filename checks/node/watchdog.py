"""Run the checks in a worker process that the CLI can kill, so every check's timeout holds.

A timeout that joins a thread cannot stop a check that holds the GIL (a regex backtracking over
a huge kernel-log line, any long C call that does not release it): the thread that should give
up never runs again. `python -m checks` therefore forks one worker process that runs the checks
one after the other and sends each outcome back through a pipe; this process only waits, with
each running check's deadline. When a check passes its `timeout_s`, the worker's process group
and every process below it (torchrun, ranks, measurement children) are killed, the check is
reported ERROR "timed out", and a new worker runs the checks that are left. A worker that dies
by itself (a crash in a C extension, the OOM killer) makes the check it was running an ERROR the
same way. The worker dies with this process (PR_SET_PDEATHSIG), and this process kills it on
every way out (SIGINT/SIGTERM arrive here as procs.Terminated).

With NODECERT_PROGRESS=FILE in its environment (the Slurm wrapper sets it), the worker writes
the id of each check into FILE, replaced atomically, just before it starts that check: a wrapper
whose run hangs (even with this process stopped, or the check stuck in the kernel) can then say
which check it hung in. Best effort: a file that cannot be written changes nothing else.

Forked, not spawned: the worker starts with this process's imports, registry, profile and
hardware backend at no cost (a quick run forks once). This process touches neither torch nor
CUDA before forking, so the worker may.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import signal
import struct
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from checks.model import CheckOutcome, error, skip
from checks.node import runner
from checks.node.context import Context
from checks.node.registry import Check
from checks.supervise import procs

HEADER = struct.Struct("!I")
UNWIND_S = 5.0  # a stopped worker's time to unwind after SIGTERM, before SIGKILL
_EOF = object()
_LATE = object()


def _send(fd: int, message: tuple[Any, ...]) -> None:
    data = pickle.dumps(message)
    view = memoryview(HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def _note_progress(check_id: str) -> None:
    """NODECERT_PROGRESS's file holds the id of the check about to run (see the docstring)."""
    path = os.environ.get(procs.ENV_PROGRESS)
    if not path:
        return
    tmp = f"{path}.{os.getpid()}.tmp"
    with contextlib.suppress(OSError):
        with open(tmp, "w") as f:
            f.write(check_id + "\n")
        os.replace(tmp, path)
    with contextlib.suppress(OSError):
        os.unlink(tmp)  # left only when the replace failed


def _serve(checks: list[Check], ctx: Context, fd: int) -> None:
    """Worker side: run each check in this (main) thread, announce it, send its outcome. The
    checks' prepare hooks run first (what they start dies with this worker, or is closed)."""
    close = runner.prepare(checks, ctx)
    try:
        for chk in checks:
            _note_progress(chk.id)
            _send(fd, ("start", chk.id))
            done = runner.run_one(chk, ctx, in_thread=False)
            try:
                _send(fd, ("done", done))
            except (pickle.PicklingError, TypeError, AttributeError) as exc:
                _send(fd, ("done", runner.outcome(chk, [error(
                    f"result could not be passed back from the worker: {exc} (bug in the check)")],
                    done.duration_s)))
    finally:
        close()


class _Reader:
    """Length-prefixed pickles from the worker, with a deadline per read."""

    def __init__(self, fd: int) -> None:
        self.fd, self.buf = fd, b""

    def _frame(self) -> Any:
        if len(self.buf) < HEADER.size:
            return None
        (size,) = HEADER.unpack_from(self.buf)
        if len(self.buf) < HEADER.size + size:
            return None
        data, self.buf = self.buf[HEADER.size:HEADER.size + size], self.buf[HEADER.size + size:]
        return pickle.loads(data)

    def next(self, deadline: float | None) -> Any:
        while True:
            frame = self._frame()
            if frame is not None:
                return frame
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self.fd], [], [], wait)
            if not ready:
                return _LATE
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                return _EOF
            self.buf += chunk


def _fork_safe_torch() -> None:
    """One intra-op thread in a worker forked from a process that already had torch loaded.
    torch's OpenMP runtime (libgomp) is not fork-safe: a parent that ran its thread pool leaves
    the fork hanging in its first parallel region for good (measured: a 1024x1024 matmul after
    fork never returns; with one thread it takes 0.1 s). `python -m checks` forks before torch
    is loaded, so this only touches programs that embed the suite (a test run, a notebook); torch's
    own fork-started DataLoader workers do the same."""
    torch = sys.modules.get("torch")  # never imported here: only what the parent already loaded
    if torch is not None and hasattr(torch, "set_num_threads"):
        torch.set_num_threads(1)


def _fork_worker(checks: list[Check], ctx: Context) -> tuple[int, int]:
    parent = os.getpid()
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the worker: never returns into the caller
        code = 0
        try:
            os.close(read_fd)
            os.setpgid(0, 0)  # its own group: one killpg reaches it and what it left there
            procs.set_pdeathsig(signal.SIGKILL)
            if os.getppid() != parent:
                os._exit(1)
            # Fresh stdio objects: a lock the parent's progress thread held at the fork would
            # otherwise stay held here for good.
            sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 - lives as long as the worker
            sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
            _fork_safe_torch()
            # Ctrl-C goes to the terminal's group, which this is not; SIGTERM from outside
            # unwinds the check (its launches kill their trees) like it does in the parent.
            _serve(checks, ctx, write_fd)
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(write_fd)
    return pid, read_fd


def _kill_worker(pid: int, grace_s: float = 5.0, *, term_s: float = 0.0) -> str:
    """Stop the worker: with `term_s`, SIGTERM first and that long to unwind (its launches kill
    their trees and remove their directories; a check holding the GIL cannot); then SIGKILL
    everything below it, their process groups, and it; reap it. Returns how it ended."""
    # Who is below the worker now: a child that dies while the worker unwinds leaves its own
    # children to init, out of reach of a later look at the tree.
    victims = set(procs.descendants(pid))
    pgids = procs.groups([pid, *victims])
    if term_s > 0:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + term_s
        while time.monotonic() < deadline and procs.alive(pid):
            time.sleep(0.05)
    victims |= set(procs.descendants(pid))
    pgids |= procs.groups([pid, *victims])
    procs.kill_groups(pgids)
    procs.kill_all([pid, *sorted(victims)], grace_s)
    deadline = time.monotonic() + grace_s
    while True:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return "exit status unknown"
        if done:
            if os.WIFSIGNALED(status):
                return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
            return f"exit status {os.WEXITSTATUS(status)}"
        if time.monotonic() > deadline:
            return "still running (stuck in the kernel)"
        time.sleep(0.05)


@dataclass(frozen=True)
class Deadline:
    """The whole run's end (`time.monotonic()` seconds) and how to name it in a result
    ("--budget 5m", "--deadline 240 s"): a check still running then is stopped like one past
    its own timeout, and the checks not started are reported as not run for it."""
    at: float
    name: str

    def stopped(self) -> str:
        return (f"stopped at the run's deadline ({self.name}): its worker process and every "
                f"process it started were ended")

    def not_run(self, chk: Check) -> CheckOutcome:
        return runner.outcome(chk, [skip(f"not run: the run's deadline ({self.name}) was "
                                         f"reached before it could start")], 0.0)


def run(checks: Iterable[Check], ctx: Context, listener: runner.Listener | None = None,
        deadline: Deadline | None = None) -> list[CheckOutcome]:
    """runner.run, with the checks in a worker process killed at a check's timeout, and at the
    run's `deadline` when one is given (see Deadline)."""
    selected = list(checks)
    outcomes: dict[str, CheckOutcome] = {}
    todo = selected
    while todo:
        if deadline is not None and time.monotonic() >= deadline.at:
            for chk in todo:
                outcomes[chk.id] = ctx.outcomes[chk.id] = deadline.not_run(chk)
                if listener:
                    listener(chk, outcomes[chk.id])
            break
        for done in _one_worker(todo, ctx, listener, deadline):
            outcomes[done.id] = done
        todo = [c for c in todo if c.id not in outcomes]
    return [outcomes[c.id] for c in selected]


def _next_deadline(current: Check | None, started: float, run_deadline: Deadline | None
                   ) -> tuple[float | None, bool]:
    """When to give up waiting: the running check's timeout or the run's deadline, whichever
    comes first (True when it is the run's)."""
    own = started + current.timeout_s if current else None
    if run_deadline is not None and (own is None or run_deadline.at < own):
        return run_deadline.at, True
    return own, False


def _one_worker(todo: list[Check], ctx: Context, listener: runner.Listener | None,
                run_deadline: Deadline | None = None) -> list[CheckOutcome]:
    """Run `todo` in one worker until it finishes, hangs, dies or the run's deadline passes; at
    least one outcome back, or none when the deadline passed between two checks."""
    by_id = {c.id: c for c in todo}
    pid, fd = _fork_worker(todo, ctx)
    reader = _Reader(fd)
    got: list[CheckOutcome] = []
    current: Check | None = None
    started = time.monotonic()
    reaped = False

    def record(done: CheckOutcome) -> None:
        got.append(done)
        ctx.outcomes[done.id] = done
        if listener:
            listener(by_id[done.id], done)

    try:
        while len(got) < len(todo):
            deadline, by_run = _next_deadline(current, started, run_deadline)
            message = reader.next(deadline)
            if message is _LATE and run_deadline is not None and by_run:
                how, reaped = _kill_worker(pid, term_s=UNWIND_S), True
                if current is not None:
                    record(runner.outcome(current, [error(
                        f"{run_deadline.stopped()} ({how})",
                        remedy="give the run more time (--budget/--deadline) to measure it")],
                        time.monotonic() - started))
                break
            if message is _LATE and current is not None:
                how, reaped = _kill_worker(pid, term_s=UNWIND_S), True
                record(runner.outcome(current, [runner.timed_out(
                    current, f"stopped: its worker process and every process it started were "
                             f"ended ({how})")], time.monotonic() - started))
                break
            if message is _EOF:
                how, reaped = _kill_worker(pid), True
                if current is None:  # died between checks: the next one is charged, so that
                    current = todo[len(got)]  # every worker makes progress
                    if listener:
                        listener(current, None)
                record(runner.outcome(current, [error(
                    f"the worker process running this check died ({how})",
                    remedy="a crash inside a driver or C library call, or the OOM killer: "
                           "look at the kernel log")], time.monotonic() - started))
                break
            kind, payload = message
            if kind == "start":
                current, started = by_id[payload], time.monotonic()
                if listener:
                    listener(current, None)
            else:
                record(payload)
                current = None
    except BaseException:
        # SIGINT/SIGTERM here (procs.Terminated) or a bug: the worker unwinds the same way (its
        # launches kill their trees, temporary directories go), then nothing of it stays.
        if not reaped:
            reaped = True
            _kill_worker(pid, term_s=UNWIND_S)
        raise
    finally:
        if not reaped:
            _kill_worker(pid)  # finished: whatever the last check left behind goes
        os.close(fd)
    return got
