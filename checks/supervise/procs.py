"""Process bookkeeping from /proc: liveness, descendants, and processes marked by environment.

A launch marks every process it starts with NODECERT_WORKDIR=<its directory>; whatever still
carries the marker after the launch is an orphan, found here and killed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path


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
