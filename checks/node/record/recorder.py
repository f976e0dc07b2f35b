"""What the hardware layer reads on this machine, as a recording (`python -m checks record`):
the recorder asks a `Backend` every question the checks ask and keeps each answer in the
scenario spelling `--simulate` reads (checks/node/record/__init__.py writes it and is the command).

This module assembles the scenario document: `Recorder` joins the host side (host_reads.py)
and the GPU side (gpu_reads.py), both reading through reads.py, adds torch, moves the
fields the GPUs share into gpu_defaults, and redacts and describes the result."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from checks import __version__
from checks.hw.base import GPU_FIELDS, Backend
from checks.node.record.gpu_reads import GpuReads
from checks.node.record.host_reads import HostReads
from checks.node.record.reads import CALL_TIMEOUT_S, MISSING, one_line, plain
from checks.node.redact import REDACTED_HOST, Redactor

# Fields a GPU answers with something of its own: never moved into gpu_defaults.
IDENTITY = {"pci_bus_id", "uuid", "serial", "lost", "nvml_visible"}


@dataclasses.dataclass
class Recording:
    scenario: dict[str, Any]
    gaps: list[str]  # facts the scenario format could not express
    notes: list[str]  # said in the header (kernel log shortened, ...)


class Recorder(HostReads, GpuReads):
    """Reads every Backend fact once, each read bounded in time."""

    def torch(self) -> dict[str, Any]:
        try:
            info = self.read(self.hw.torch, timeout_s=max(self.timeout_s, 120.0))
        except Exception as exc:
            self.gaps.append(f"torch: {one_line(exc)} (written as torch error)")
            return {"error": one_line(exc)}
        data = plain(dataclasses.asdict(info))
        data["capabilities"] = [".".join(map(str, c)) for c in data.get("capabilities") or []]
        return data


def _factor_defaults(gpus: list[dict[str, Any]]) -> dict[str, Any]:
    """Move the fields the GPUs share (same value) into gpu_defaults, as hand-written scenarios
    do; an 8-GPU recording then reads like one. An NVML field needs the same value on every GPU
    that answered (a lost or NVML-hidden GPU never shows it); a PCI fact, on every GPU."""
    answering = [g for g in gpus if not g.get("lost") and g.get("nvml_visible", True)]
    if len(answering) < 2:
        return {}
    shared = {}
    for key, value in answering[0].items():
        among = gpus if key not in GPU_FIELDS else answering
        if key not in IDENTITY and all(key in g and g[key] == value for g in among):
            shared[key] = value
    for gpu in gpus:
        for key in shared:
            gpu.pop(key, None)
    return shared


def record(hw: Backend, *, host: str, redact: bool = False, timeout_s: float = CALL_TIMEOUT_S,
           now: dt.datetime | None = None) -> Recording:
    """Read everything from `hw` and return it as a scenario (plus what could not be said)."""
    rec = Recorder(hw, timeout_s)
    host_facts = rec.host()
    driver, switches, gpus = rec.driver_and_gpus()
    scenario: dict[str, Any] = {"description": "", "host": host_facts, "driver": driver}
    if switches:
        scenario["nvswitches"] = switches
    defaults = _factor_defaults(gpus)
    if defaults:
        scenario["gpu_defaults"] = defaults
    scenario["gpus"] = gpus
    scenario["torch"] = rec.torch()
    fabric = rec.rdma(host_facts)
    if fabric is not MISSING:
        scenario["rdma"] = fabric
    if redact:
        for dev in (fabric or {}).get("devices", []) if isinstance(fabric, dict) else []:
            for port in dev.get("ports", []):
                for gid in port.get("gids", []):
                    gid["gid"] = "redacted"  # a GID carries the port's MAC or IP address
        scenario = Redactor(scenario, host).apply(scenario)
    when = (now or dt.datetime.now(dt.timezone.utc)).strftime("%Y-%m-%dT%H:%M:%SZ")
    shown = REDACTED_HOST if redact else host
    scenario["description"] = (f"Recording of {shown} made {when} by nodecert {__version__} "
                               f"(python -m checks record{' --redact' if redact else ''})")
    return Recording(scenario, rec.gaps, rec.notes)
