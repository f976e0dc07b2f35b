"""This boot's kernel log, scanned for GPU XIDs, NVSwitch SXids and PCIe AER errors.

The three checks read `ctx.hw.kernel_log()` once per run (cached per Context): a log that
cannot be read is an ERROR in each of them, never "no events". Classification lives in the
profile (xid.*, sxid.*, aer.*); the line formats, with the public reports they come from, are in
docs/kernel-log.md and tests/framework/test_kernlog.py.
"""

from __future__ import annotations

import re
import threading
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from checks.hw.base import HardwareError, PciDevice
from checks.model import Device, Result, fail, passed, skip, warn
from checks.node.context import Context
from checks.node.registry import check

NEEDS = ("pci-gpus",)  # readable without the driver; SKIP (with its reason) on a GPU-less host
_HEX = "[0-9a-fA-F]"
# A PCI function as the kernel prints it: 4-hex-digit domain, or 5 for VMD domains (10000:e1:00.0).
BDF = rf"{_HEX}{{4,5}}:{_HEX}{{2}}:{_HEX}{{2}}\.[0-7]"

# --- reading once per run ------------------------------------------------------------------

_CACHE: weakref.WeakKeyDictionary[Context, tuple[list[str] | None, str | None]] = (
    weakref.WeakKeyDictionary())
_LOCK = threading.Lock()
LOCK_WAIT_S = 120.0  # an abandoned (hung) read must not hang the next check too


def kernel_log(ctx: Context) -> list[str]:
    """This run's kernel log; a read that failed fails again with the same message."""
    if not _LOCK.acquire(timeout=LOCK_WAIT_S):
        raise HardwareError("an earlier check's kernel log read is still running (hung)")
    try:
        if ctx not in _CACHE:
            try:
                _CACHE[ctx] = (ctx.hw.kernel_log(), None)
            except HardwareError as exc:
                _CACHE[ctx] = (None, str(exc))
        lines, failure = _CACHE[ctx]
    finally:
        _LOCK.release()
    if failure is not None:
        raise HardwareError(failure)
    assert lines is not None
    return lines


def log_source(ctx: Context, lines: list[str]) -> dict[str, Any]:
    """Which source answered (and why the ones before it did not), for the result details."""
    info: dict[str, Any] = {"source": getattr(lines, "source", f"the {ctx.hw.name} backend"),
                            "lines": len(lines)}
    if getattr(lines, "skipped", None):
        info["skipped"] = list(lines.skipped)  # type: ignore[attr-defined]
    return info


# --- PCI addresses ---------------------------------------------------------------------------

def _parse_address(text: str) -> tuple[int | None, int, int, int | None]:
    """(domain, bus, device, function) of "dddd:bb:dd[.f]" or "bb:dd[.f]"; None where absent."""
    head, _, function = text.partition(".")
    parts = head.split(":")
    domain = int(parts[0], 16) if len(parts) == 3 else None
    return domain, int(parts[-2], 16), int(parts[-1], 16), int(function) if function else None


def _same(logged: str, device: PciDevice) -> bool:
    dom, bus, dev, fn = _parse_address(logged)
    d_dom, d_bus, d_dev, d_fn = _parse_address(device.address)
    return ((dom is None or dom == d_dom) and bus == d_bus and dev == d_dev
            and (fn is None or fn == d_fn))


def _find(logged: str, devices: list[PciDevice]) -> PciDevice | None:
    """The one device the logged address names; None when none or several (no domain) match."""
    hits = [d for d in devices if _same(logged, d)]
    return hits[0] if len(hits) == 1 else None


def _gpu_device(ctx: Context, address: str) -> Device:
    """Device with index/UUID/serial when NVML was already read this run; never calls NVML
    itself (a hung GPU hangs NVML, and this check must still report it)."""
    for gpu in ctx.__dict__.get("gpus") or []:
        if gpu.device.pci == address:
            return gpu.device
    return Device(pci=address)


# --- xid-events -----------------------------------------------------------------------------

XID_RE = re.compile(rf"NVRM: Xid \((?:PCI:)?(?P<addr>(?:{_HEX}{{4,5}}:)?{_HEX}{{2}}:{_HEX}{{2}})"
                    rf"(?:\.[0-7])?(?: [^)]*)?\): (?P<xid>\d+)(?:, ?(?P<text>.*))?")
