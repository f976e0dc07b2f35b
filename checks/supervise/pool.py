"""A bounded process pool for work that is pure computation over files (the fleet controller
parsing and validating thousands of host reports): results come back in the order of the inputs,
so what is built from them is the same as with one process.

N processes share the work, the caller one of them: N - 1 are forked from the caller (the modules
it imported are there already), run nothing but the given function, and are gone when the pool
(or ordered_map's iterator) ends. The caller hands the forked processes the next chunk of items
while each has fewer than two, and otherwise runs the next chunk itself: what it runs costs no
pickling on either side and no unpickling in the caller (about 0.2 ms of a fleet report's 1.2).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from typing import TypeVar

from checks.supervise import procs

T = TypeVar("T")
R = TypeVar("R")

MAX_WORKERS = 16  # past this, the parent folding the results in order is the bottleneck
MAX_ASKED = 64  # the most processes an explicit count (--jobs) starts
MIN_PER_WORKER = 64  # fewer items than this per process: starting it costs more than it saves


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, as a container or taskset sets it)."""
    process_cpu_count = getattr(os, "process_cpu_count", None)  # Python 3.13+
    if process_cpu_count is not None:
        return int(process_cpu_count() or 1)
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def workers_for(n_items: int, limit: int | None = None) -> int:
    """Processes worth starting for `n_items`: at most the usable CPUs, MAX_WORKERS and `limit`,
    at least MIN_PER_WORKER items each; 1 means "do it in this process"."""
    most = min(usable_cpus(), MAX_WORKERS, limit or MAX_WORKERS)
    return max(1, min(most, n_items // MIN_PER_WORKER))


def processes(n_items: int, workers: int | None = None) -> int:
    """The processes ordered_map starts: workers_for by default; an explicit count is bounded
    too, by the items and MAX_ASKED."""
    if workers is None:
        return workers_for(n_items)
    return max(1, min(workers, n_items, MAX_ASKED))


def _worker_setup(parent: int) -> None:
    """Ctrl-C reaches the whole process group: the caller handles it (and shuts the pool down,
    what was not started never starts); a worker finishes its item instead of dying with a
    traceback of its own. A caller ended by SIGTERM or SIGKILL (cron's timeout, slurmd) runs no
    shutdown: the kernel ends its workers then (PR_SET_PDEATHSIG, procs.set_pdeathsig), where
    they used to wait on the call queue for ever."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    procs.set_pdeathsig(signal.SIGKILL)
    if os.getppid() != parent:  # the caller died before the line above took effect
        os._exit(1)


def _run_chunk(fn: Callable[[T], R], chunk: list[T]) -> list[R]:
    return [fn(item) for item in chunk]


class Pool:
    """`workers` processes for several ordered maps, the caller one of them. The others are forked
    at the start of the `with` block and kept until it ends: a caller that first reads (a small
    process) and then holds what it read (hundreds of MB) gives its later maps the processes
    forked while it was small, never copies of its grown self. One worker means the builtin map
    in this process."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._executor: ProcessPoolExecutor | None = None

    def __enter__(self) -> Pool:
        if self.workers > 1 and "fork" in multiprocessing.get_all_start_methods():
            self._executor = ProcessPoolExecutor(self.workers - 1,
                                                 mp_context=multiprocessing.get_context("fork"),
                                                 initializer=_worker_setup, initargs=(os.getpid(),))
        return self

    def __exit__(self, *exc: object) -> None:
        if self._executor is not None:  # what was not started never starts
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None

    def map(self, fn: Callable[[T], R], items: Iterable[T], chunksize: int = 16) -> Iterator[R]:
        """fn over items in input order. `fn` must be a module-level function and its results
        picklable; a caller that stops early leaves the rest of its items unstarted."""
        if self._executor is None:
            return map(fn, items)
        return self._shared(self._executor, fn, list(items), max(1, chunksize))

    def _shared(self, executor: ProcessPoolExecutor, fn: Callable[[T], R], items: list[T],
                chunksize: int) -> Iterator[R]:
        """The chunks of `items` in order, each run by a forked process or by the caller: the
        next chunk goes to the forked processes while they hold fewer than two each (one running,
        one queued), else the caller runs it. Results are held only until those before them are
        given out (at most one chunk per process and the caller's)."""
        chunks = [items[i:i + chunksize] for i in range(0, len(items), chunksize)]
        slots: dict[int, Future[list[R]] | list[R]] = {}
        queued, given, busy_limit = 0, 0, 2 * (self.workers - 1)
        pending: set[Future[list[R]]] = set()
        try:
            while given < len(chunks):
                pending = {f for f in pending if not f.done()}
                while queued < len(chunks) and len(pending) < busy_limit:
                    future = executor.submit(_run_chunk, fn, chunks[queued])
                    slots[queued] = future
                    pending.add(future)
                    queued += 1
                while given < queued:  # what is done, in order
                    slot = slots[given]
                    if isinstance(slot, Future):
                        if not slot.done() and queued < len(chunks):
                            break
                        slot = slot.result()
                    del slots[given]
                    given += 1
                    yield from slot
                if queued < len(chunks):  # the forked processes are busy: the caller runs one
                    slots[queued] = _run_chunk(fn, chunks[queued])
                    queued += 1
        finally:
            for future in pending:
                future.cancel()


def ordered_map(fn: Callable[[T], R], items: Iterable[T], workers: int | None = None,
                chunksize: int = 16) -> Iterator[R]:
    """fn over items, in `workers` forked processes (processes(): workers_for by default), in
    input order, in a Pool of its own."""
    items = list(items)
    with Pool(processes(len(items), workers)) as pool:
        yield from pool.map(fn, items, chunksize)
