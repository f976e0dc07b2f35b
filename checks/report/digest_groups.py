"""Same bits everywhere: the reference digests of a fleet, grouped by software stack.

Every node's `reference-digest` check (checks/node/suite/digest.py) runs the same deterministic
computation on each GPU and publishes its SHA-256 in the result's details. GPUs of the same model
running the same driver, CUDA and torch must produce the same bits; a different model or stack
may legitimately round differently, so digests are compared only within a group keyed by
(GPU model, driver, CUDA, torch, reference definition).

Within a group the digest held by more than half of its GPUs is the reference; a GPU with
another digest is named (FAIL: silent data corruption, or a node whose stack is not what it
says). A group whose GPUs split with no strict majority cannot tell which side is wrong: every
GPU in it WARNs. A group of one host is reported but compared only within the node (the node's
own check already fails GPUs that disagree there).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from checks.report.figures import GpuRef
from checks.report.findings import HostEntry

CHECK_ID = "reference-digest"


@dataclass(frozen=True)
class GroupKey:
    model: str
    driver: str
    cuda: str
    torch: str
    reference: str

    def label(self) -> str:
        return (f"{self.model} · driver {self.driver} · CUDA {self.cuda} · torch {self.torch}")

    def to_dict(self) -> dict[str, str]:
        return dict(vars(self))


@dataclass(frozen=True)
class Entry:
    host: str
    gpu: GpuRef | None
    digest: str


@dataclass(frozen=True)
class Odd:
    """A GPU whose digest is not its group's majority."""

    host: str
    gpu: GpuRef | None
    digest: str
    majority: str | None  # None: the group has no strict majority
    group: GroupKey
    status: str  # "FAIL" (differs from the majority) or "WARN" (no majority to judge by)

    @property
    def message(self) -> str:
        if self.majority is None:
            return f"digest {self.digest[:12]} and no majority in its group ({self.group.label()})"
        return (f"digest {self.digest[:12]} differs from {self.majority[:12]} of the majority of "
                f"its group ({self.group.label()})")

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "gpu": self.gpu.to_dict() if self.gpu else None,
                "digest": self.digest, "majority": self.majority, "status": self.status,
                "group": self.group.to_dict()}


@dataclass(frozen=True)
class Group:
    key: GroupKey
    entries: tuple[Entry, ...]
    majority: str | None
    counts: tuple[tuple[str, int], ...]  # digest -> GPUs, most common first

    @property
    def hosts(self) -> list[str]:
        return sorted({e.host for e in self.entries})

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key.to_dict(), "hosts": len(self.hosts), "gpus": len(self.entries),
                "majority": self.majority, "digests": dict(self.counts)}


@dataclass(frozen=True)
class Analysis:
    groups: tuple[Group, ...]
    odd: tuple[Odd, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"groups": [g.to_dict() for g in self.groups], "odd": [o.to_dict() for o in self.odd]}


def _text(value: Any) -> str:
    return "?" if value is None or value == "" else str(value)


def entries_of(host: str, report: Mapping[str, Any]) -> Iterable[tuple[GroupKey, Entry]]:
    """The GPU digests one report publishes, each with its group key. CPU-only results (no
    device) are information on the node and are not compared across the fleet."""
    system = report.get("system") or {}
    for chk in report.get("checks", []):
        if chk.get("id") != CHECK_ID:
            continue
        for r in chk["results"]:
            details = r.get("details") or {}
            digest, device = details.get("digest"), r.get("device")
            if not isinstance(digest, str) or not digest or not device:
                continue
            key = GroupKey(_text(details.get("model") or device.get("name")),
                           _text(system.get("driver")), _text(system.get("torch_cuda")),
                           _text(system.get("torch")), _text(details.get("reference")))
            yield key, Entry(host, GpuRef.from_device(device), digest)


def analyse(hosts: Iterable[HostEntry]) -> Analysis:
    return analyse_entries(pair for h in hosts if h.report is not None
                           for pair in entries_of(h.host, h.report))


def analyse_entries(pairs: Iterable[tuple[GroupKey, Entry]]) -> Analysis:
    """The groups and odd GPUs of the digests `pairs` (entries_of, host after host)."""
    by_key: dict[GroupKey, list[Entry]] = {}
    for key, entry in pairs:
        by_key.setdefault(key, []).append(entry)
    groups, odd = [], []
    for key in sorted(by_key, key=lambda k: (k.model, k.driver, k.cuda, k.torch, k.reference)):
        entries = by_key[key]
        counts = Counter(e.digest for e in entries).most_common()
        top, n = counts[0]
        majority = top if n * 2 > len(entries) else None
        groups.append(Group(key, tuple(entries), majority, tuple(counts)))
        if len({e.host for e in entries}) < 2 or len(counts) == 1:
            continue  # one host: nothing to compare across; one digest: all agree
        for e in entries:
            if majority is None:
                odd.append(Odd(e.host, e.gpu, e.digest, None, key, "WARN"))
            elif e.digest != majority:
                odd.append(Odd(e.host, e.gpu, e.digest, majority, key, "FAIL"))
    odd.sort(key=lambda o: (o.status != "FAIL", o.host,
                            o.gpu.index if o.gpu and o.gpu.index is not None else -1))
    return Analysis(tuple(groups), tuple(odd))
