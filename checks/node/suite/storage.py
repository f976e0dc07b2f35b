"""Disk space where the training software and checkpoints live, and swap.

A full disk kills a run at its first checkpoint ("No space left on device"), or earlier when pip,
the torch.compile/Triton caches or the DataLoader's temporary files write; swap lets a rank's
host memory page out, and one slow rank stalls all the others at the next collective.
"""

from __future__ import annotations

from collections.abc import Iterator

from checks.hw.base import HardwareError, NotSupported
from checks.model import Result, Status, error, fail, passed, skip, warn
from checks.node.context import Context
from checks.node.registry import Budget, Cost, check

GIB = 1 << 30
NO_PATHS = ("no path to judge: the Python environment is unknown and the profile lists no "
            "storage.paths")
REMEDY_DISK = ("free space on that file system (old checkpoints, ~/.cache/pip, ~/.triton, "
               "/tmp), or point the checkpoint directory at a larger volume")


def _paths(ctx: Context) -> list[tuple[str, str]]:
    """(what, path): the Python environment and torch, then the profile's storage.paths and
    the run's extra storage paths (checkpoint directories)."""
    found = [(what, path) for what, path in ctx.hw.python_paths().items()]
    extra = list(ctx.profile.get("storage.paths") or [])
    extra += list(ctx.options.extra.get("storage_paths") or [])
    found += [("checkpoints", str(p)) for p in extra]
    return found


@check("disk-space", code="HOST010", title="free disk space for torch, the venv and checkpoints",
       stage="host",
       budget=Budget(value=7, cost=Cost(cpu=1, gpu=1), source="estimated"))
def disk_space(ctx: Context) -> Iterator[Result]:
    """Free space (statvfs f_bavail) of each file system holding the Python environment, torch
    and the profile's storage.paths: below storage.free_fail_bytes FAIL, below
    storage.free_warn_bytes WARN. One result per file system; a path that does not exist yet is
    judged on its nearest existing parent."""
    fail_at = int(ctx.profile.require("storage.free_fail_bytes"))
    warn_at = int(ctx.profile.require("storage.free_warn_bytes"))
    paths = _paths(ctx)
    if not paths:
        yield skip(NO_PATHS)
        return
    seen: dict[str, list[str]] = {}
    usage = {}
    for what, path in paths:
        try:
            du = ctx.hw.disk_usage(path)
        except NotSupported as exc:
            yield skip(f"{what} {path}: {exc}")
            continue
        except HardwareError as exc:
            yield error(f"{what} {path}: could not measure: {exc}")
            continue
        seen.setdefault(du.path, []).append(f"{what} {path}")
        usage[du.path] = du
    expected = f">= {warn_at / GIB:.0f} GiB free (fail below {fail_at / GIB:.0f} GiB)"
    for mount, holders in seen.items():
        du = usage[mount]
        free = du.free_bytes
        shown = (f"{free / GIB:.1f} GiB free of {du.total_bytes / GIB:.1f} GiB on the file "
                 f"system of {mount} ({'; '.join(holders)})")
        details = {"path": mount, "holds": holders, "free_bytes": free,
                   "total_bytes": du.total_bytes}
        value = round(free / GIB, 1)
        if free < fail_at:
            yield fail(shown, value=value, unit="GiB", expected=expected, details=details,
                       remedy=REMEDY_DISK)
        elif free < warn_at:
            yield warn(shown, value=value, unit="GiB", expected=expected, details=details,
                       remedy=REMEDY_DISK)
        else:
            yield passed(shown, value=value, unit="GiB", expected=expected, details=details)


@check("swap", code="HOST011", title="swap is off on a training node", stage="host",
       budget=Budget(value=4, cost=Cost(cpu=1, gpu=1), source="estimated"))
def swap(ctx: Context) -> Result:
    """Active swap areas (/proc/swaps) are judged by profile swap.active_status (WARN by
    default); the swap in use is reported."""
    wanted = str(ctx.profile.require("swap.active_status")).upper()
    if wanted not in ("PASS", "WARN", "FAIL"):
        raise ValueError(f"swap.active_status must be pass, warn or fail, got {wanted.lower()}")
    try:
        areas = ctx.hw.swaps()
    except NotSupported as exc:
        return skip(str(exc))
    if not areas:
        return passed("swap off", value=0, unit="GiB", expected="swap off")
    size = sum(a.size_bytes for a in areas)
    used = sum(a.used_bytes for a in areas)
    listed = ", ".join(f"{a.name} ({a.kind}, {a.size_bytes / GIB:.1f} GiB)" for a in areas)
    details = {"areas": [{"name": a.name, "type": a.kind, "size_bytes": a.size_bytes,
                          "used_bytes": a.used_bytes, "priority": a.priority} for a in areas]}
    message = f"swap on: {listed}; {used / GIB:.2f} GiB in use"
    return Result(
        Status(wanted), message, value=round(size / GIB, 1), unit="GiB", expected="swap off",
        details=details,
        remedy=None if wanted == "PASS" else
        "swapoff -a, and remove the swap entries from /etc/fstab (or the systemd swap unit) so it "
        "stays off after a reboot")
