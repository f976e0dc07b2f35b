"""nvswitch-sxid (GPU013): NVSwitch SXid lines in this boot's kernel log, judged by
checks/kernlog/sxid.yaml (the Fabric Manager user guide's tables and the driver's error list)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from checks.hw.kernel_log import after_resets
from checks.kernlog import sxid_policy
from checks.model import Device, Result, fail, passed, skip, warn
from checks.node.context import Context
from checks.node.registry import Budget, Cost, check
from checks.node.suite.kernel_errors import BDF, NEEDS, bounded, find, kernel_log, log_source

# --- nvswitch-sxid --------------------------------------------------------------------------

# "nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Non-fatal, Link 44 Minion Link DLREQ
# interrupt"; the same code then logs "Severity 0 Engine instance ..." and "Data {...}" lines.
SXID_RE = re.compile(rf"nvidia-nvswitch(?P<switch>\d{{1,4}}): SXid \(PCI:(?P<addr>{BDF})\): "
                     rf"(?P<code>\d{{1,6}}), (?P<rest>.*)")


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
    for line in bounded(lines):
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
        else:  # "Severity ..."/"Data {...}" lines, and SOE events that print no severity word
            entry.detail_lines += 1
            entry.last = entry.last or line.strip()
            entry.what = entry.what or (rest if not rest.startswith(("Data", "Severity")) else "")
            continue
        entry.last, entry.what = line.strip(), what.strip()
    return seen


REMEDY_SXID_FATAL = ("drain the node: a fatal NVSwitch error needs the GPUs and NVSwitches reset "
                     "(reboot), then re-verify; if it recurs on the same switch or link, open a "
                     "case with the system vendor")


@check("nvswitch-sxid", code="GPU013", title="no fatal NVSwitch SXid errors since boot",
       needs=NEEDS,
       budget=Budget(value=9, cost=Cost(cpu=1, gpu=1), source="measured cpu"))
def nvswitch_sxid(ctx: Context) -> Iterator[Result]:
    """Scans this boot's kernel log for NVSwitch SXid lines and names the NVSwitch's PCI address:
    a line printed Fatal fails, and so does any line of a code the Fabric Manager user guide
    (checks/kernlog/sxid.yaml) rates fatal or stalling, whatever word was printed (12028) or when
    none was (SOE halted, 26006); non-fatal ones above sxid.nonfatal_warn warn, codes the guide
    says to ignore pass. SKIP without NVSwitch and without SXid lines; ERROR when no log source
    can be read."""
    nonfatal_warn = int(ctx.profile.require("sxid.nonfatal_warn"))
    policy = sxid_policy()
    switches = ctx.nvswitches
    # a reset GPU's lines from before its reset are the fault the reset cured (reset markers)
    lines, reset = after_resets(kernel_log(ctx))
    source = log_source(ctx, lines) | (reset or {})
    seen = scan_sxids(lines)
    if not seen:
        if not switches:
            yield skip("no NVSwitch on the PCI bus and no SXid lines in the kernel log")
            return
        yield passed(f"no SXid events from {len(switches)} NVSwitch(es) since boot "
                     f"({source['source']})", value=0, details=source)
        return
    for (address, code), entry in sorted(seen.items()):
        on_bus = find(address, switches)
        device = Device(pci=on_bus.address if on_bus else address, name=entry.switch)
        row = policy.rows.get(code)
        details: dict[str, Any] = {"sxid": code, "fatal": entry.fatal, "nonfatal": entry.nonfatal,
                                   "last": entry.last, **source}
        if row is not None:
            details["guide"] = {"name": row.name, "section": row.section, "verdict": row.verdict,
                                "source": row.source}
        if on_bus is None:
            details["on_bus"] = False
        what = f" ({entry.what})" if entry.what else ""
        name = f" {row.name}" if row is not None else ""
        if entry.fatal:
            yield fail(f"fatal SXid {code}{name} x{entry.fatal} on NVSwitch {device.pci}{what}",
                       value=code, device=device, details=details, expected="no fatal SXid",
                       remedy=REMEDY_SXID_FATAL)
        elif row is not None and row.verdict == "FAIL":
            printed = "printed Non-fatal" if entry.nonfatal else "no severity printed"
            why = row.reason or f"the guide rates it {row.section.replace('_', ' ')}"
            yield fail(f"SXid {code}{name} on NVSwitch {device.pci}{what}: {printed}, but {why}",
                       value=code, device=device, details=details, expected="no fatal SXid",
                       remedy=REMEDY_SXID_FATAL)
        elif row is not None and row.verdict == "IGNORE":
            yield passed(f"SXid {code}{name} on NVSwitch {device.pci}: {row.reason}",
                         value=code, device=device, details=details)
        elif not entry.nonfatal:
            yield warn(f"SXid {code}{name} on NVSwitch {device.pci}: severity not in the log",
                       value=code, device=device, details=details,
                       remedy="look up the SXid in NVIDIA's Fabric Manager user guide")
        elif entry.nonfatal > nonfatal_warn:
            yield warn(f"non-fatal SXid {code}{name} x{entry.nonfatal} on NVSwitch {device.pci}"
                       f"{what}", value=code, device=device, details=details,
                       expected=f"<= {nonfatal_warn} non-fatal",
                       remedy="watch the link's counters; repeated non-fatal errors on one link "
                              "point at the cable, connector or baseboard")
        else:
            yield passed(f"{entry.nonfatal} non-fatal SXid {code} on NVSwitch {device.pci}",
                         value=code, device=device, details=details,
                         expected=f"<= {nonfatal_warn} non-fatal")
