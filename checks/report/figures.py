"""The figures convention: how a check publishes numbers the fleet compares across hosts.

A result publishes figures in ``details["figures"]``, a mapping ``{name: number}``; the result's
``device`` says which GPU the figure is about (``device: null`` = a host-level figure, such as the
all-reduce bus bandwidth of the whole node). A name ends in its unit, and that unit says which way
is better: names ending in ``_s``, ``_ms`` or ``_us`` are times (lower is better), every other
figure, ``..._per_s`` included, is a rate or a size (higher is better).

A result may also publish ``details["curve"]``, a list of points (flat mappings of numbers), for
the plots: e.g. ``nccl-allreduce`` gives ``[{"bytes": 8, "busbw_gbs": ..., "algbw_gbs": ...,
"time_us": ...}, ...]`` and ``dataloader-scaling`` gives ``[{"workers": 0, "samples_per_s": ...}]``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

TIME_SUFFIXES = ("_s", "_ms", "_us")


def higher_is_better(name: str) -> bool:
    # "samples_per_s" is a rate, not a time.
    return name.endswith("_per_s") or not name.endswith(TIME_SUFFIXES)


@dataclass(frozen=True)
class GpuRef:
    """The GPU a figure is about, as the report names it."""

    index: int | None
    pci: str | None
    uuid: str | None

    @classmethod
    def from_device(cls, device: dict[str, Any] | None) -> GpuRef | None:
        if not device:
            return None
        get = device.get
        index, pci, uuid = get("index"), get("pci"), get("uuid")
        if index is None and pci is None and uuid is None:
            return None
        return cls(index, pci, uuid)

    def label(self) -> str:
        return f"GPU{self.index}" if self.index is not None else (self.pci or self.uuid or "GPU")

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "pci": self.pci, "uuid": self.uuid}


@dataclass(frozen=True)
class Figure:
    host: str
    check: str
    name: str
    value: float
    gpu: GpuRef | None  # None: a host-level figure


@dataclass(frozen=True)
class Curve:
    host: str
    check: str
    gpu: GpuRef | None
    points: tuple[dict[str, float], ...]


def _is_real(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return _is_real(value) and value == value


def _gpu(device: Any, seen: dict[Any, GpuRef | None]) -> GpuRef | None:
    """GpuRef.from_device(device), the same object for the same GPU within `seen`."""
    if not device or type(device) is not dict:
        return GpuRef.from_device(device)
    get = device.get
    index = get("index")
    key = (type(index), index, get("pci"), get("uuid"))  # 1 and 1.0 are one key, not one label
    try:
        return seen[key]
    except KeyError:
        gpu = seen[key] = GpuRef.from_device(device)
        return gpu
    except TypeError:  # an unhashable value (not a schema-valid report)
        return GpuRef.from_device(device)


def extract(host: str, report: Mapping[str, Any]) -> Iterator[Figure | Curve]:
    """Every figure and curve a report publishes; malformed entries are ignored, not fatal. The
    figures of one GPU share one GpuRef (fewer objects to hand from a reading process)."""
    gpus: dict[Any, GpuRef | None] = {}
    for chk in report["checks"]:
        check = chk["id"]
        for result in chk["results"]:
            details = result.get("details")
            if not details:  # most results publish nothing: one lookup each
                continue
            figures, curve = details.get("figures"), details.get("curve")
            if not figures and not curve:
                continue
            gpu = _gpu(result.get("device"), gpus)
            if isinstance(figures, dict):
                # NaN and infinities are kept: a figure that is not a number is a finding
                # (stragglers.not_finite), never silently left out of the statistics.
                for name, value in figures.items():
                    if type(value) is float or type(value) is int or _is_real(value):
                        yield Figure(host, check, str(name), float(value), gpu)
            if isinstance(curve, list):
                # exact int/float first (what JSON parses to), then _is_number's isinstance
                points = tuple({k: float(v) for k, v in p.items()
                                if (type(v) is float or type(v) is int or _is_real(v)) and v == v}
                               for p in curve if isinstance(p, dict))
                if points:
                    yield Curve(host, check, gpu, points)
