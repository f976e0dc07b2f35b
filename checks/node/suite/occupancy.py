"""GPUs already in use before the jobs start: other processes' compute contexts, memory held.

A GPU that another process holds (a zombie of an earlier job, a stuck container, a process of
another PID namespace) makes the jobs run out of memory or share the GPU. NVML lists compute
processes with host PIDs (nvmlDeviceGetComputeRunningProcesses); a process NVML cannot name may
live in another PID namespace or be a zombie that no longer exists in /proc.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from checks.hw.base import NoPermission, NotSupported
from checks.model import CheckOutcome, Result, Status, fail, passed, skip, warn
from checks.node import workload_plan as plan
from checks.node.context import Context, Gpu
from checks.node.perdevice import each_gpu
from checks.node.registry import Budget, Cost, check

MIB = 1 << 20
REMEDY_PROCESS = ("stop the listed processes (nvidia-smi --query-compute-apps=pid,"
                  "process_name,used_memory --format=csv); a PID that `kill` cannot find "
                  "belongs to another PID namespace (a container: stop that container) or is a "
                  "zombie whose context only a GPU reset (nvidia-smi -r) or a reboot frees")
REMEDY_MEMORY = ("memory is held with no compute process NVML lists: look for processes of "
                 "other containers (run nvidia-smi on the host), then reset the GPU "
                 "(nvidia-smi -r -i <index>, with nothing else on it) or reboot")


REMEDY_LINGERING = ("see whether the OS holds it: numastat -m (the GPU's memory is a NUMA node "
                    "of its own without CDMM), then sync; echo 3 > /proc/sys/vm/drop_caches; a "
                    "GPU still held after that with no process: " + REMEDY_MEMORY)


def _status(name: str) -> Status:
    value = str(name).upper()
    if value not in ("FAIL", "WARN"):
        raise ValueError(f"occupancy status must be fail or warn, got {name!r}")
    return Status(value)


def _describe(proc: dict[str, Any]) -> str:
    name = proc.get("name") or "name unknown"
    used = proc.get("used_memory_bytes")
    return f"pid {proc['pid']} ({name}{'' if used is None else f', {used / MIB:.0f} MiB'})"


def _unprivileged(what: str, exc: Exception) -> Result:
    """In MIG mode the parent GPU's aggregate process list and memory need privileges (nvml.h,
    nvmlDeviceGetComputeRunningProcesses and nvmlDeviceGetMemoryInfo[_v2]: "only if the caller
    has appropriate privileges"): unknown, not broken."""
    return skip(f"not judgeable: NVML refuses this GPU's {what} without privileges ({exc}); "
                "run as root, or query the MIG devices")


def _job_order(job: str) -> tuple[int, str]:
    return (int(job), job) if job.isdigit() else (0, job)


def busy_gate(ctx: Context, outcome: CheckOutcome) -> str | None:
    """The gate of the workload checks (registry `gated_by=("gpu-occupied",)`): a GPU the
    launches use (workload_plan.visible_gpus) on which another process holds a compute context
    (a stray, another container's, a Slurm job's) would be measured together with that job: its
    figures would be the other job's, not the hardware's, and a FAIL would blame the GPU. Names
    who holds which GPU, as NVML lists them. Memory held with no process listed does not gate
    (gpu-occupied judges it; the measurements size from free memory)."""
    used = {str(g.device.pci).lower() for g in plan.visible_gpus(ctx) if g.device.pci}
    busy = []
    for result in outcome.results:
        holders = (result.details or {}).get("holders") or []
        device = result.device
        if not holders or device is None or str(device.pci).lower() not in used:
            continue
        jobs = (result.details or {}).get("slurm_jobs") or {}
        named = ", ".join(_describe(h) + (f" [Slurm job {jobs[str(h['pid'])]}]"
                                          if str(h["pid"]) in jobs else "") for h in holders)
        busy.append(f"GPU{device.index} ({device.pci}) held by {named}")
    if not busy:
        return None
    return (f"busy: {'; '.join(busy)}: measured now, the figures would be that job's, not the "
            "hardware's (see gpu-occupied); run again when the GPUs are free")


@check("gpu-occupied", code="GPU050", title="no other process holds the GPUs before the jobs",
       needs=("driver-loaded",), gate=busy_gate,
       scope="gpu", nvml=("memory_total_bytes", "memory_used_bytes", "compute_processes"),
       budget=Budget(value=9, cost=Cost(cpu=1, gpu=1), source="estimated"))