# Probe-time loss, logged without an Xid line (NVIDIA/NVSentinel#155):
#   NVRM: The NVIDIA GPU 0000:b3:00.0 / NVRM: (PCI ID: 10de:26b5) installed in this system has /
#   NVRM: fallen off the bus and is not responding to commands.
PROBE_LOST_RE = re.compile(rf"NVRM: The NVIDIA GPU (?P<addr>{BDF})")
RECOVERY_RE = re.compile(r"recovery action changed from 0x(?P<old>[0-9a-fA-F]+) \((?P<old_name>[^)]*)\)"
                         r" to 0x(?P<new>[0-9a-fA-F]+) \((?P<new_name>[^)]*)\)")
NVLINK5_SEVERITY_RE = re.compile(r"\b(non-?fatal|fatal)\b", re.IGNORECASE)
XID_FELL_OFF = 79


@dataclass
class _Seen:
    count: int = 0
    last: str = ""
    fatal: int = 0
    nonfatal: int = 0
    action: tuple[str, str] | None = None  # (hex code, name) of the latest XID 154 action
    notes: set[str] = field(default_factory=set)


def scan_xids(lines: list[str]) -> dict[tuple[str, int], _Seen]:
    """(logged GPU address, XID) -> what was seen. Addresses are as logged: dddd:bb:dd or bb:dd."""
    seen: dict[tuple[str, int], _Seen] = {}
    probe, probe_left = "", 0  # a probe-time "The NVIDIA GPU <addr>" waiting for its last line
    for line in lines:
        if probe:
            if "fallen off the bus" in line:
                entry = seen.setdefault((probe.rsplit(".", 1)[0], XID_FELL_OFF), _Seen())
                entry.count += 1
                entry.last = f"NVRM: The NVIDIA GPU {probe} ... {line.strip()}"
                entry.notes.add("lost at driver probe (no Xid line)")
                probe = ""
                continue
            probe_left -= 1
            probe = probe if probe_left > 0 else ""
        lost = PROBE_LOST_RE.search(line)
        if lost:
            probe, probe_left = lost["addr"], 3
            continue
        match = XID_RE.search(line)
        if not match:
            continue
        key = (match["addr"].lower(), int(match["xid"]))
        entry = seen.setdefault(key, _Seen())
        entry.count += 1
        entry.last = line.strip()
        text = match["text"] or ""
        action = RECOVERY_RE.search(text)
        if action:
            entry.action = (action["new"], action["new_name"].strip())
        severity = NVLINK5_SEVERITY_RE.search(text.split("(", 1)[0])
        if severity:
            if severity[1].lower().startswith("non"):
                entry.nonfatal += 1
            else:
                entry.fatal += 1
    return seen


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
REMEDY_FELL_OFF = ("the GPU left the PCIe bus: drain and reboot the node (a GPU reset cannot reach "
                   "it), check the pcie-aer result for this slot, reseat or RMA if it recurs")
REMEDY_SW = ("usually a job fault (bad memory access, killed process); look at the job that ran "
             "at that time")


@check("xid-events", code="GPU005", title="no hardware XID events since boot", needs=NEEDS)
def xid_events(ctx: Context) -> Iterator[Result]:
    """Scans this boot's kernel log for NVRM Xid lines (4- or 5-hex-digit PCI domains, with or
    without the domain) and names each GPU by its full PCI address. XIDs in xid.hardware fail,
    xid.software and unknown ones warn; NVLink5 XIDs (xid.nvlink5) fail when the line says
    Fatal; XID 154 reports the recovery action the driver asks for. ERROR when no log source
    can be read."""
    p = ctx.profile
    hardware = {int(x) for x in p.get("xid.hardware", [])}
    software = {int(x) for x in p.get("xid.software", [])}
    nvlink5 = {int(x) for x in p.get("xid.nvlink5", [])}
    recovery = p.get("xid.recovery_action")
    lines = kernel_log(ctx)
    source = log_source(ctx, lines)
    seen = scan_xids(lines)
    if not seen:
        yield passed(f"no XID events in the kernel log since boot ({source['source']})", value=0,
                     details=source)
        return
    gpus = ctx.pci_gpus
    for (logged, xid), entry in sorted(seen.items()):
        bus_device = _find(logged, gpus)
        device = _gpu_device(ctx, bus_device.address) if bus_device else Device(pci=logged)
        where = device.pci
        details: dict[str, Any] = {"xid": xid, "count": entry.count, "last": entry.last,
                                   "logged_address": logged, **source}
        if bus_device is None:
            details["on_bus"] = False
        if entry.notes:
            details["notes"] = sorted(entry.notes)
        times = f"x{entry.count}"
        if recovery is not None and xid == int(recovery) and entry.action:
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
        elif xid in nvlink5:
            details.update(fatal=entry.fatal, nonfatal=entry.nonfatal)
            kind = "fatal" if entry.fatal else "non-fatal" if entry.nonfatal else "severity not logged"
            message = f"XID {xid} (NVLink5, {kind}) {times} on {where}"
            if entry.fatal:
                yield fail(message, value=xid, device=device, details=details,
                           expected="no fatal NVLink XID", remedy=REMEDY_HW)
            else:
                yield warn(message, value=xid, device=device, details=details,
                           remedy="watch the link; reset the GPU if NVLink traffic stalls, and "
                                  "look for a fatal XID or SXid on the same link")
        elif xid in hardware:
            remedy = REMEDY_FELL_OFF if xid == XID_FELL_OFF else REMEDY_HW
            yield fail(f"XID {xid} (hardware) {times} on {where}", value=xid, device=device,
                       details=details, expected="no hardware XID", remedy=remedy)
        else:
            kind = "software/application" if xid in software else "unclassified"
            yield warn(f"XID {xid} ({kind}) {times} on {where}", value=xid, device=device,
                       details=details, remedy=REMEDY_SW)


