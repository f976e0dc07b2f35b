"""The hosts to act on, in the order an operator acts: one row per fault of a host (or of one of
its GPUs), the root-cause check first, with its fault code, remedy and the commands that confirm
it by hand. The fleet's HTML, terminal and JUnit output all lead with these rows.

Folding. A check that could not measure a GPU because another check already found the GPU broken
says so at the end of its message: "not measured: NVML answers GPU_IS_LOST for this GPU (see
gpu-count)". Such results are not rows of their own: they are listed under the row of the check
they point at (`dependents`), when that check did not pass on the same host. Two checks that see
one fault of one GPU and give the same remedy (gpu-count and xid-events for a GPU that fell off
the bus) are one row: the first check in the report is the row's check, the others are `also`.

The confirm commands and the meaning of each fault code come from the troubleshooting catalogue
(checks/report/faults.yaml, package data the wheel ships, rendered into docs/troubleshooting.md);
a code without an entry, or a damaged catalogue, gets no commands and the row points at the
troubleshooting page.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from checks import resources, safeyaml
from checks.report.figures import GpuRef
from checks.report.findings import HostEntry

BAD = ("FAIL", "ERROR", "WARN")
SEVERITY = {"MISSING": 0, "ERROR": 1, "FAIL": 1, "WARN": 2}  # a missing host first: nothing is known
_SEE = re.compile(r"\(see ([a-z0-9][a-z0-9-]*)\)$")
DOC = "docs/troubleshooting.md"
# What to do about a host without a readable report, and about the fleet's own findings (which
# no check's remedy covers): the first step, in nodecert's words.
NO_REPORT = {
    "MISSING": ("reach the host (the connection or crash error is in the message), then verify it again",
                ("ansible -i INVENTORY HOST -m ansible.builtin.ping",)),
    "ERROR": ("the report cannot be read (message): verify the host again", ()),
}
FINDING_REMEDY = {
    "straggler": "rerun the check on this host; if it stays slow, read the GPU's clock-throttle, "
                 "gpu-temperature and gpu-power results, then reseat or RMA it",
    "drift": "compare with the GPU's earlier runs (history); if it keeps dropping, read its "
             "clock-throttle and gpu-temperature results, then reseat or RMA it",
    "digest": "drain the GPU: it computes other bits than its peers (silent data corruption); "
              "rerun reference-digest, and RMA it if it differs again",
    "lemon": "replace the GPU (quote its serial): it failed run after run",
}


@dataclass
class Row:
    """One fault to act on. `check` is the root cause (or the finding's check); `dependents` the
    checks not measured because of it; `also` other checks that saw the same fault."""

    host: str
    host_status: str
    status: str
    check: str
    message: str
    gpu: GpuRef | None = None
    serial: str | None = None
    fault_code: str | None = None
    remedy: str | None = None
    confirm: tuple[str, ...] = ()
    dependents: list[str] = field(default_factory=list)
    also: list[str] = field(default_factory=list)
    kind: str = "check"  # "check", "report" (no readable report) or a finding's kind

    def gpu_text(self) -> str:
        """'GPU3 0000:5d:00.0 serial 1654923000103', or '' for a host-level fault."""
        if self.gpu is None:
            return ""
        parts = [self.gpu.label()]
        if self.gpu.pci and self.gpu.index is not None:
            parts.append(self.gpu.pci)
        parts.append(f"serial {self.serial}" if self.serial else "serial not readable")
        return " ".join(parts)

    def see(self) -> str:
        """Where the fault code is explained."""
        code = (self.fault_code or "").removesuffix("-E")
        return f"{DOC}#{code.lower()}" if code else DOC

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "status": self.status, "check": self.check, "kind": self.kind,
                "gpu": self.gpu.to_dict() if self.gpu else None, "serial": self.serial,
                "fault_code": self.fault_code, "message": self.message, "remedy": self.remedy,
                "confirm": list(self.confirm), "dependents": self.dependents, "also": self.also}


@functools.lru_cache(maxsize=1)
def faults() -> dict[str, dict[str, Any]]:
    """checks/report/faults.yaml: fault code -> its entry; empty when it is not installed or
    cannot be read (callers then fall back: rows point at the troubleshooting page only, every
    remedy is `none`)."""
    node = resources.data("report", "faults.yaml")
    try:
        data = safeyaml.load(node.read_text(encoding="utf-8")) if node.is_file() else {}
    except (OSError, ValueError, yaml.YAMLError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(code): entry for code, entry in data.items() if isinstance(entry, dict)}


@functools.lru_cache(maxsize=1)
def catalogue() -> dict[str, tuple[str, ...]]:
    """Fault code -> the commands that confirm it by hand."""
    return {code: tuple(c for c in entry.get("confirm") or () if isinstance(c, str))
            for code, entry in faults().items()}


def confirm_commands(fault_code: str | None) -> tuple[str, ...]:
    """The commands that show a fault by hand; a could-not-measure code (<CODE>-E) those of its
    check's code."""
    if not fault_code:
        return ()
    return catalogue().get(fault_code) or catalogue().get(fault_code.removesuffix("-E")) or ()


def _gpu_key(ref: GpuRef | None) -> Any:
    return None if ref is None else (ref.index, ref.pci) if ref.index is not None or ref.pci else ref.uuid


def _serials(report: Mapping[str, Any]) -> dict[Any, str]:
    found: dict[Any, str] = {}
    for chk in report.get("checks", []):
        for r in chk["results"]:
            dev = r.get("device") or {}
            if dev.get("serial"):
                found.setdefault(dev.get("index"), str(dev["serial"]))
                found.setdefault(dev.get("pci"), str(dev["serial"]))
    return found


def _worst(results: list[dict[str, Any]]) -> dict[str, Any]:
    return max(results, key=lambda r: ("WARN", "ERROR", "FAIL").index(r["status"]))


def _cause(results: list[dict[str, Any]]) -> str:
    """The check every one of these results points at ('... (see gpu-count)'), or ''."""
    causes = {m.group(1) if (m := _SEE.search(str(r["message"]).strip())) else "" for r in results}
    return causes.pop() if len(causes) == 1 else ""


def _check_rows(entry: HostEntry) -> list[Row]:
    """The rows of one host's report: one per check and GPU not passed, dependents folded."""
    report = entry.report or {}
    serials: dict[Any, str] | None = None  # read only for a GPU whose own result has no serial
    items: list[tuple[Row, str]] = []  # row, the check it defers to
    for chk in report.get("checks", []):
        by_gpu: dict[Any, list[dict[str, Any]]] = {}
        for r in chk["results"]:
            if r["status"] in BAD:
                by_gpu.setdefault(_gpu_key(GpuRef.from_device(r.get("device"))), []).append(r)
        for bad in by_gpu.values():
            worst = _worst(bad)
            gpu = GpuRef.from_device(worst.get("device"))
            code = worst.get("fault_code") or (chk.get("code") if worst["status"] != "ERROR" else None)
            serial = (worst.get("device") or {}).get("serial")
            if gpu is not None and not serial:
                serials = _serials(report) if serials is None else serials
                serial = serials.get(gpu.index) or serials.get(gpu.pci)
            row = Row(entry.host, entry.status, worst["status"], chk["id"], str(worst["message"]), gpu,
                      serial, code, worst.get("remedy"), confirm_commands(code))
            items.append((row, _cause(bad)))
    return _fold(items)


def _fold(items: list[tuple[Row, str]]) -> list[Row]:
    failing = {row.check for row, cause in items if not cause}
    roots: list[Row] = []
    for row, cause in items:
        if cause and cause != row.check and cause in failing:
            continue
        roots.append(row)
    for row, cause in items:
        if cause and cause != row.check and cause in failing:
            target = next((r for r in roots if r.check == cause and _gpu_key(r.gpu) == _gpu_key(row.gpu)),
                          next(r for r in roots if r.check == cause))
            if row.check not in target.dependents:
                target.dependents.append(row.check)
    merged: list[Row] = []
    for row in roots:  # one fault of one GPU seen by several checks, one remedy: one row
        same = next((m for m in merged if row.remedy and m.remedy == row.remedy and m.gpu is not None
                     and _gpu_key(m.gpu) == _gpu_key(row.gpu)), None)
        if same is None:
            merged.append(row)
            continue
        same.also.append(row.check)
        same.dependents.extend(d for d in row.dependents if d not in same.dependents)
    return merged


def _order(row: Row) -> tuple[int, int]:
    """Most severe first; within a severity, what a host's own checks found before the fleet's
    findings (an uncorrectable ECC error before a slow GPU)."""
    return SEVERITY.get(row.status, 3), 0 if row.kind in ("check", "report") else 1


def host_rows(entry: HostEntry) -> list[Row]:
    """What to do about one host, most severe first (the report's order within a severity)."""
    if entry.status == "PASS":  # no result but PASS or SKIP, no finding: nothing to act on
        return []
    if entry.report is None:
        remedy, confirm = NO_REPORT.get(entry.status, (None, ()))
        return [Row(entry.host, entry.status, entry.status, "no report", entry.reason or "no report",
                    remedy=remedy, confirm=tuple(c.replace("HOST", entry.host) for c in confirm),
                    kind="report")]
    rows = _check_rows(entry)
    serials = _serials(entry.report) if any(f.gpu for f in entry.findings) else {}
    for f in entry.findings:
        serial = serials.get(f.gpu.index) or serials.get(f.gpu.pci) if f.gpu else None
        rows.append(Row(entry.host, entry.status, f.status, f.check, f.reason, f.gpu, serial,
                        remedy=FINDING_REMEDY.get(f.kind), kind=f.kind))
    return sorted(rows, key=_order)


def rows(hosts: Iterable[HostEntry]) -> list[Row]:
    """Every host's rows: hosts without a report first, then by the host's worst row (its own
    checks' findings before the fleet's), then name."""
    per_host = [(h, host_rows(h)) for h in hosts]
    per_host = [(h, found) for h, found in per_host if found]
    per_host.sort(key=lambda hf: (min(_order(r) for r in hf[1]), hf[0].host))
    return [r for _, found in per_host for r in found]


def folded_checks(found: Iterable[Row]) -> dict[tuple[str, str], str]:
    """(host, check) -> the check it was folded under, for every dependent of every row."""
    found = list(found)
    own = {(r.host, r.check) for r in found} | {(r.host, a) for r in found for a in r.also}
    return {(r.host, d): r.check for r in found for d in r.dependents if (r.host, d) not in own}
