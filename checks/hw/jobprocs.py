"""Which Slurm job a process belongs to when its cgroup does not say (proctrack/linuxproc,
proctrack/pgid, no cgroup plugin): its ancestry up to the job step's slurmstepd.

slurmd starts one slurmstepd per job step, as root, and every process of the step descends
from it until one leaves (daemonizes); slurmstepd sets its process title to
`slurmstepd: [<job>.<step>]` (e.g. `[123.batch]`, `[123.0]`, `[123.extern]`; seen in
/proc/PID/cmdline under Slurm 22.05, and what `ps` shows on any Slurm node). proctrack/linuxproc
itself tracks a job's processes by this same parent-child ancestry (Slurm's proctrack plugin
documentation, slurm.schedmd.com/proctrack_plugins.html), so a process it would count as the
job's is one this finds. The ancestor must run as root (real uid 0): a user's own process
named `slurmstepd` does not make its children a job's. SLURM_JOB_ID in /proc/PID/environ is not
used: any user can set it for a stray process.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

STEPD_COMM = "slurmstepd"
STEPD_TITLE = re.compile(r"slurmstepd: \[(\d+)\.[A-Za-z0-9_]+\]")
MAX_DEPTH = 64  # ancestors looked at; a process tree is never this deep in practice
CMDLINE_MAX = 256  # bytes of an ancestor's command line read


@dataclass(frozen=True)
class ProcInfo:
    ppid: int
    uid: int  # real uid
    comm: str
    cmdline: str  # arguments joined by spaces


def slurm_job_of_ancestry(pid: int, read: Callable[[int], ProcInfo | None]) -> str | None:
    """The job id of the nearest root-owned slurmstepd above `pid` (`read` gives a process's
    facts, None when it is gone or unreadable); None when the chain reaches init (pid 1, or a
    process whose parent is 0) without one."""
    seen = {pid}
    info = read(pid)
    for _ in range(MAX_DEPTH):
        if info is None or info.ppid <= 1 or info.ppid in seen:
            return None
        seen.add(info.ppid)
        info = read(info.ppid)
        if info is not None and info.comm == STEPD_COMM and info.uid == 0:
            match = STEPD_TITLE.match(info.cmdline)
            if match:
                return match.group(1)
    return None


def read_proc(pid: int, proc: Path = Path("/proc")) -> ProcInfo | None:
    """ProcInfo from /proc/PID/stat (ppid; comm is taken between the first '(' and the last ')',
    as it may hold either), status (Uid: real) and cmdline; None when any is unreadable."""
    base = proc / str(int(pid))
    try:
        stat = (base / "stat").read_text()
        status = (base / "status").read_text()
        with (base / "cmdline").open("rb") as f:
            cmdline = f.read(CMDLINE_MAX)
    except OSError:
        return None
    try:
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        ppid = int(stat[stat.rindex(")") + 1:].split()[1])
        uid = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("Uid:"))
    except (ValueError, IndexError, StopIteration):
        return None
    text = cmdline.replace(b"\0", b" ").decode("utf-8", "replace").strip()
    return ProcInfo(ppid, uid, comm, text)