# --- nvswitch-sxid --------------------------------------------------------------------------

# "nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Non-fatal, Link 44 Minion Link DLREQ
# interrupt"; the same code then logs "Severity 0 Engine instance ..." and "Data {...}" lines.
SXID_RE = re.compile(rf"nvidia-nvswitch(?P<switch>\d+): SXid \(PCI:(?P<addr>{BDF})\): "
                     rf"(?P<code>\d+), (?P<rest>.*)")


@dataclass
class _SxidSeen:
    switch: str
    fatal: int = 0
    nonfatal: int = 0
    detail_lines: int = 0
    last: str = ""
    what: str = ""


def scan_sxids(lines: list[str]) -> dict[tuple[str, int], _SxidSeen]:
    """(NVSwitch address, SXid) -> counts by the severity the driver printed."""
    seen: dict[tuple[str, int], _SxidSeen] = {}
    for line in lines:
        match = SXID_RE.search(line)
        if not match:
            continue
        entry = seen.setdefault((match["addr"].lower(), int(match["code"])),
                                _SxidSeen(switch=f"nvidia-nvswitch{match['switch']}"))
        rest = match["rest"].strip()
        severity, _, what = rest.partition(",")
        if severity.strip().lower() == "fatal":
            entry.fatal += 1
        elif severity.strip().lower() in ("non-fatal", "nonfatal"):
            entry.nonfatal += 1
        else:
            entry.detail_lines += 1
            entry.last = entry.last or line.strip()
            continue
        entry.last, entry.what = line.strip(), what.strip()
    return seen


REMEDY_SXID_FATAL = ("drain the node: a fatal NVSwitch error needs the GPUs and NVSwitches reset "
                     "(reboot), then re-verify; if it recurs on the same switch or link, open a "
                     "case with the system vendor")


@check("nvswitch-sxid", code="GPU013", title="no fatal NVSwitch SXid errors since boot",
       needs=NEEDS)
