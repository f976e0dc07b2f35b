"""The recorder's reading discipline (checks/node/record/recorder.py assembles the recording): every
Backend call bounded in time (`Hung` when a driver call does not come back), each answer turned
into plain YAML/JSON values, and a failure either written as `{error: text}` or named as a gap
(`Reads.fact`). The host side (host_reads.py) and the GPU side (gpu_reads.py) read through it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from checks.hw.base import Backend, HardwareError

CALL_TIMEOUT_S = 30.0


class Hung(HardwareError):
    """A read did not come back within the bound (a hung driver call)."""


def _bounded(fn: Callable[[], Any], timeout_s: float) -> Any:
    """fn() in a daemon thread: a call stuck in C (NVML on a hung GPU) is abandoned, not waited
    for, and cannot keep the process alive."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the caller as-is
            box["error"] = exc

    thread = threading.Thread(target=target, name="record-read", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise Hung(f"no answer within {timeout_s:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def plain(value: Any) -> Any:
    """A YAML/JSON-safe copy of what a backend returned."""
    if value is None:
        return None
    if isinstance(value, HexInt):
        return value
    for kind in (bool, int, float, str):  # plain types, not subclasses (torch's TorchVersion)
        if isinstance(value, kind):
            return kind(value)
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, dict):
        return {k if isinstance(k, int) else str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        items = sorted(value) if isinstance(value, set | frozenset) else value
        return [plain(v) for v in items]
    return str(value)


class HexInt(int):
    """Written as 0x2330 (device ids, clock event reason bits); YAML reads it back as an int."""


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


MISSING: Any = _Missing()


def drop_missing(mapping: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in mapping.items() if v is not MISSING}


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if isinstance(exc, HardwareError) else f"{type(exc).__name__}: {text}"


class Reads:
    """Reads Backend facts, each read bounded in time; what could not be said is kept in `gaps`
    (facts the scenario format cannot express) and `notes` (said in the header)."""

    def __init__(self, hw: Backend, timeout_s: float = CALL_TIMEOUT_S) -> None:
        self.hw = hw
        self.timeout_s = timeout_s
        self.gaps: list[str] = []
        self.notes: list[str] = []

    def read(self, fn: Callable[[], Any], timeout_s: float | None = None) -> Any:
        return _bounded(fn, timeout_s or self.timeout_s)

    def fact(self, what: str, fn: Callable[[], Any], errors_ok: bool = False) -> Any:
        """One host fact. A failure is `{error: text}` where the format takes it (errors_ok),
        otherwise a gap: left out, so the simulation uses the scenario default."""
        try:
            return plain(self.read(fn))
        except Exception as exc:  # the recording goes on; the failure is written down
            text = one_line(exc)
            if errors_ok:
                return {"error": text}
            self.gaps.append(f"{what}: {text}")
            return MISSING
