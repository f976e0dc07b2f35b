"""What the three kernel-log checks share: this boot's log read once per run, lines bounded for
linear-time parsing, and PCI addresses as the kernel prints them.

The checks (kernlog_gpu_xid: xid-events, kernlog_nvswitch_sxid: nvswitch-sxid, kernlog_pcie_aer:
pcie-aer) read `ctx.hw.kernel_log()` once per run (cached per Context): a log that cannot be read
is an ERROR in each of them, never "no events". What each event means is data
(checks/kernlog/*.yaml); the line formats, with the public reports they come from, are in
docs/kernel-log.md.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from typing import Any

from checks.hw.base import HardwareError, PciDevice
from checks.model import Device
from checks.node.context import Context

NEEDS = ("pci-gpus",)  # readable without the driver; SKIP (with its reason) on a GPU-less host
HEX = "[0-9a-fA-F]"
# A PCI function as the kernel prints it: 4-hex-digit domain, or 5 for VMD domains (10000:e1:00.0).
BDF = rf"{HEX}{{4,5}}:{HEX}{{2}}:{HEX}{{2}}\.[0-7]"

# The kernel log is untrusted text: every line is cut to this length before any pattern sees
# it, and every pattern is linear in the line (no unbounded run next to another that can match
# the same characters). A printk record holds at most 1024 bytes on older kernels and 2048
# (PRINTK_MESSAGE_MAX) on newer ones; journal and syslog prefixes add well under 200.
MAX_LINE_CHARS = 4096


def bounded(lines: list[str]) -> Iterator[str]:
    for line in lines:
        yield line[:MAX_LINE_CHARS]


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

def parse_address(text: str) -> tuple[int | None, int, int, int | None]:
    """(domain, bus, device, function) of "dddd:bb:dd[.f]" or "bb:dd[.f]"; None where absent."""
    head, _, function = text.partition(".")
    parts = head.split(":")
    domain = int(parts[0], 16) if len(parts) == 3 else None
    return domain, int(parts[-2], 16), int(parts[-1], 16), int(function) if function else None


def same(logged: str, device: PciDevice) -> bool:
    dom, bus, dev, fn = parse_address(logged)
    d_dom, d_bus, d_dev, d_fn = parse_address(device.address)
    return ((dom is None or dom == d_dom) and bus == d_bus and dev == d_dev
            and (fn is None or fn == d_fn))


def find(logged: str, devices: list[PciDevice]) -> PciDevice | None:
    """The one device the logged address names; None when none or several (no domain) match."""
    hits = [d for d in devices if same(logged, d)]
    return hits[0] if len(hits) == 1 else None


def gpu_device(ctx: Context, address: str) -> Device:
    """Device with index/UUID/serial when NVML was already read this run; never calls NVML
    itself (a hung GPU hangs NVML, and this check must still report it)."""
    for gpu in ctx.__dict__.get("gpus") or []:
        if gpu.device.pci == address:
            return gpu.device
    return Device(pci=address)
