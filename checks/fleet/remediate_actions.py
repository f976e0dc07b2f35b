"""The remediation loop's actions on this node: reboot through Slurm (with a maintenance
reservation under ReturnToService=2), GPU reset with a reset marker, verification at the level
that caught the fault, resume, escalation (RMA), hold, and release (someone else acted).
Each one sets the stage in the Slurm reason, saves the record and logs the action."""

from __future__ import annotations

import contextlib
import math
import os
import re
import shlex
import time
from collections.abc import Sequence
from typing import Any

from checks.fleet import slurm_control as control
from checks.fleet import slurm_gate as gate
from checks.fleet.remediate_evidence import bundle, keep_evidence, make_backend, remedy_of, verify_level
from checks.fleet.remediate_guard import claim
from checks.fleet.remediate_state import MAINT_WAIT_S, RESERVATION, Record, Run, Seen, Stopped, slurm_time
from checks.fleet.slurm_control import SlurmError, one_line
from checks.hw import kernel_log


def escalate(run: Run, rec: Record, why: str) -> int:
    before = rec.stage
    rec.bundle = bundle(run, rec)
    serial = ",".join(rec.serials) or "-"
    reason = f"{run.prefix}: RMA {rec.fault} {serial} bundle {rec.bundle}"
    cmd = run.set_reason(reason)
    rec.stage, rec.reason = "escalated", reason
    run.save(rec)
    run.log("escalate", "ok", before, "escalated", rec, why, cmd)
    return 0


def hold(run: Run, rec: Record) -> int:
    before = rec.stage
    what = ("run the provisioning play for this host, then resume it" if rec.remedy == "reprovision"
            else "a person decides (nothing is done unattended)")
    reason = f"{run.prefix}: HOLD {rec.remedy} {rec.fault}: {what}"
    cmd = run.set_reason(reason)
    rec.stage, rec.reason = "held", reason
    run.save(rec)
    run.log("hold", "ok", before, "held", rec, rec.why, cmd)
    return 0


def reboot(run: Run, rec: Record, n: str, jobs: bool) -> int:
    """scontrol reboot ASAP nextstate=DOWN: Slurm drains, waits for the jobs, reboots; the node
    comes back DOWN (ReturnToService=0/1). With ReturnToService=2 slurmctld would return it to
    service at registration whatever its checks say, so a maintenance reservation holds it
    until this loop has drained it again for the verification."""
    reason = f"{run.prefix}: REBOOT {rec.fault} {n}, then verify {rec.level}"
    if not claim(run, rec, reason, "detected"):
        return 0
    if return_to_service() == 2:
        name = RESERVATION.format(node=run.node)
        cmd = ["scontrol", "create", "reservation", f"ReservationName={name}", f"Nodes={run.node}",
               "StartTime=now", "Duration=infinite", "Users=root", "Flags=MAINT,IGNORE_JOBS"]
        try:
            run.slurm(cmd, "ReturnToService=2: keeps the node from jobs between reboot and verify")
        except SlurmError as exc:
            if "exist" not in str(exc).lower():
                raise
        rec.reservation = name
        run.save(rec)
        # slurmctld marks a reservation's nodes (sinfo's $) on its own later pass; before that
        # a node that registers after its reboot shows IDLE: the reboot waits for the mark
        deadline = time.monotonic() + MAINT_WAIT_S
        while run.apply and "$" not in run.look().state.flags:
            if time.monotonic() > deadline:
                run.log("wait", "reservation", "detected", "detected", rec,
                        f"{name} does not hold the node yet (no $ in sinfo): reboot next run")
                return 0
            time.sleep(0.5)
    cmd = ["scontrol", "reboot", "ASAP", "nextstate=DOWN", f"reason={reason}", run.node]
    rec.reboot_issued_at = time.time()
    run.slurm(cmd, "reboot when the jobs have ended; DOWN after it until verified")
    rec.attempt += 1
    rec.stage, rec.reason = "rebooting", reason
    run.save(rec)
    run.log("reboot", "ok", "detected", "rebooting", rec,
            "issued while jobs run: Slurm reboots when they end" if jobs else "issued", cmd)
    return 0


