# Copyright: nodecert contributors
# Apache License 2.0 (see pyproject.toml)
"""Who holds apt's or dpkg's lock: shared by the modules that wait for it (nodecert_apt_lock_wait,
nodecert_dpkg_selections). Roles that depend on preflight find it as ansible.module_utils."""

from __future__ import annotations

import fcntl
import os
import struct

# The locks apt and dpkg take (fcntl record locks): the frontend lock first, which apt and dpkg
# take before dpkg's own database lock, then the lists lock of `apt-get update`.
DPKG_LOCKS = ["/var/lib/dpkg/lock-frontend", "/var/lib/dpkg/lock"]
APT_LOCKS = [*DPKG_LOCKS, "/var/lib/apt/lists/lock"]

# struct flock on Linux: short l_type, short l_whence, off_t l_start, off_t l_len, pid_t l_pid.
FLOCK_FORMAT = "hhqqi"


def lock_holder(path: str) -> int | None:
    """PID holding a conflicting lock on path (0 when unknown), None when the lock is free. Asks
    the kernel whether a write lock could be taken (F_GETLK): never takes the lock itself."""
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return None
    try:
        query = struct.pack(FLOCK_FORMAT, fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
        answer = fcntl.fcntl(fd, fcntl.F_GETLK, query)
    finally:
        os.close(fd)
    l_type, _, _, _, l_pid = struct.unpack(FLOCK_FORMAT, answer)
    return None if l_type == fcntl.F_UNLCK else l_pid


def held_locks(paths: list[str]) -> dict[str, int]:
    """The locks of paths that are held, each with its holder's PID (0: not visible from here)."""
    return {path: pid for path in paths if (pid := lock_holder(path)) is not None}


def describe(pid: int) -> str:
    if pid <= 0:
        return "a process in another PID namespace"
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            command = handle.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        command = "?"
    return f"PID {pid} ({command or '?'})"


def describe_held(held: dict[str, int]) -> str:
    return "; ".join(f"{path} held by {describe(pid)}" for path, pid in held.items())
