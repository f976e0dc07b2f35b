"""The kernel-log policy as data: what each XID, SXid and PCIe AER severity means for the node.

The tables (xid.yaml, sxid.yaml, aer.yaml, nvstatus.yaml) cite their sources per row; this module loads and
validates them once. The checks in checks/node/suite/kernlog_*.py read them through here, the
docs' tables are generated from them (checks/docgen/kernlog.py), and a test walks every row.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import yaml

XID_VERDICTS = ("FAIL", "WARN", "BY_SEVERITY", "RECOVERY_ACTION")
SXID_VERDICTS = ("FAIL", "PRINTED", "IGNORE")


@dataclass(frozen=True)
class XidRow:
    xid: int
    name: str
    description: str
    action: str  # the catalog's immediate action ("" where the catalog gives none)
    verdict: str
    source: str
    reason: str = ""
    peers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class XidPolicy:
    rows: dict[int, XidRow]
    rule: dict[str, str]
    driver_reset_request: tuple[str, ...]
    sources: dict[str, str]


@dataclass(frozen=True)
class SxidRow:
    sxid: int
    name: str
    section: str
    verdict: str
    source: str
    reason: str = ""
    nvsentinel: str = ""


@dataclass(frozen=True)
class SxidPolicy:
    rows: dict[int, SxidRow]
    rule: dict[str, str]
    sources: dict[str, str]


def _load(name: str) -> dict[str, Any]:
    text = (resources.files("checks") / "kernlog" / name).read_text(encoding="utf-8")
    data = yaml.safe_load(text)
    if not isinstance(data, dict):
        raise ValueError(f"checks/kernlog/{name}: not a mapping")
    return data


def _check_source(table: str, key: Any, source: str, sources: dict[str, str]) -> None:
    if source not in sources:
        raise ValueError(f"checks/kernlog/{table}: row {key} cites unknown source {source!r}")


@functools.cache
def xid_policy() -> XidPolicy:
    data = _load("xid.yaml")
    sources = {str(k): str(v) for k, v in data["sources"].items()}
    rows: dict[int, XidRow] = {}
    for raw in data["xids"]:
        row = XidRow(xid=int(raw["xid"]), name=str(raw["name"]),
                     description=str(raw.get("description", "")), action=str(raw.get("action", "")),
                     verdict=str(raw["verdict"]), source=str(raw["source"]),
                     reason=str(raw.get("reason", "")),
                     peers={str(k): str(v) for k, v in (raw.get("peers") or {}).items()})
        _admit(rows, row.xid, row, "xid.yaml", "XID", XID_VERDICTS, sources)
    return XidPolicy(rows=rows, rule={str(k): str(v) for k, v in data["rule"].items()},
                     driver_reset_request=tuple(str(x) for x in data["driver_reset_request"]),
                     sources=sources)


def _admit(rows: dict[int, Any], code: int, row: Any, file: str, label: str,
           verdicts: tuple[str, ...], sources: dict[str, str]) -> None:
    """One table row in: a known verdict, listed once, citing a source the table names."""
    if row.verdict not in verdicts:
        raise ValueError(f"checks/kernlog/{file}: {label} {code} verdict {row.verdict!r}")
    if code in rows:
        raise ValueError(f"checks/kernlog/{file}: {label} {code} listed twice")
    _check_source(file, code, row.source, sources)
    rows[code] = row


@functools.cache
def sxid_policy() -> SxidPolicy:
    data = _load("sxid.yaml")
    sources = {str(k): str(v) for k, v in data["sources"].items()}
    rows: dict[int, SxidRow] = {}
    for raw in data["sxids"]:
        row = SxidRow(sxid=int(raw["sxid"]), name=str(raw["name"]), section=str(raw["section"]),
                      verdict=str(raw["verdict"]), source=str(raw["source"]),
                      reason=str(raw.get("reason", "")), nvsentinel=str(raw.get("nvsentinel", "")))
        _admit(rows, row.sxid, row, "sxid.yaml", "SXid", SXID_VERDICTS, sources)
    return SxidPolicy(rows=rows, rule={str(k): str(v) for k, v in data["rule"].items()},
                      sources=sources)


@dataclass(frozen=True)
class AerPolicy:
    words: dict[str, str]  # every severity word the kernel prints -> kind
    uncorrected: dict[str, str]  # role -> verdict
    severities: list[dict[str, str]]
    sources: dict[str, str]


@functools.cache
def aer_policy() -> AerPolicy:
    data = _load("aer.yaml")
    words: dict[str, str] = {}
    for row in data["severities"]:
        for key in ("before_6_8", "since_6_8"):
            words[str(row[key])] = str(row["kind"])
    if set(words.values()) != {"corrected", "nonfatal", "fatal"}:
        raise ValueError("checks/kernlog/aer.yaml: severities must name corrected, nonfatal, fatal")
    uncorrected = {str(k): str(v) for k, v in data["uncorrected"].items()}
    if set(uncorrected) != {"gpu", "nvswitch", "upstream", "other"} or not set(
            uncorrected.values()) <= {"FAIL", "WARN"}:
        raise ValueError("checks/kernlog/aer.yaml: uncorrected needs FAIL/WARN for gpu, nvswitch, "
                         "upstream, other")
    return AerPolicy(words=words, uncorrected=uncorrected,
                     severities=[{str(k): str(v) for k, v in r.items()} for r in data["severities"]],
                     sources={str(k): str(v) for k, v in data["sources"].items()})


@dataclass(frozen=True)
class StatusRow:
    code: int
    name: str
    remedy: str  # a key of NvStatusPolicy.remedies; "none": the line is not judged
    why: str = ""


@dataclass(frozen=True)
class Remedy:
    verdict: str  # FAIL, or PASS for "none"
    meaning: str  # what a line with such a status says about the GPU
    text: str


@dataclass(frozen=True)
class NvStatusPolicy:
    rows: dict[int, StatusRow]
    by_name: dict[str, StatusRow]
    remedies: dict[str, Remedy]
    sources: dict[str, str]

    def judged(self, code: int | None, name: str | None) -> StatusRow | None:
        """The row of a logged status when it carries a remedy: by name when the line prints a
        name the table knows (the name is what the driver printed next to the code), else by
        code; None for statuses that mean nothing for the node and for codes of a newer driver."""
        row = self.by_name.get(name or "") or (self.rows.get(code) if code is not None else None)
        return row if row is not None and row.remedy != "none" else None


@functools.cache
def nvstatus_policy() -> NvStatusPolicy:
    data = _load("nvstatus.yaml")
    sources = {str(k): str(v) for k, v in data["sources"].items()}
    remedies = {str(k): Remedy(verdict=str(v["verdict"]), meaning=str(v["meaning"]),
                               text=str(v["remedy"]))
                for k, v in data["remedies"].items()}
    if "none" not in remedies or any(r.verdict != "FAIL" for k, r in remedies.items()
                                     if k != "none"):
        raise ValueError("checks/kernlog/nvstatus.yaml: remedies need 'none' and FAIL verdicts")
    rows: dict[int, StatusRow] = {}
    by_name: dict[str, StatusRow] = {}
    for raw in data["statuses"]:
        row = StatusRow(code=int(raw["code"]), name=str(raw["name"]), remedy=str(raw["remedy"]),
                        why=str(raw.get("why", "")))
        where = f"checks/kernlog/nvstatus.yaml: {row.name} (0x{row.code:08X})"
        if row.remedy not in remedies:
            raise ValueError(f"{where}: unknown remedy {row.remedy!r}")
        if row.remedy != "none" and not row.why:
            raise ValueError(f"{where}: remedy {row.remedy} without a why")
        if row.code in rows or row.name in by_name:
            raise ValueError(f"{where}: listed twice")
        rows[row.code] = by_name[row.name] = row
    return NvStatusPolicy(rows=rows, by_name=by_name, remedies=remedies, sources=sources)