def gpu_occupied(ctx: Context) -> Iterator[Result]:
    """Compute processes that are not this tool (nvmlDeviceGetComputeRunningProcesses) fail
    (profile occupancy.process_status); memory in use above occupancy.memory_used_warn_bytes
    with no such process warns, above occupancy.memory_used_fail_fraction of the GPU's memory
    fails. Runs before the workload checks, which would otherwise measure a shared GPU, and
    gates them (busy_gate): they SKIP, naming who holds which GPU, while another process does.
    A process in a Slurm job's cgroup (/proc/PID/cgroup), or, where no cgroup names a job
    (proctrack/linuxproc), below the job step's root-owned slurmstepd (checks/hw/jobprocs.py;
    both through Backend.process_slurm_job) is the job Slurm placed there, not a stray: a GPU
    that only jobs hold SKIPs as busy, naming the job (the health check slurmd runs during jobs
    must not drain the node for its own job); other processes beside a job's are still judged.
    A GPU whose process list or memory use NVML refuses for lack of privileges (NO_PERMISSION: a
    MIG-enabled GPU's parent handle) SKIPs as not judgeable. Memory held with no process is only
    a warning where the profile says occupancy.memory_without_process_status: warn
    (GB200/GB300: without CDMM the OS manages GPU memory as a NUMA node and can keep freed
    memory mapped)."""
    p = ctx.profile
    process_status = _status(p.require("occupancy.process_status"))
    warn_bytes = int(p.require("occupancy.memory_used_warn_bytes"))
    fail_fraction = float(p.require("occupancy.memory_used_fail_fraction"))
    # Grace platforms (the profile says warn): the OS may keep freed GPU memory mapped
    lingering = _status(p.get("occupancy.memory_without_process_status") or "fail") is Status.WARN
    own = ctx.hw.own_pids()
    container = ctx.hw.container()
    pid_note = (f"; this runs in a container ({container}): NVML gives host PIDs, which it may "
                "neither see nor stop" if container else "")

    jobs_seen: dict[int, str | None] = {}

    def job_of(pid: int) -> str | None:
        if pid not in jobs_seen:
            jobs_seen[pid] = ctx.hw.process_slurm_job(pid)
        return jobs_seen[pid]

    def measure(gpu: Gpu) -> Result:
        q = gpu.handle.query
        try:
            procs: list[dict[str, Any]] | None = list(q("compute_processes"))
        except NotSupported:
            procs = None  # e.g. vGPU guests; the memory figure still tells
        except NoPermission as exc:
            return _unprivileged("process list", exc)
        try:
            used, total = int(q("memory_used_bytes")), int(q("memory_total_bytes"))
        except NoPermission as exc:
            return _unprivileged("memory use", exc)
        details: dict[str, Any] = {"memory_used_bytes": used, "memory_total_bytes": total,
                                   "processes": procs}
        others = [pr for pr in procs or [] if pr["pid"] not in own]
        details["holders"] = others  # what the workload checks' gate names (busy_gate)
        jobs = {pr["pid"]: job_of(pr["pid"]) for pr in others}
        in_jobs = [pr for pr in others if jobs[pr["pid"]]]
        foreign = [pr for pr in others if not jobs[pr["pid"]]]
        details["slurm_jobs"] = {str(pid): job for pid, job in jobs.items() if job}
        mine = sum(int(pr.get("used_memory_bytes") or 0) for pr in procs or []
                   if pr["pid"] in own)
        held = used - mine
        expected = f"no other process; < {warn_bytes / MIB:.0f} MiB used"
        job_note = ""
        if in_jobs:
            by_job = sorted({str(jobs[pr["pid"]]) for pr in in_jobs}, key=_job_order)
            job_note = (f"in use by Slurm job {', '.join(by_job)} "
                        f"({', '.join(_describe(pr) for pr in in_jobs)})")
        if foreign:
            listed = ", ".join(_describe(pr) for pr in foreign)
            message = (f"{len(foreign)} other process(es) hold a compute context: {listed}; "
                       f"{used / MIB:.0f} MiB of {total / MIB:.0f} MiB in use"
                       + (f"; besides, {job_note}" if job_note else "") + pid_note)
            return Result(process_status, message, value=len(foreign), unit="processes",
                          expected=expected, details=details, remedy=REMEDY_PROCESS)
        if in_jobs:
            # The job's own memory and processes are expected; what is free cannot be judged.
            return skip(f"busy: {job_note}; occupancy and the GPU's free memory are not judged "
                        "while a job runs", value=len(in_jobs), unit="processes",
                        expected=expected, details=details)
        unlisted = ("NVML does not list processes on this GPU" if procs is None
                    else "no compute process listed")
        if held > warn_bytes:
            judged = fail if held > fail_fraction * total and not lingering else warn
            note = (f"; on {p.name} the OS can keep memory a process freed mapped (GPU memory "
                    "onlined as a NUMA node, without CDMM): a warning, not a failure"
                    if lingering and held > fail_fraction * total else "")
            return judged(f"{held / MIB:.0f} MiB of {total / MIB:.0f} MiB in use with "
                          f"{unlisted}" + note + pid_note, value=round(held / MIB), unit="MiB",
                          expected=expected, details=details,
                          remedy=REMEDY_LINGERING if lingering else REMEDY_MEMORY)
        return passed(f"free: {unlisted}, {used / MIB:.0f} MiB in use", value=round(held / MIB),
                      unit="MiB", expected=expected, details=details)

    yield from each_gpu(ctx, measure)
