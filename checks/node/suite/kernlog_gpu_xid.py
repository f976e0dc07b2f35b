"""xid-events (GPU005): NVRM Xid lines in this boot's kernel log, judged by checks/kernlog/xid.yaml
(NVIDIA's XID catalog, one row per XID with its source), and the driver's status lines that mean
a GPU needs a reset, has left the bus or is in a fatal state, with or without an Xid line
(checks/kernlog/nvstatus.yaml, from the driver's nvstatuscodes.h). Line formats and the public
reports they come from: docs/kernel-log.md."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from checks.hw.kernel_log import after_resets
from checks.kernlog import StatusRow, nvstatus_policy, xid_policy
from checks.model import Device, Result, fail, passed, warn
from checks.node.context import Context
from checks.node.registry import Budget, Cost, check
from checks.node.remedies import GPU_LOST
from checks.node.suite.kernel_errors import BDF, HEX, NEEDS, bounded, find, gpu_device, kernel_log, log_source

# --- xid-events -----------------------------------------------------------------------------

XID_RE = re.compile(rf"NVRM: Xid \((?:PCI:)?(?P<addr>(?:{HEX}{{4,5}}:)?{HEX}{{2}}:{HEX}{{2}})"
                    rf"(?:\.[0-7])?(?: [^)]{{0,64}})?\): (?P<xid>\d{{1,4}})\b(?:, ?(?P<text>.*))?")
# Any other Xid line: the address could not be read ("NVRM: Xid (PCI:0000:08:00/0000:09:00): 154
# ...", as a report abridged it). The event is still judged, for the node instead of one GPU.
XID_ANY_RE = re.compile(r"NVRM: Xid \((?P<raw>[^)]{0,128})\): (?P<xid>\d{1,4})\b(?:, ?(?P<text>.*))?")
# Probe-time loss, logged without an Xid line (NVIDIA/NVSentinel#155):
#   NVRM: The NVIDIA GPU 0000:b3:00.0 / NVRM: (PCI ID: 10de:26b5) installed in this system has /
#   NVRM: fallen off the bus and is not responding to commands.
PROBE_LOST_RE = re.compile(rf"NVRM: The NVIDIA GPU (?P<addr>{BDF})")
# The lost-GPU path of newer drivers logs one line and no Xid: "NVRM: GPU 0000:29:00.0: GPU has
# fallen off the bus." (counted as XID 79, the code the driver uses for the same loss).
FELL_OFF_RE = re.compile(rf"NVRM: GPU (?:PCI:)?(?P<addr>{BDF}): GPU has fallen off the bus")
RECOVERY_RE = re.compile(r"recovery action changed from 0x(?P<old>[0-9a-fA-F]{1,8}) "
                         r"\((?P<old_name>[^)]{0,64})\) to 0x(?P<new>[0-9a-fA-F]{1,8}) "
                         r"\((?P<new_name>[^)]{0,64})\)")
NVLINK5_SEVERITY_RE = re.compile(r"\b(non-?fatal|fatal)\b", re.IGNORECASE)
XID_FELL_OFF = 79


@dataclass
class _Seen:
    count: int = 0
    last: str = ""
    fatal: int = 0
    nonfatal: int = 0
    action: tuple[str, str] | None = None  # (hex code, name) of the latest XID 154 action
    reset_request: str = ""  # the driver's own "RST: Yes" / "D-RST: Yes" in a line, if any
    notes: set[str] = field(default_factory=set)
    unread: str = ""  # the address as logged, when it could not be read (the key's address is "")


def _count_loss(seen: dict[tuple[str, int], _Seen], address: str, line: str, note: str) -> None:
    entry = seen.setdefault((address.lower().rsplit(".", 1)[0], XID_FELL_OFF), _Seen())
    entry.count += 1
    entry.last = line
    entry.notes.add(note)


def scan_xids(lines: list[str]) -> dict[tuple[str, int], _Seen]:
    """(logged GPU address, XID) -> what was seen. Addresses are as logged: dddd:bb:dd or bb:dd."""
    seen: dict[tuple[str, int], _Seen] = {}
    probe, probe_left = "", 0  # a probe-time "The NVIDIA GPU <addr>" waiting for its last line
    for line in bounded(lines):
        match = XID_RE.search(line) or XID_ANY_RE.search(line)
        fell = None if match else FELL_OFF_RE.search(line)
        if fell:
            # Older drivers print it right after their Xid 79 line: one loss, not two.
            if (fell["addr"].lower().rsplit(".", 1)[0], XID_FELL_OFF) not in seen:
                _count_loss(seen, fell["addr"], line.strip(), "GPU lost (no Xid line)")
            continue
        if not match:
            lost = PROBE_LOST_RE.search(line)
            if lost:
                probe, probe_left = lost["addr"], 3
                line = line[lost.end():]  # the rest: the whole record can be on one line
            if probe and "fallen off the bus" in line:
                _count_loss(seen, probe, f"NVRM: The NVIDIA GPU {probe} ... {line.strip()}",
                            "lost at driver probe (no Xid line)")
                probe = ""
            elif probe and not lost:
                probe_left -= 1
                probe = probe if probe_left > 0 else ""
            continue
        address = match["addr"].lower() if "addr" in match.re.groupindex else ""
        key = (address, int(match["xid"]))
        entry = seen.setdefault(key, _Seen())
        if not address:
            entry.unread = match["raw"]
        entry.count += 1
        entry.last = line.strip()
        text = match["text"] or ""
        action = RECOVERY_RE.search(text)
        if action:
            entry.action = (action["new"], action["new_name"].strip())
        for token in xid_policy().driver_reset_request:
            if token in text:
                entry.reset_request = token
        severity = NVLINK5_SEVERITY_RE.search(text.split("(", 1)[0])
        if severity:
            if severity[1].lower().startswith("non"):
                entry.nonfatal += 1
            else:
                entry.fatal += 1
    return seen


# --- driver status lines -------------------------------------------------------------------

# The driver's assertion and check lines name the status and its code (nvassert.c prints the
# status text, then nvstatus.c appends the name): "NVRM: nvAssertOkFailedNoLog: Assertion failed:
# GPU lost from the bus [NV_ERR_GPU_IS_LOST] (0x0000000F) returned from rmStatus @ ...",
# "NVRM: nvCheckOkFailedNoLog: Check failed: Reset required [NV_ERR_RESET_REQUIRED] (0x00000062)
# returned from ...". An expression that merely mentions a status ("Assertion failed: (status ==
# NV_OK) || (status == NV_ERR_GPU_IN_FULLCHIP_RESET) @ ...") is not one and does not match.
STATUS_NAMED_RE = re.compile(r"\[(?P<name>NV_[A-Z0-9_]{1,64})\] \(0x(?P<code>[0-9a-fA-F]{1,8})\) "
                             r"returned from")
# RPC and call failures give the code only: "rpcSendMessage failed with status 0x0000000f for fn
# 76!", "GspRmFree failed: hClient=...; paramsStatus=0x00000000; status=0x0000000f", "TLB
# invalidation failed waiting for prior invalidate (status=0x0000000f)".
STATUS_WITH_RE = re.compile(r"failed with status 0x(?P<code>[0-9a-fA-F]{1,8})\b")
STATUS_EQ_RE = re.compile(r"(?<![A-Za-z])status=0x(?P<code>[0-9a-fA-F]{1,8})\b")
# "NVRM: GPU 0000:a1:00.0: RmInitAdapter failed! (0x62:0x40:2168)": the first number is the init
# step, the second the status (osinit.c), so 0x62 there is not NV_ERR_RESET_REQUIRED.
STATUS_INIT_RE = re.compile(r"RmInitAdapter failed! \(0x[0-9a-fA-F]{1,8}:0x(?P<code>[0-9a-fA-F]{1,8}):")
# Which GPU: "NVRM: GPU 0000:a1:00.0: ..." (PCI address) or "NVRM: GPU0 ..." (the driver's own
# instance number, in probe order: not nvidia-smi's index, so the result stays on the node).
STATUS_ADDR_RE = re.compile(rf"NVRM: GPU (?P<addr>{BDF}): ")
STATUS_INSTANCE_RE = re.compile(r"NVRM: GPU(?P<n>\d{1,3}) ")


@dataclass
class _StatusSeen:
    row: StatusRow
    count: int = 0
    last: str = ""
    forms: set[str] = field(default_factory=set)


def _logged_status(line: str) -> tuple[int | None, str | None, str] | None:
    """(code, name, form) of the status an NVRM failure line reports, None if it reports none."""
    if (match := STATUS_NAMED_RE.search(line)):
        return int(match["code"], 16), match["name"], "assertion/check"
    if "failed" not in line:
        return None
    for form, pattern in (("RPC", STATUS_WITH_RE), ("RmInitAdapter", STATUS_INIT_RE),
                          ("call", STATUS_EQ_RE)):
        if (match := pattern.search(line)):
            return int(match["code"], 16), None, form
    return None


def scan_statuses(lines: list[str]) -> dict[tuple[str, str], _StatusSeen]:
    """(where, status name) -> what was seen, for the statuses whose row carries a remedy.
    `where` is the logged PCI address, "GPU<n>" (the driver's instance number) or "" (none)."""
    policy = nvstatus_policy()
    seen: dict[tuple[str, str], _StatusSeen] = {}
    for line in bounded(lines):
        if "NVRM" not in line:
            continue
        logged = _logged_status(line)
        row = policy.judged(logged[0], logged[1]) if logged else None
        if row is None or logged is None:
            continue
        addr = STATUS_ADDR_RE.search(line)
        instance = None if addr else STATUS_INSTANCE_RE.search(line)
        where = addr["addr"].lower() if addr else f"GPU{instance['n']}" if instance else ""
        entry = seen.setdefault((where, row.name), _StatusSeen(row))
        entry.count += 1
        entry.last = line.strip()
        entry.forms.add(logged[2])
    return seen


def _status_results(ctx: Context, seen: dict[tuple[str, str], _StatusSeen],
                    source: dict[str, Any]) -> Iterator[Result]:
    policy = nvstatus_policy()
    for (where, name), entry in sorted(seen.items()):
        kind = policy.remedies[entry.row.remedy]
        bus_device = find(where, ctx.pci_gpus) if ":" in where else None
        device = (gpu_device(ctx, bus_device.address) if bus_device
                  else Device(pci=where) if ":" in where else None)
        label = (device.pci if device else f"the driver's {where} (no PCI address in the line)"
                 if where else "this node (no GPU named in the line)")
        details: dict[str, Any] = {
            "status": name, "code": f"0x{entry.row.code:08X}", "count": entry.count,
            "last": entry.last, "forms": sorted(entry.forms), "remedy_kind": entry.row.remedy,
            "why": entry.row.why, **source}
        if where and device is None:
            details["gpu_instance"] = where
        yield fail(f"driver status {name} (0x{entry.row.code:08X}) x{entry.count} on {label}: "
                   f"{kind.meaning}", value=name, device=device, details=details,
                   expected="no driver status of a GPU that needs a reset, left the bus or failed",
                   remedy=kind.text)


def _action_remedy(name: str) -> str:
    low = name.lower()
    if "reboot" in low:
        return "drain the node and reboot it (the driver asks for a node reboot), then re-verify"
    if "drain" in low and "reset" in low:
        return ("drain the node: stop the jobs using this GPU (P2P included), reset the GPU "
                "(nvidia-smi -r -i N) and re-verify")
    if "drain" in low:
        return "stop jobs that use peer-to-peer access to this GPU, then re-verify"
    if "reset" in low or "flr" in low:
        return "drain the node, reset the GPU (nvidia-smi -r -i N) or reboot, re-verify"
    return f"follow NVIDIA's recovery action '{name}' (XID catalogue), then re-verify"


REMEDY_HW = ("drain the node; reset the GPU (nvidia-smi -r -i N) or reboot as NVIDIA's XID "
             "catalogue directs, re-verify; if it recurs, RMA (quote the serial)")
REMEDY_FELL_OFF = GPU_LOST
REMEDY_SW = ("usually a job fault (bad memory access, killed process); look at the job that ran "
             "at that time")


def _unclassified(xid: int) -> str:
    return f"XID {xid} is not in NVIDIA's catalog as shipped (checks/kernlog/xid.yaml): a newer driver?"


@check("xid-events", code="GPU005", title="no hardware XID events since boot", needs=NEEDS,
       budget=Budget(value=10, cost=Cost(cpu=1, gpu=2), source="measured cpu"))
def xid_events(ctx: Context) -> Iterator[Result]:
    """Scans this boot's kernel log for NVRM Xid lines (4- or 5-hex-digit PCI domains, with or
    without the domain, MIG suffixes) and names each GPU by its full PCI address. Each XID is
    judged by NVIDIA's XID catalog (checks/kernlog/xid.yaml): an immediate action of GPU reset,
    restart or hardware check fails, restart-the-application or ignore warns (and fails when the
    line carries the driver's own 'RST: Yes'); NVLink5 XIDs fail when the line says Fatal; XID
    154 reports the recovery action the driver asks for; unknown XIDs warn; an Xid line whose
    address cannot be read is judged for the node. Driver status lines (assertion, check, RPC)
    whose status means the GPU needs a reset, left the bus or failed (checks/kernlog/nvstatus.yaml)
    fail with that status's remedy, with or without an Xid line. ERROR when no log source can be
    read."""
    policy = xid_policy()
    # a reset GPU's lines from before its reset are the fault the reset cured (reset markers)
    lines, reset = after_resets(kernel_log(ctx))
    source = log_source(ctx, lines) | (reset or {})
    seen = scan_xids(lines)
    statuses = scan_statuses(lines)
    if not seen and not statuses:
        yield passed(f"no XID events and no driver status of a lost, reset-needing or failed GPU "
                     f"in the kernel log since boot ({source['source']})", value=0, details=source)
        return
    yield from _status_results(ctx, statuses, source)
    gpus = ctx.pci_gpus
    for (logged, xid), entry in sorted(seen.items()):
        bus_device = find(logged, gpus) if logged else None
        device: Device | None = (gpu_device(ctx, bus_device.address) if bus_device
                                 else Device(pci=logged) if logged else None)
        where = device.pci if device else f"this node (no GPU address in '({entry.unread})')"
        row = policy.rows.get(xid)
        details: dict[str, Any] = {"xid": xid, "count": entry.count, "last": entry.last,
                                   "logged_address": logged or entry.unread, **source}
        if row is not None:
            details["catalog"] = {"name": row.name, "action": row.action or None,
                                  "verdict": row.verdict, "source": row.source}
        if bus_device is None and logged:
            details["on_bus"] = False
        if entry.notes:
            details["notes"] = sorted(entry.notes)
        times = f"x{entry.count}"
        label = f"{row.name}, " if row is not None else ""
        verdict = row.verdict if row is not None else "WARN"
        if verdict == "RECOVERY_ACTION" and entry.action:
            code, name = entry.action
            details["recovery_action"] = {"code": f"0x{code}", "name": name}
            if name.lower() == "none":
                yield warn(f"XID {xid} on {where}: GPU recovery action back to None {times}",
                           value=xid, device=device, details=details,
                           remedy="no action needed now; look at the XIDs logged before it")
            else:
                yield fail(f"XID {xid} on {where}: the driver asks for '{name}' (0x{code}) "
                           f"{times}", value=xid, device=device, details=details,
                           expected="no recovery action pending", remedy=_action_remedy(name))
        elif verdict == "BY_SEVERITY":
            details.update(fatal=entry.fatal, nonfatal=entry.nonfatal)
            kind = "fatal" if entry.fatal else "non-fatal" if entry.nonfatal else "severity not logged"
            message = f"XID {xid} ({label}NVLink5, {kind}) {times} on {where}"
            if entry.fatal:
                yield fail(message, value=xid, device=device, details=details,
                           expected="no fatal NVLink XID", remedy=REMEDY_HW)
            else:
                yield warn(message, value=xid, device=device, details=details,
                           remedy="watch the link; reset the GPU if NVLink traffic stalls, and "
                                  "look for a fatal XID or SXid on the same link")
        elif verdict == "FAIL" or entry.reset_request:
            why = (f"the driver asks for a reset: {entry.reset_request}" if verdict != "FAIL"
                   else f"catalog action {row.action}" if row is not None and row.action
                   else "reset needed")
            details["reset_request"] = entry.reset_request or None
            remedy = REMEDY_FELL_OFF if xid == XID_FELL_OFF else REMEDY_HW
            yield fail(f"XID {xid} ({label}{why}) {times} on {where}", value=xid, device=device,
                       details=details, expected="no XID whose action is a reset or restart",
                       remedy=remedy)
        else:
            why = (f"catalog action {row.action or 'none'}" if row is not None
                   else _unclassified(xid))
            yield warn(f"XID {xid} ({label}{why}) {times} on {where}", value=xid, device=device,
                       details=details, remedy=REMEDY_SW if row is not None else
                       "look the XID up in NVIDIA's current XID catalog")
