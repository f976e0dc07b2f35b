"""A bounded process pool for work that is pure computation over files (the fleet controller
parsing and validating thousands of host reports): results come back in the order of the inputs,
so what is built from them is the same as with one process. Two ways:

- shared_map (Pool.read_map, ordered_map): N processes share the work, the caller one of them; the
  N - 1 others are forked for this one map from a caller that holds the items (they are not sent),
  and each process takes the next chunk of items from a shared counter until none is left. A
  forked process sends each result on its own pipe as it is done; the caller takes them between
  its own items, with no thread of its own. What the caller runs costs no pickling on either side
  (about 0.1 ms of a fleet report's 0.8), and nothing waits on an executor's threads: those
  waited up to the interpreter's switch interval for a busy caller, and the forked processes
  idled meanwhile (a third of their time at 10 000 reports).
- Pool.map: a ProcessPoolExecutor of N processes forked when the pool starts, while the caller
  is small, for maps whose items the caller builds later (the JUnit suites, the history's rows).
"""

from __future__ import annotations

import contextlib
import fcntl
import multiprocessing
import os
import pickle
import signal
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from multiprocessing.connection import Connection, wait
from typing import Any, TypeVar

from checks.supervise import procs

T = TypeVar("T")
R = TypeVar("R")

MAX_WORKERS = 16  # past this, the parent folding the results in order is the bottleneck
MAX_ASKED = 64  # the most processes an explicit count (--jobs) starts
MIN_PER_WORKER = 64  # fewer items than this per process: starting it costs more than it saves
PIPE_BYTES = 1 << 20  # a read_map pipe's buffer, where the kernel allows (results queue there)


class WorkerDied(RuntimeError):
    """A forked process of read_map ended before sending all it took on (killed, out of memory)."""


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