def nvswitch_sxid(ctx: Context) -> Iterator[Result]:
    """Scans this boot's kernel log for NVSwitch SXid lines: a Fatal one fails naming the
    NVSwitch's PCI address (as does a code in sxid.fatal whose severity line is missing);
    non-fatal ones above sxid.nonfatal_warn warn. SKIP without NVSwitch and without SXid lines;
    ERROR when no log source can be read."""
    nonfatal_warn = int(ctx.profile.require("sxid.nonfatal_warn"))
    known_fatal = {int(x) for x in ctx.profile.get("sxid.fatal", [])}
    switches = ctx.nvswitches
    lines = kernel_log(ctx)
    source = log_source(ctx, lines)
    seen = scan_sxids(lines)
    if not seen:
        if not switches:
            yield skip("no NVSwitch on the PCI bus and no SXid lines in the kernel log")
            return
        yield passed(f"no SXid events from {len(switches)} NVSwitch(es) since boot "
                     f"({source['source']})", value=0, details=source)
        return
    for (address, code), entry in sorted(seen.items()):
        on_bus = _find(address, switches)
        device = Device(pci=on_bus.address if on_bus else address, name=entry.switch)
        details: dict[str, Any] = {"sxid": code, "fatal": entry.fatal, "nonfatal": entry.nonfatal,
                                   "last": entry.last, **source}
        if on_bus is None:
            details["on_bus"] = False
        what = f" ({entry.what})" if entry.what else ""
        if entry.fatal:
            yield fail(f"fatal SXid {code} x{entry.fatal} on NVSwitch {device.pci}{what}",
                       value=code, device=device, details=details, expected="no fatal SXid",
                       remedy=REMEDY_SXID_FATAL)
        elif not entry.nonfatal and code in known_fatal:
            yield fail(f"SXid {code} on NVSwitch {device.pci}: a fatal code (sxid.fatal), its "
                       "severity line is not in the log", value=code, device=device,
                       details=details, expected="no fatal SXid", remedy=REMEDY_SXID_FATAL)
        elif not entry.nonfatal:
            yield warn(f"SXid {code} on NVSwitch {device.pci}: severity not in the log",
                       value=code, device=device, details=details,
                       remedy="look up the SXid in NVIDIA's Fabric Manager user guide")
        elif entry.nonfatal > nonfatal_warn:
            yield warn(f"non-fatal SXid {code} x{entry.nonfatal} on NVSwitch {device.pci}{what}",
                       value=code, device=device, details=details,
                       expected=f"<= {nonfatal_warn} non-fatal",
                       remedy="watch the link's counters; repeated non-fatal errors on one link "
                              "point at the cable, connector or baseboard")
        else:
            yield passed(f"{entry.nonfatal} non-fatal SXid {code} on NVSwitch {device.pci}",
                         value=code, device=device, details=details,
                         expected=f"<= {nonfatal_warn} non-fatal")


# --- pcie-aer -------------------------------------------------------------------------------

_SEVERITY = r"Corrected|Correctable|Uncorrected \((?:Non-Fatal|Fatal)\)"
# Root port: "pcieport 0000:00:01.0: AER: Corrected error received: 0000:3b:00.0",
# "... AER: Multiple Uncorrected (Fatal) error received: 0000:00:03.0", older kernels
# "... AER: Corrected error received: id=0010", newer "... Correctable error message received
# from 0000:00:00.0".
RECEIVED_RE = re.compile(rf"(?P<port>{BDF}): AER: (?:Multiple )?(?P<sev>{_SEVERITY}) error "
                         rf"(?:message )?received(?: from)?:? (?:(?P<src>{BDF})|id=(?P<id>{_HEX}{{4}}))")
# The device that logged it: "nvidia 0000:3b:00.0: PCIe Bus Error: severity=Corrected,
# type=Physical Layer, (Receiver ID)" (newer kernels put "AER: " before "PCIe Bus Error").
BUS_ERROR_RE = re.compile(rf"(?P<driver>\S+) (?P<dev>{BDF}): (?:AER: )?PCIe Bus Error: "
                          rf"severity=(?P<sev>{_SEVERITY})(?:, type=(?P<type>[^,]+))?")
# pcie_print_link_status(): "mlx5_core 0000:3b:00.0: 63.008 Gb/s available PCIe bandwidth,
# limited by 8.0 GT/s PCIe x8 link at 0000:3a:00.0 (capable of 126.016 Gb/s with 8.0 GT/s PCIe
# x16 link)".
BANDWIDTH_RE = re.compile(rf"(?P<driver>\S+) (?P<dev>{BDF}): [\d.]+ Gb/s available PCIe bandwidth,"
                          rf" limited by (?P<speed>[\d.]+ GT/s)(?: PCIe)? x(?P<width>\d+) link at "
                          rf"(?P<at>{BDF}|<unknown>) \(capable of [\d.]+ Gb/s with "
                          rf"(?P<cap_speed>[\d.]+ GT/s)(?: PCIe)? x(?P<cap_width>\d+) link\)")
AER_ON_RE = re.compile(r"AER: enabled with IRQ|_OSC: OS now controls \[[^\]]*\bAER\b")
AER_FIRMWARE_RE = re.compile(r"_OSC: platform does not support \[[^\]]*\bAER\b")


AER_KINDS = ("corrected", "nonfatal", "fatal")
# During recovery from an uncorrected error the kernel names each device below the port:
# "nvidia 0000:02:00.0: device has no AER-aware driver" (wilicc/gpu-burn#1), "nvidia
# 0000:03:00.0: AER: can't recover (no error_detected callback)" (rwth-i6/returnn#1500).
BELOW_PORT_RE = re.compile(rf"(?P<dev>{BDF}): (?:AER: )?(?:can't recover|device has no AER-aware "
                           rf"driver|broadcast \w+ message)")


