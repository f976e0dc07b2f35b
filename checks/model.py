"""Result model shared by every check, renderer and the fleet aggregator."""

from __future__ import annotations

import enum
import math
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:  # Python 3.10 (Ubuntu 22.04's python3): StrEnum's str() and format() by hand
    class StrEnum(str, enum.Enum):
        def __str__(self) -> str:
            return str(self.value)

        def __format__(self, spec: str) -> str:
            return str(self.value).__format__(spec)


class Status(StrEnum):
    PASS = "PASS"
    WARN = "WARN"
    FAIL = "FAIL"
    SKIP = "SKIP"
    ERROR = "ERROR"

    @property
    def severity(self) -> int:
        return _SEVERITY[self]

    @property
    def is_problem(self) -> bool:
        return self in (Status.FAIL, Status.ERROR)


_SEVERITY = {Status.SKIP: 0, Status.PASS: 1, Status.WARN: 2, Status.ERROR: 3, Status.FAIL: 4}


def worst(statuses: list[Status]) -> Status:
    """The status of a check with several results: the most severe one (SKIP only if all skip)."""
    return max(statuses, key=lambda s: s.severity) if statuses else Status.SKIP


@dataclass(frozen=True)
class Device:
    """Which GPU (or rank, or host component) a result is about."""

    index: int | None = None
    pci: str | None = None
    uuid: str | None = None
    name: str | None = None
    serial: str | None = None  # board serial: what an RMA asks for

    def label(self) -> str:
        parts = []
        if self.index is not None:
            parts.append(f"GPU{self.index}")
        if self.pci:
            parts.append(self.pci)
        return " ".join(parts) or (self.name or "")


@dataclass
class Result:
    """One observation of one check. A check returns one or more (e.g. one per GPU)."""

    status: Status
    message: str
    value: Any = None
    unit: str | None = None
    expected: str | None = None
    remedy: str | None = None
    device: Device | None = None
    fault_code: str | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["status"] = str(self.status)
        if self.device is None:
            data["device"] = None
        return data


def passed(message: str, **kw: Any) -> Result:
    return Result(Status.PASS, message, **kw)


def warn(message: str, **kw: Any) -> Result:
    return Result(Status.WARN, message, **kw)


def fail(message: str, **kw: Any) -> Result:
    return Result(Status.FAIL, message, **kw)


def skip(message: str, **kw: Any) -> Result:
    return Result(Status.SKIP, message, **kw)


def error(message: str, **kw: Any) -> Result:
    """Could not measure. Never a PASS."""
    return Result(Status.ERROR, message, **kw)


@dataclass
class CheckOutcome:
    """Everything the runner knows about one check after running it."""

    id: str
    code: str
    title: str
    level: str
    tags: tuple[str, ...]
    results: list[Result]
    duration_s: float

    @property
    def status(self) -> Status:
        return worst([r.status for r in self.results])

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "code": self.code,
            "title": self.title,
            "level": self.level,
            "tags": list(self.tags),
            "status": str(self.status),
            "duration_s": round(self.duration_s, 4),
            "results": [r.to_dict() for r in self.results],
        }


def _not_finite(value: Any) -> bool:
    return isinstance(value, float) and not math.isfinite(value)


def finite_or_error(result: Result) -> Result:
    """A PASS or WARN whose value, or one of whose published figures, is NaN or infinite is an
    ERROR: the measurement broke, and a NaN compares false with every threshold, so a check that
    compares with `<` would have passed it. "Could not measure" is never PASS."""
    if result.status not in (Status.PASS, Status.WARN):
        return result
    figures = result.details.get("figures") if isinstance(result.details, dict) else None
    named = [("value", result.value)] if _not_finite(result.value) else []
    if isinstance(figures, dict):
        named += [(str(k), v) for k, v in figures.items() if _not_finite(v)]
    if not named:
        return result
    what = ", ".join(f"{k} {v}" for k, v in named)
    return Result(Status.ERROR, f"{result.message}: but {what} is not a finite number (the "
                  "measurement broke)", value=result.value, unit=result.unit,
                  expected=result.expected, device=result.device, details=result.details,
                  remedy=result.remedy or "rerun the check; a NaN or infinite figure means the "
                                          "measurement itself failed (GPU fault, driver error)")