class Pool:
    """`workers` processes for a first map over items the caller holds (read_map: forked for it)
    and for later maps (map: forked when the `with` block starts and kept until it ends). A caller
    that first reads (a small process) and then holds what it read (hundreds of MB) gives its
    later maps the processes forked while it was small, never copies of its grown self. One
    worker means the builtin map in this process."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._executor: ProcessPoolExecutor | None = None

    def __enter__(self) -> Pool:
        if self.workers > 1 and "fork" in multiprocessing.get_all_start_methods():
            self._executor = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("fork"),
                                                 initializer=_worker_setup, initargs=(os.getpid(),))
            self._executor.submit(int).result()  # forked now (the first task forks them all)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._executor is not None:  # what was not started never starts
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None

    def map(self, fn: Callable[[T], R], items: Iterable[T], chunksize: int = 16) -> Iterator[R]:
        """fn over items in input order, in the pool's processes. `fn` must be a module-level
        function and its results picklable; a caller that stops early leaves the rest of its
        items unstarted."""
        if self._executor is None:
            return map(fn, items)
        return self._executor.map(fn, items, chunksize=chunksize)

    def read_map(self, fn: Callable[[T], R], items: Iterable[T], chunksize: int = 16) -> Iterator[R]:
        """fn over items in input order, by shared_map with the pool's number of processes: for a
        first map, while the caller is small and holds the items."""
        return shared_map(fn, items, self.workers, chunksize)


def ordered_map(fn: Callable[[T], R], items: Iterable[T], workers: int | None = None,
                chunksize: int = 16) -> Iterator[R]:
    """fn over items, by `workers` processes (processes(): workers_for by default), the caller
    one of them, in input order (shared_map)."""
    items = list(items)
    return shared_map(fn, items, processes(len(items), workers), chunksize)


def _reader(fn: Callable[[Any], Any], items: list[Any], chunksize: int, claim: Any, conn: Connection,
            parent: int) -> None:
    """A forked process of shared_map: the next chunk from `claim` until none is left, each result
    sent as (index, result); an exception as (-1, exception), and the end."""
    _worker_setup(parent)
    try:
        while (start := _claimed(claim, chunksize)) < len(items):
            for i in range(start, min(start + chunksize, len(items))):
                conn.send_bytes(pickle.dumps((i, fn(items[i])), pickle.HIGHEST_PROTOCOL))
    except BaseException as exc:  # handed to the caller, which raises it
        try:
            message = pickle.dumps((-1, exc), pickle.HIGHEST_PROTOCOL)
        except Exception:  # an exception that does not pickle: its text
            message = pickle.dumps((-1, RuntimeError(f"{type(exc).__name__}: {exc}")))
        conn.send_bytes(message)
    finally:
        conn.close()


class _Readers:
    """The processes shared_map forked, and the results they sent that are not given out yet."""

    def __init__(self) -> None:
        self.processes: list[Any] = []
        self.pipes: list[Connection] = []
        self.done: dict[int, Any] = {}

    def start(self, fn: Callable[[Any], Any], items: list[Any], chunksize: int, claim: Any,
              count: int) -> None:
        ctx = multiprocessing.get_context("fork")
        for _ in range(count):
            receive, send = ctx.Pipe(duplex=False)
            # F_SETPIPE_SZ (Linux): results wait there, not in a blocked write; past
            # /proc/sys/fs/pipe-max-size for this user the kernel's 64 kB stay
            with contextlib.suppress(OSError):
                fcntl.fcntl(send.fileno(), getattr(fcntl, "F_SETPIPE_SZ", 1031), PIPE_BYTES)
            process = ctx.Process(target=_reader, args=(fn, items, chunksize, claim, send, os.getpid()),
                                  daemon=True)
            process.start()
            send.close()
            self.processes.append(process)
            self.pipes.append(receive)

    def take(self, timeout: float | None) -> None:
        """Every result that has arrived (waiting up to `timeout` for one; None: until one does, or
        a pipe ends); a forked process's exception is raised here."""
        # between the caller's items, a poll of each pipe (~2 us; wait() builds a selector, ~15)
        ready = [c for c in self.pipes if c.poll()] if timeout == 0 else wait(self.pipes, timeout)
        for conn in ready:
            assert isinstance(conn, Connection)
            while True:
                try:
                    index, result = pickle.loads(conn.recv_bytes())
                except EOFError:
                    self.pipes.remove(conn)
                    break
                if index < 0:
                    raise result
                self.done[index] = result
                if not conn.poll():
                    break

    def close(self) -> None:
        for conn in self.pipes:
            conn.close()
        for process in self.processes:
            if process.is_alive():
                process.kill()
            process.join()


def _claimed(claim: Any, chunksize: int) -> int:
    with claim.get_lock():
        start: int = claim.value
        claim.value = start + chunksize
    return start


def shared_map(fn: Callable[[T], R], items: Iterable[T], workers: int, chunksize: int = 16) -> Iterator[R]:
    """fn over items, in input order, by `workers` processes: the caller and workers - 1 forked for
    this map (they find the items in their copy of the caller's memory; one, or no fork on this
    system, means the builtin map). Each process takes the next `chunksize` items from a shared
    counter until none is left; the caller takes the others' results from their pipes between
    its own items. A caller that stops early, or is interrupted, ends the forked processes."""
    items = list(items)
    if workers <= 1 or len(items) <= chunksize or "fork" not in multiprocessing.get_all_start_methods():
        yield from map(fn, items)
        return
    claim = multiprocessing.get_context("fork").Value("q", 0)
    readers = _Readers()
    done, given = readers.done, 0
    try:
        readers.start(fn, items, chunksize, claim, workers - 1)  # a failed fork ends those started
        while (start := _claimed(claim, chunksize)) < len(items):
            for i in range(start, min(start + chunksize, len(items))):
                done[i] = fn(items[i])
                readers.take(0)
                while given in done:
                    yield done.pop(given)
                    given += 1
        while given < len(items):
            if given in done:
                yield done.pop(given)
                given += 1
            elif readers.pipes:
                readers.take(None)
            else:
                raise WorkerDied(f"a reading process ended before item {given + 1} of {len(items)} "
                                 "(killed, or out of memory?)")
    finally:
        readers.close()
