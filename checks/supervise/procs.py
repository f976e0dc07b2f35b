"""Process bookkeeping from /proc (liveness, descendants, processes marked by environment) and
the one way the node side starts a child that may start others (`start`, `run`, `supervised`).

A launch marks every process it starts with NODECERT_WORKDIR=<its directory>; whatever still
carries the marker after the launch is an orphan, found here and killed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any


def _stat_fields(pid: int | str) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # comm may hold spaces and parentheses: the fields after the last ')' are fixed.
    return text[text.rfind(")") + 2:].split()


def alive(pid: int) -> bool:
    fields = _stat_fields(pid)
    return fields is not None and fields[0] != "Z"


def descendants(root: int) -> list[int]:
    """Every process below `root`, found through the parent links in /proc."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        fields = _stat_fields(entry.name)
        if fields is not None:
            parents[int(entry.name)] = int(fields[1])
    found, frontier = [], [root]
    while frontier:
        pid = frontier.pop()
        kids = [p for p, pp in parents.items() if pp == pid]
        found += kids
        frontier += kids
    return found


def groups(pids: Iterable[int]) -> set[int]:
    """The process groups of `pids` (that still exist), other than this process's own."""
    found = set()
    for pid in pids:
        fields = _stat_fields(pid)
        if fields is not None:
            found.add(int(fields[2]))
    return found - {os.getpgrp(), 0, 1}


def kill_groups(pgids: Iterable[int]) -> None:
    for pgid in pgids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)


def children(pid: int) -> list[int]:
    """Live direct children of `pid`."""
    kids = []
    for entry in Path("/proc").glob("[0-9]*"):
        fields = _stat_fields(entry.name)
        if fields is not None and int(fields[1]) == pid and fields[0] != "Z":
            kids.append(int(entry.name))
    return sorted(kids)


def with_env(key: str, value: str) -> list[int]:
    """PIDs of live processes whose environment holds KEY=VALUE (only our own are readable)."""
    marker = f"{key}={value}".encode()
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        pid = int(entry.name)
        if pid == os.getpid():
            continue
        try:
            if marker not in (entry / "environ").read_bytes().split(b"\0"):
                continue
        except OSError:
            continue
        if alive(pid):
            found.append(pid)
    return sorted(found)


def kill_all(pids: list[int], grace_s: float = 5.0) -> list[int]:
    """SIGKILL each pid; return those still alive after `grace_s`."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + grace_s
    left = list(pids)
    while left and time.monotonic() < deadline:
        left = [p for p in left if alive(p)]
        if left:
            time.sleep(0.05)
    return left


# --- Starting process trees that cannot outlive the run -------------------------------------
#
# Every child that the node side starts goes through `start()` (or `run()`): its own session, so
# one killpg reaches its whole group; PR_SET_PDEATHSIG, so the kernel kills it when the thread
# that started it dies, even by SIGKILL; and `kill_tree()` on every way out. Python children
# that start further children of their own (torchrun starting ranks) run through
# `python -m checks.supervise.guard`, which sets the same signal inside them.

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
ENV_PARENT = "NODECERT_GUARD_PARENT"  # pid a guarded child expects as its parent
# a file where `python -m checks` keeps the id of the check it started last (checks.node.watchdog;
# the Slurm wrapper reads it to name the check a hung run hung in)
ENV_PROGRESS = "NODECERT_PROGRESS"


def _load_prctl():  # type: ignore[no-untyped-def]
    """libc's prctl, resolved once up front (never inside a forked child), or None off Linux."""
    try:
        import ctypes

        # The process's own symbols include libc's (ctypes.util.find_library would run
        # ldconfig, a subprocess on every start of a health check).
        fn = ctypes.CDLL(None, use_errno=True).prctl
        fn.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                       ctypes.c_ulong]
        fn.restype = ctypes.c_int
        return fn
    except (OSError, AttributeError):
        return None


_PRCTL = _load_prctl()


