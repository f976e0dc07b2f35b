"""pcie-aer (GPU014): PCIe AER lines in this boot's kernel log, in the wording of kernels before
6.8 ("Corrected", "Uncorrected (Fatal)") and after ("Correctable", "Uncorrectable (Fatal)"), each
attributed to a GPU, an NVSwitch, a bridge above them, or another device."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from checks.hw.base import PciDevice
from checks.hw.kernel_log import after_resets
from checks.kernlog import aer_policy
from checks.model import Device, Result, fail, passed, skip, warn
from checks.node.context import Context
from checks.node.registry import Budget, Cost, check
from checks.node.suite.kernel_errors import (
    BDF,
    HEX,
    NEEDS,
    bounded,
    find,
    gpu_device,
    kernel_log,
    log_source,
    same,
)

# --- pcie-aer -------------------------------------------------------------------------------

# Kernels before 6.8 print "Corrected", "Uncorrected (Non-Fatal)", "Uncorrected (Fatal)"; 6.8 took
# the spec's terms: "Correctable", "Uncorrectable (Non-Fatal)", "Uncorrectable (Fatal)". Both are
# read; the words and what each kind means per device are data (checks/kernlog/aer.yaml).
_SEVERITY = "|".join(re.escape(word) for word in sorted(aer_policy().words, key=len, reverse=True))
# Root port: "pcieport 0000:00:01.0: AER: Corrected error received: 0000:3b:00.0",
# "... AER: Multiple Uncorrected (Fatal) error received: 0000:00:03.0", older kernels
# "... AER: Corrected error received: id=0010", newer "... Correctable error message received
# from 0000:00:00.0". A line with no source after "received" ("pcieport 0000:00:02.0: AER: Multiple
# Uncorrectable (Non-Fatal) error message received", as a V100 incident report quotes it) is the
# port's own: counted against the port, and the devices named in the recovery after it are below it.
RECEIVED_RE = re.compile(rf"(?P<port>{BDF}): AER: (?:Multiple )?(?P<sev>{_SEVERITY}) error "
                         rf"(?:message )?received(?:(?: from)?:? (?:(?P<src>{BDF})|id=(?P<id>{HEX}{{4}})))?")
# "pcieport 0000:80:1b.4: AER: device recovery failed": the port and what is below it stay broken.
RECOVERY_FAILED_RE = re.compile(rf"(?P<port>{BDF}): AER: device recovery failed")
# The device that logged it: "nvidia 0000:3b:00.0: PCIe Bus Error: severity=Corrected,
# type=Physical Layer, (Receiver ID)" (newer kernels put "AER: " before "PCIe Bus Error").
BUS_ERROR_RE = re.compile(rf"(?<!\S)(?P<driver>\S{{1,64}}) (?P<dev>{BDF}): (?:AER: )?PCIe Bus "
                          rf"Error: "
                          rf"severity=(?P<sev>{_SEVERITY})(?:, type=(?P<type>[^,]+))?")
# pcie_print_link_status(): "mlx5_core 0000:3b:00.0: 63.008 Gb/s available PCIe bandwidth,
# limited by 8.0 GT/s PCIe x8 link at 0000:3a:00.0 (capable of 126.016 Gb/s with 8.0 GT/s PCIe
# x16 link)".
BANDWIDTH_RE = re.compile(rf"(?<!\S)(?P<driver>\S{{1,64}}) (?P<dev>{BDF}): [\d.]{{1,16}} Gb/s "
                          rf"available PCIe bandwidth, limited by (?P<speed>[\d.]{{1,8}} GT/s)"
                          rf"(?: PCIe)? x(?P<width>\d{{1,2}}) link at "
                          rf"(?P<at>{BDF}|<unknown>) \(capable of [\d.]{{1,16}} Gb/s with "
                          rf"(?P<cap_speed>[\d.]{{1,8}} GT/s)(?: PCIe)? x(?P<cap_width>\d{{1,2}}) link\)")
AER_ON_RE = re.compile(r"AER: enabled with IRQ|_OSC: OS now controls \[[^\]]{0,256}\bAER\b")
AER_FIRMWARE_RE = re.compile(r"_OSC: platform does not support \[[^\]]{0,256}\bAER\b")


AER_KINDS = ("corrected", "nonfatal", "fatal")
# During recovery from an uncorrected error the kernel names each device below the port:
# "nvidia 0000:02:00.0: device has no AER-aware driver" (wilicc/gpu-burn#1), "nvidia
# 0000:03:00.0: AER: can't recover (no error_detected callback)" (rwth-i6/returnn#1500).
BELOW_PORT_RE = re.compile(rf"(?P<dev>{BDF}): (?:AER: )?(?:can't recover|device has no AER-aware "
                           rf"driver|broadcast \w+ message)")


def _kind(severity: str) -> str:
    return aer_policy().words[severity]


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
    recovery_failed: bool = False  # the kernel said "device recovery failed" for this port


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
    failed: set[str] = set()  # ports whose recovery failed
    for line in bounded(lines):
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
            src = (match["src"].lower() if match["src"] else _requester(port, match["id"])
                   if match["id"] else port)
            if src != port:
                scan.below[src] = port
            received.append((src, _kind(match["sev"]), line.strip()))
            recovering = port if _kind(match["sev"]) != "corrected" else recovering
        elif (match := RECOVERY_FAILED_RE.search(line)):
            failed.add(match["port"].lower())
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
    for port in failed & set(scan.devices):
        scan.devices[port].recovery_failed = True
    return scan


def _role(ctx: Context, address: str, scan: AerScan) -> tuple[str, PciDevice | None]:
    """'gpu', 'nvswitch', 'upstream' (a bridge above one of them) or 'other', and the GPU or
    NVSwitch concerned."""
    critical = [*ctx.pci_gpus, *ctx.nvswitches]
    device = find(address, critical)
    if device is not None:
        return ("gpu" if device.is_nvidia_gpu else "nvswitch"), device
    for dev in critical:
        if any(same(address, PciDevice(b, 0, 0, 0)) for b in dev.pci_path):
            return "upstream", dev
    for child, port in scan.below.items():
        below = find(child, critical) if port == address else None
        if below is not None:
            return "upstream", below
    return "other", None


REMEDY_AER_UNCORRECTED = ("drain the node; an uncorrected PCIe error on a GPU's link usually "
                          "precedes XID 79: reseat the GPU/riser/cable, check the slot, update "
                          "the BIOS; RMA the GPU or baseboard if it recurs")
REMEDY_AER_CORRECTED = ("reseat the device or its riser/cable; corrected errors that keep "
                        "rising mean a marginal link that will start replaying under load")


@check("pcie-aer", code="GPU014", title="no uncorrected PCIe AER errors on GPUs since boot",
       needs=NEEDS,
       budget=Budget(value=8, cost=Cost(cpu=1, gpu=1), source="measured cpu"))
def pcie_aer(ctx: Context) -> Iterator[Result]:
    """Scans this boot's kernel log for PCIe AER lines and attributes each to the device named:
    uncorrected errors on a GPU, an NVSwitch or a bridge above them fail, on other devices
    warn; corrected errors above aer.corrected_warn (DCGM's 80 PCIe replays) per device warn; a
    link the kernel reports narrower than the device supports warns. With nothing found, SKIP
    unless the log shows the kernel enabling AER (firmware-first platforms log elsewhere);
    ERROR when no log source can be read."""
    corrected_warn = int(ctx.profile.require("aer.corrected_warn"))
    # a reset GPU's lines from before its reset are the fault the reset cured (reset markers)
    lines, reset = after_resets(kernel_log(ctx))
    source = log_source(ctx, lines) | (reset or {})
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
        if entry.recovery_failed:
            details["recovery_failed"] = True
        what = {"gpu": f"GPU {address}", "nvswitch": f"NVSwitch {address}",
                "upstream": f"PCIe port {address} above "
                            f"{'GPU' if concerned and concerned.is_nvidia_gpu else 'NVSwitch'} "
                            f"{concerned.address if concerned else ''}",
                "other": f"{entry.driver or 'device'} {address}"}[role]
        device = (gpu_device(ctx, concerned.address) if concerned and concerned.is_nvidia_gpu
                  else Device(pci=concerned.address if concerned else address,
                              name=None if concerned else entry.driver or None))
        counted = ", ".join(f"{v} {k}" for k, v in counts.items() if k != "narrow") + (
            ", device recovery failed" if entry.recovery_failed else "")
        if uncorrected and aer_policy().uncorrected[role] == "FAIL":
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