def gpu_processes(hw: Any, uuids: Sequence[str]) -> list[str]:
    """`uuid: pid` of every compute process on the GPUs (this tool's own left out)."""
    nvml = hw.nvml()
    own = hw.own_pids()
    found = []
    for i in range(nvml.device_count()):
        gpu = nvml.gpu(i)
        uuid = str(gpu.query("uuid"))
        if uuids and uuid not in uuids:
            continue
        for proc in gpu.query("compute_processes") or []:
            pid = proc.get("pid") if isinstance(proc, dict) else proc
            if pid not in own:
                found.append(f"{uuid}: pid {pid}")
    return found


def reset(run: Run, rec: Record, n: str) -> int:
    """Reset the GPUs the fault names, with no process on them; a marker per GPU lets the
    kernel-log checks judge only what it logged after its reset. A GPU that cannot be reset
    makes the remedy a reboot."""
    if not rec.gpus:
        rec.remedy = "reboot"
        run.save(rec)
        run.log("gpu-reset", "failed", "detected", "detected", rec, "the fault names no GPU: reboot instead")
        return 0
    hw = make_backend(run.checks_args)
    try:
        busy = gpu_processes(hw, rec.gpus)
    except Exception as exc:
        busy = [f"cannot list the GPUs' processes: {one_line(str(exc))}"]
    if busy:
        run.log("wait", "gpu-busy", "detected", "detected", rec,
                f"a process holds the GPU ({'; '.join(busy[:4])}): no reset")
        return 0
    reason = f"{run.prefix}: RESET {rec.fault} {n}, then verify {rec.level}"
    if not claim(run, rec, reason, "detected"):
        return 0
    if not run.apply:
        print(f"dry run: would reset {', '.join(rec.gpus)} and verify at level {rec.level}")
        return 0
    boot = kernel_log.boot_id()
    for uuid in rec.gpus:
        try:
            clock = hw.reset_gpu(uuid)
        except Exception as exc:
            rec.remedy = "reboot"
            run.save(rec)
            run.log("gpu-reset", "failed", "detected", "detected", rec,
                    f"{uuid}: {one_line(str(exc))}: reboot instead")
            return 1
        kernel_log.record_reset(run.state_dir, kernel_log.ResetMarker(
            boot, clock, uuid, _pci_of(hw, uuid), time.strftime("%Y-%m-%dT%H:%M:%S%z")))
    rec.attempt += 1
    rec.stage = "verify"
    rec.reason = f"{run.prefix}: VERIFY {rec.fault} after gpu-reset {n}, level {rec.level}"
    run.set_reason(rec.reason)
    run.save(rec)
    run.log("gpu-reset", "ok", "detected", "verify", rec, f"reset {', '.join(rec.gpus)}; marker kept")
    return 0


def _pci_of(hw: Any, uuid: str) -> str:
    nvml = hw.nvml()
    for i in range(nvml.device_count()):
        gpu = nvml.gpu(i)
        if str(gpu.query("uuid")) == uuid:
            return str(gpu.query("pci_bus_id")).lower()
    return ""


