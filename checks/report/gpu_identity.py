"""One GPU, one host: a GPU UUID or board serial that two hosts' reports both name.

A GPU sits in one machine. Two reports of one run naming the same GPU mean one of them is not
what its host measured: a report copied to another host's name (a node that cannot pass, made to
look like one that does), a forged one, or a reports directory mixing runs of a GPU that moved.
Neither report can tell; the fleet names the GPU on both hosts (FAIL), since it cannot know
which one holds it.

Simulated reports (backend `fixture`) carry their scenario's UUIDs and serials, the same on every
simulated node: a GPU they share with each other only is no finding. One that any report from
real hardware (backend `linux`) names too is.

Input: each host's identities (ids_of: its results' `device.uuid` and `device.serial`). Output:
one finding per host that shares a GPU; aggregate.py turns them into the fleet check below.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

CHECK_ID = "duplicate-gpu"
CODE = "FLT031"
TITLE = "One GPU, one host: no GPU UUID or serial in two hosts' reports"

# What NVML and the node checks write where a board has no serial (nvidia-smi's "[N/A]", NVML's
# NOT_SUPPORTED): not an identity, however many boards share it
_NO_SERIAL = re.compile(r"n/?a|not|unknown|none|support|^0+$", re.IGNORECASE)

GpuIds = tuple[tuple[str, str], ...]  # (("uuid" | "serial"), value), each once


@dataclass(frozen=True)
class Finding:
    host: str
    status: str
    message: str


def ids_of(report: Mapping[str, Any]) -> GpuIds:
    """The GPU UUIDs and serials a report's results name, each once, in the order first seen."""
    # a report names its few GPUs in every result: the distinct pairs first (a dict's insertion
    # order), each judged once (~20 us a report, against ~145 judging every result)
    pairs: dict[tuple[Any, Any], None] = {}
    for chk in report.get("checks", ()):
        for result in chk["results"]:
            device = result.get("device")
            if type(device) is dict:
                uuid, serial = device.get("uuid"), device.get("serial")
                pairs[(uuid if type(uuid) is str else None, serial if type(serial) is str else None)] = None
    seen: dict[tuple[str, str], None] = {}
    for uuid, serial in pairs:
        if uuid and uuid.strip():
            seen[("uuid", uuid)] = None
        if serial and len(serial.strip()) >= 4 and not _NO_SERIAL.search(serial):
            seen[("serial", serial)] = None
    return tuple(seen)


def find(hosts: Iterable[tuple[str, bool, GpuIds]]) -> list[Finding]:
    """Hosts sharing a GPU with another host, one finding each (sorted by host); `hosts` gives
    each host, whether its report is from real hardware, and its identities."""
    claims: dict[tuple[str, str], list[tuple[str, bool]]] = {}
    for host, hardware, ids in hosts:
        for key in ids:
            claims.setdefault(key, []).append((host, hardware))
    messages: dict[str, list[str]] = {}
    for (kind, value), claimants in claims.items():
        if len(claimants) < 2 or not any(hardware for _, hardware in claimants):
            continue
        names = sorted(host for host, _ in claimants)
        for host in names:
            others = ", ".join(h for h in names if h != host)
            messages.setdefault(host, []).append(f"GPU {kind} {value} is also reported by {others}")
    return [Finding(host, "FAIL", "; ".join(parts[:3]) + (f"; and {len(parts) - 3} more" if parts[3:] else "")
                    + ": a copied or forged report, or reports of different runs")
            for host, parts in sorted(messages.items())]