def set_pdeathsig(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send `sig` to this process when its parent (thread) dies. False where
    prctl is not available (not Linux)."""
    return _PRCTL is not None and _PRCTL(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0


def _child_setup(parent: int) -> Callable[[], None]:
    def setup() -> None:  # runs in the child between fork and exec: no imports, no locks
        set_pdeathsig(signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before the line above took effect
            os._exit(1)

    return setup


def start(cmd: Sequence[str], *, env: Mapping[str, str] | None = None,
          **popen: Any) -> subprocess.Popen[Any]:
    """subprocess.Popen in a new session, killed by the kernel when this thread dies."""
    env = dict(os.environ if env is None else env)
    env[ENV_PARENT] = str(os.getpid())
    return subprocess.Popen(list(cmd), env=env, start_new_session=True,
                            preexec_fn=_child_setup(os.getpid()), **popen)


def kill_tree(proc: subprocess.Popen[Any], extra: Iterable[int] = (),
              grace_s: float = 5.0) -> list[int]:
    """SIGKILL `proc`'s process group, every descendant (ranks in sessions of their own) and
    `extra`; reap `proc`. Returns the pids still alive after `grace_s` (a process stuck in the
    kernel). Safe to call again, and after `proc` ended."""
    # Once reaped, proc.pid may belong to someone else: only its group (a pid is not reused
    # while a group of that id has members) and `extra` are ours.
    running = proc.returncode is None
    victims = set(extra) | (set(descendants(proc.pid)) | {proc.pid} if running else set())
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    left = kill_all(sorted(victims), grace_s)
    if running:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s if proc.pid in left else None)
    return left


@contextlib.contextmanager
def supervised(cmd: Sequence[str], **popen: Any) -> Iterator[subprocess.Popen[Any]]:
    """`start(cmd)`; its whole tree is killed when the block ends, however it ends (a timeout,
    an exception, SIGINT/SIGTERM turned into an exception by `exit_on_signals`)."""
    proc = start(cmd, **popen)
    try:
        yield proc
    finally:
        kill_tree(proc)


def run(cmd: Sequence[str], *, timeout_s: float, input: str | bytes | None = None,
        **popen: Any) -> subprocess.CompletedProcess[Any]:
    """subprocess.run(capture_output=True) for a command that may start children: on timeout
    (subprocess.TimeoutExpired, with what was captured) or any other way out, the whole tree is
    killed, not only the direct child."""
    popen.setdefault("stdout", subprocess.PIPE)
    popen.setdefault("stderr", subprocess.PIPE)
    if input is None:
        popen.setdefault("stdin", subprocess.DEVNULL)
    else:
        popen["stdin"] = subprocess.PIPE
    with supervised(cmd, **popen) as proc:
        try:
            out, err = proc.communicate(input, timeout=timeout_s)
        except subprocess.TimeoutExpired as exc:
            kill_tree(proc)
            out, err = proc.communicate()
            raise subprocess.TimeoutExpired(exc.cmd, timeout_s, out, err) from None
        # Whatever the command left behind (a daemonised helper, DataLoader workers) goes too.
        kill_tree(proc)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


# --- SIGINT / SIGTERM as an orderly exit --------------------------------------------------


class Terminated(BaseException):
    """SIGINT or SIGTERM arrived: unwinds every `finally` (process trees killed, temporary
    directories removed) up to the command's main, which exits 128 + signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


EXIT_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _raise_terminated(signum: int, _frame: object) -> None:
    # Once unwinding has started, a second signal must not interrupt the cleanup.
    for sig in EXIT_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    raise Terminated(signum)


def exit_on_signals() -> None:
    """Turn SIGINT, SIGTERM and SIGHUP into `Terminated` in the main thread (a no-op elsewhere,
    where Python cannot install handlers)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return
    for sig in EXIT_SIGNALS:
        if signal.getsignal(sig) is not signal.SIG_IGN:  # nohup'd: keep ignoring SIGHUP
            signal.signal(sig, _raise_terminated)