def _kind(severity: str) -> str:
    return "corrected" if severity.startswith("Correct") else (
        "fatal" if "(Fatal)" in severity else "nonfatal")


def _requester(port: str, requester_id: str) -> str:
    """Old kernels name the source by requester ID (bus << 8 | device << 3 | function) on the
    reporting port's PCI domain."""
    rid = int(requester_id, 16)
    domain = port.split(":", 1)[0]
    return f"{domain}:{rid >> 8:02x}:{(rid >> 3) & 0x1F:02x}.{rid & 7}"


@dataclass
class _AerSeen:
    driver: str = ""
    counts: dict[str, int] = field(default_factory=lambda: {"corrected": 0, "nonfatal": 0,
                                                             "fatal": 0})
    last: str = ""
    link: str = ""  # a "limited by" line: narrower (or slower) than the device can do


@dataclass
class AerScan:
    devices: dict[str, _AerSeen] = field(default_factory=dict)
    below: dict[str, str] = field(default_factory=dict)  # device -> root port that reported it
    aer_on: bool = False
    firmware_first: bool = False


def scan_aer(lines: list[str]) -> AerScan:
    scan = AerScan()
    received: list[tuple[str, str, str]] = []  # (source device, kind, line) from root ports
    recovering = ""  # root port of the last uncorrected error: devices named next are below it
    for line in lines:
        if AER_ON_RE.search(line):
            scan.aer_on = True
        if AER_FIRMWARE_RE.search(line):
            scan.firmware_first = True
        if (match := BUS_ERROR_RE.search(line)):
            entry = scan.devices.setdefault(match["dev"].lower(), _AerSeen())
            entry.driver = match["driver"]
            entry.counts[_kind(match["sev"])] += 1
            entry.last = line.strip()
        elif (match := RECEIVED_RE.search(line)):
            port = match["port"].lower()
            src = match["src"].lower() if match["src"] else _requester(port, match["id"])
            if src != port:
                scan.below[src] = port
            received.append((src, _kind(match["sev"]), line.strip()))
            recovering = port if _kind(match["sev"]) != "corrected" else recovering
        elif recovering and (match := BELOW_PORT_RE.search(line)):
            if match["dev"].lower() != recovering:
                scan.below[match["dev"].lower()] = recovering
        elif (match := BANDWIDTH_RE.search(line)):
            entry = scan.devices.setdefault(match["dev"].lower(), _AerSeen())
            entry.driver = entry.driver or match["driver"]
            narrow = int(match["width"]) < int(match["cap_width"])
            slow = match["speed"] != match["cap_speed"]
            if narrow or slow:
                entry.link = (f"x{match['width']} at {match['speed']} (capable of "
                              f"x{match['cap_width']} at {match['cap_speed']}), limited at "
                              f"{match['at']}")
                entry.last = entry.last or line.strip()
                entry.counts.setdefault("narrow", 0)
                entry.counts["narrow"] += int(narrow)
    # A root port's "received" line without any device line for that source (rate-limited
    # or cut): count it against the source so the event is not lost.
    logged = {a for a, e in scan.devices.items() if any(e.counts[k] for k in AER_KINDS)}
    for src, kind, line in received:
        if src not in logged:
            entry = scan.devices.setdefault(src, _AerSeen())
            entry.counts[kind] += 1
            entry.last = entry.last or line
    return scan


def _role(ctx: Context, address: str, scan: AerScan) -> tuple[str, PciDevice | None]:
    """'gpu', 'nvswitch', 'upstream' (a bridge above one of them) or 'other', and the GPU or
    NVSwitch concerned."""
    critical = [*ctx.pci_gpus, *ctx.nvswitches]
    device = _find(address, critical)
    if device is not None:
        return ("gpu" if device.is_nvidia_gpu else "nvswitch"), device
    for dev in critical:
        if any(_same(address, PciDevice(b, 0, 0, 0)) for b in dev.pci_path):
            return "upstream", dev
    for child, port in scan.below.items():
        below = _find(child, critical) if port == address else None
        if below is not None:
            return "upstream", below
    return "other", None


REMEDY_AER_UNCORRECTED = ("drain the node; an uncorrected PCIe error on a GPU's link usually "
                          "precedes XID 79: reseat the GPU/riser/cable, check the slot, update "
                          "the BIOS; RMA the GPU or baseboard if it recurs")