def verify(run: Run, rec: Record) -> int:
    """python -m checks at the record's level, under its deadline (the whole process group is
    killed at it); pass: resume; fail: back to detected with the new report's remedy."""
    if not run.apply:
        print(f"dry run: would verify at level {rec.level} (python -m checks {shlex.join(run.checks_args)})")
        return 0
    os.environ[kernel_log.ENV_STATE_DIR] = str(run.state_dir)  # the checks honour its reset markers
    started = time.monotonic()
    try:
        result, report = gate.run_checks(rec.level, run.checks_args, run.policy.verify_timeout_s,
                                         run.state_dir / gate.PROGRESS)
    except gate.Terminated:
        run.log("verify", "failed", "verify", "verify", rec, "stopped by a signal: verified again next run")
        raise Stopped("verification stopped by a signal") from None
    gate.keep_last(run.state_dir, report, result)
    took = f"{time.monotonic() - started:.1f} s"
    if result.failed:
        rec.stage = "detected"
        seen = run.look()
        kind, fault, gpus, serials, why, level = remedy_of(run.state_dir, control.drain_reason(
            run.prefix, result.summary), run.prefix)
        rec.remedy, rec.fault, rec.why = kind, fault, why
        rec.gpus = gpus or rec.gpus
        rec.serials = serials or rec.serials
        rec.level = verify_level(level, rec.level)
        rec.reason = control.drain_reason(run.prefix, result.summary)
        path = keep_evidence(run, rec, f"verification failed: {result.summary}")
        if path:
            rec.evidence.append(path)
        cmd = run.set_reason(rec.reason) if run.ours(seen.state.reason) or not seen.state.reason \
            else None
        run.save(rec)
        run.log("verify", "failed", "verify", "detected", rec, f"{result.summary} ({took})", cmd)
        return 1
    seen = run.look()
    if seen.state.reboot_pending or not run.ours(seen.state.reason):
        run.log("verify", "ok", "verify", "verify", rec,
                f"passed ({took}), but the node changed meanwhile ({seen.state.state}"
                f"{seen.state.flags}, {seen.state.reason or 'no reason'}): not resumed")
        return 0
    run.log("verify", "ok", "verify", "verify", rec, f"passed at level {rec.level} ({took})")
    cmd = ["scontrol", "update", f"NodeName={run.node}", "State=RESUME"]
    run.slurm(cmd, "back in service after a passing verification")
    rec.stage, rec.reason = "in-service", ""
    run.save(rec)
    run.log("resume", "ok", "verify", "in-service", rec, "back in service", cmd)
    return 0


def return_to_service() -> int:
    """slurmctld's ReturnToService (scontrol show config), 1 (Slurm's default) when unreadable."""
    out = control.run(["scontrol", "show", "config"])
    match = re.search(r"^ReturnToService\s*=\s*(\d+)", out, re.MULTILINE)
    return int(match[1]) if match else 1


def boot_time(node: str) -> float | None:
    """The node's BootTime as slurmd reported it (scontrol show node)."""
    out = control.run(["scontrol", "-o", "show", "node", node])
    match = re.search(r"\bBootTime=(\S+)", out)
    return slurm_time(match[1]) if match else None


def release(run: Run, rec: Record, seen: Seen, why: str) -> int:
    """Someone else acted on the node: nodecert's hold ends, its reservation goes."""
    before = rec.stage
    if rec.reservation:
        with contextlib.suppress(SlurmError):
            run.slurm(["scontrol", "delete", f"ReservationName={rec.reservation}"], "our hold ends")
        rec.reservation = ""
    rec.stage = "released"
    run.save(rec)
    run.log("release", "ok", before, "released", rec,
            f"{why} ({seen.state.state}{seen.state.flags}, {seen.state.reason or 'no reason'}): "
            "nodecert's hold ends")
    return 0


def after_reboot(run: Run, seen: Seen, rec: Record) -> int:
    """rebooting: wait for Slurm; once the node booted after the request, drain it for the
    verification (it is DOWN, or back in a maintenance reservation), drop the reservation and
    verify."""
    if seen.state.reboot_pending:
        run.log("wait", "reboot", "rebooting", "rebooting", rec,
                f"the reboot is {'issued' if '^' in seen.state.flags else 'pending'} "
                f"({seen.state.state}{seen.state.flags})")
        return 0
    booted = boot_time(run.node)
    if booted is None or booted < math.floor(rec.reboot_issued_at):
        if run.ours(seen.state.reason):
            run.log("wait", "reboot", "rebooting", "rebooting", rec, "no reboot yet")
            return 0
        return release(run, rec, seen, "the reboot was cancelled")
    reason = (f"{run.prefix}: VERIFY {rec.fault} after reboot {rec.attempt}/"
              f"{run.policy.repeat_limit}, level {rec.level}")
    cmd = run.set_reason(reason)
    if rec.reservation:
        run.slurm(["scontrol", "delete", f"ReservationName={rec.reservation}"],
                  "drained now: the reservation is no longer needed")
        rec.reservation = ""
    rec.stage, rec.reason = "verify", reason
    run.save(rec)
    run.log("rebooted", "ok", "rebooting", "verify", rec,
            f"booted {time.strftime('%H:%M:%S', time.localtime(booted))}", cmd)
    return verify(run, rec)
