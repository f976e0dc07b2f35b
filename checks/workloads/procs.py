"""Finding the processes a launch left behind, by a marker in their environment."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path


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
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if stat[stat.rfind(")") + 2:].split()[0] != "Z":
            found.append(pid)
    return sorted(found)


def kill_all(pids: list[int], grace_s: float = 5.0) -> list[int]:
    """SIGKILL each pid; return those still alive after `grace_s`."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + grace_s
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if _alive(p)]
        if alive:
            time.sleep(0.05)
    return alive


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:].split()[0] != "Z"