REMEDY_AER_CORRECTED = ("reseat the device or its riser/cable; corrected errors that keep "
                        "rising mean a marginal link that will start replaying under load")


@check("pcie-aer", code="GPU014", title="no uncorrected PCIe AER errors on GPUs since boot",
       needs=NEEDS)
def pcie_aer(ctx: Context) -> Iterator[Result]:
    """Scans this boot's kernel log for PCIe AER lines and attributes each to the device named:
    uncorrected errors on a GPU, an NVSwitch or a bridge above them fail, on other devices
    warn; corrected errors above aer.corrected_warn (DCGM's 80 PCIe replays) per device warn; a
    link the kernel reports narrower than the device supports warns. With nothing found, SKIP
    unless the log shows the kernel enabling AER (firmware-first platforms log elsewhere);
    ERROR when no log source can be read."""
    corrected_warn = int(ctx.profile.require("aer.corrected_warn"))
    lines = kernel_log(ctx)
    source = log_source(ctx, lines)
    scan = scan_aer(lines)
    problems = 0
    for address, entry in sorted(scan.devices.items()):
        role, concerned = _role(ctx, address, scan)
        counts = {k: v for k, v in entry.counts.items() if v}
        uncorrected = entry.counts["fatal"] + entry.counts["nonfatal"]
        details: dict[str, Any] = {"device": address, "driver": entry.driver, "role": role,
                                   "counts": counts, "last": entry.last, **source}
        if concerned is not None and role == "upstream":
            details["above"] = concerned.address
        if entry.link:
            details["link"] = entry.link
        what = {"gpu": f"GPU {address}", "nvswitch": f"NVSwitch {address}",
                "upstream": f"PCIe port {address} above "
                            f"{'GPU' if concerned and concerned.is_nvidia_gpu else 'NVSwitch'} "
                            f"{concerned.address if concerned else ''}",
                "other": f"{entry.driver or 'device'} {address}"}[role]
        device = (_gpu_device(ctx, concerned.address) if concerned and concerned.is_nvidia_gpu
                  else Device(pci=concerned.address if concerned else address,
                              name=None if concerned else entry.driver or None))
        counted = ", ".join(f"{v} {k}" for k, v in counts.items() if k != "narrow")
        if uncorrected and role != "other":
            problems += 1
            yield fail(f"uncorrected PCIe error(s) on {what}: {counted}", value=uncorrected,
                       device=device, details=details, expected="no uncorrected AER error",
                       remedy=REMEDY_AER_UNCORRECTED)
        elif uncorrected:
            problems += 1
            yield warn(f"uncorrected PCIe error(s) on {what}: {counted}", value=uncorrected,
                       device=device, details=details, expected="no uncorrected AER error",
                       remedy="check that device's own health (link, firmware); reseat it")
        elif entry.counts["corrected"] > corrected_warn:
            problems += 1
            yield warn(f"{entry.counts['corrected']} corrected PCIe errors on {what}",
                       value=entry.counts["corrected"], device=device, details=details,
                       expected=f"<= {corrected_warn} per device", remedy=REMEDY_AER_CORRECTED)
        elif entry.link and (entry.counts.get("narrow") or role == "other"):
            # A GPU's link trains slow at idle (power saving), so only width counts for GPUs.
            problems += 1
            yield warn(f"{what} link limited: {entry.link}", value=entry.link, device=device,
                       details=details, expected="the link the device supports",
                       remedy="reseat the card or its riser/cable; check the slot's width and "
                              "speed settings in the BIOS")
    if problems:
        return
    seen = {a: e.counts["corrected"] for a, e in scan.devices.items() if e.counts["corrected"]}
    summary = (f"{sum(seen.values())} corrected PCIe error(s) on {len(seen)} device(s), each "
               f"<= {corrected_warn}" if seen else "no PCIe AER errors")
    if seen or scan.aer_on:
        yield passed(f"{summary} in the kernel log since boot ({source['source']})",
                     value=sum(seen.values()), details={**source, "corrected": seen})
    elif scan.firmware_first:
        yield skip("the platform kept PCIe error reporting (_OSC: platform does not support "
                   "[AER]): errors go to the BMC/SEL, not this log")
    else:
        yield skip(f"{summary}, but this boot's log ({source['source']}) does not show the "
                   "kernel enabling AER, so errors might not be logged here")
