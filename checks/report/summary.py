"""A host report reduced to what the fleet keeps of it once it is folded into the aggregate.

A parsed report is about 225 kB of Python objects (68 kB of JSON, 162 results for 8 GPUs): a
fleet of 10 000 would hold 2.2 GB. The aggregation streams instead: each report is read, checked,
its figures and curves extracted, and then reduced by `compact` to a summary of the same shape
(a dict with the report's keys, `checks` with their `results`), so every reader of
`HostEntry.report` works unchanged on either. What the summary leaves out:

- `environment` and every structured (non-scalar) entry of `system`;
- of a result that PASSed or was SKIPped: everything but `status`, `message`, `device`, `value`,
  `unit`, `fault_code`, `remedy` and the `details` the fleet reads (`figures`, the digest's, the fabric's):
  its `expected` and the curve (already extracted as a `figures.Curve`);
- nothing of a result that WARNed, FAILed or ERRORed, nor of the checks whose details the NVL72
  domain reads.

Identical top-level strings are kept once across the fleet, and one device mapping per GPU is
shared by all its results in the host's summary: a summary is read, never written to. The fleet
holds each summary packed (Packed): its checks as one compressed pickle, unpacked when read.
"""

from __future__ import annotations

import pickle
import zlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

# results reduced: a SKIP's message stays (JUnit's skipped message, the HTML's row)
SLIMMED = frozenset({"PASS", "SKIP"})
# details a PASSing or SKIPped result keeps: read by figures (history, Prometheus), digest_groups
# and fabric_summary
KEPT_DETAILS = frozenset({"figures", "digest", "model", "reference", "rails", "transports",
                          "nccl_transport", "rail"})
# checks whose results are kept whole: nvl72 reads any of their details
WHOLE_CHECKS = frozenset({"nvl72-fabric", "imex-service"})
# besides status, message and device: what the HTML (value, unit), Prometheus (fault_code) and
# JUnit (a SKIP's remedy in a failed check's text) show of such a result, kept when it has one
KEPT_WHEN_SET = ("value", "unit", "fault_code", "remedy")
TOP_LEVEL_DROPPED = frozenset({"checks", "system", "environment"})
# checks the fleet's fabric summary reads (fabric_summary: drawn in the HTML and the terminal):
# a Packed summary packs them apart too (side_checks), so that view never unpacks all of a host's
# checks (two walks of every host's packed checks, ~0.35 ms a host; these few, ~0.02 ms)
SIDE_CHECKS = frozenset({"rdma-rails", "nccl-transport", "nccl-allreduce", "xhost-collective"})


class Compactor:
    """Reduces reports one at a time. Top-level strings seen before are shared (one per fleet);
    the checks are packed away (Packed), where one host's results share each GPU's device
    mapping. Written for speed (it runs on each of 10 000 reports' 162 results): one pass, no
    per-string work inside the checks."""

    def __init__(self) -> None:
        self._strings: dict[str, str] = {}

    def _text(self, value: Any) -> Any:
        return self._strings.setdefault(value, value) if type(value) is str else value

    def compact(self, report: Mapping[str, Any]) -> dict[str, Any]:
        """The summary of a report that passed the loader's checks (schema-valid)."""
        text = self._text
        out = {k: text(v) for k, v in report.items() if k not in TOP_LEVEL_DROPPED}
        system = report.get("system")
        if isinstance(system, dict):
            out["system"] = {k: text(v) for k, v in system.items() if not isinstance(v, dict | list)}
        devices: dict[Any, Any] = {}  # one device mapping per GPU, shared by its results
        share = devices.setdefault
        checks = []
        for chk in report.get("checks", []):
            slim = {k: v for k, v in chk.items() if k != "results"}
            results = chk.get("results", [])
            slim["results"] = (results if chk.get("id") in WHOLE_CHECKS
                               else [_slim(r, share) for r in results])
            checks.append(slim)
        out["checks"] = checks
        return out


def _slim(result: dict[str, Any], share: Callable[[Any, Any], Any]) -> dict[str, Any]:
    get = result.get
    status = get("status")
    if status not in SLIMMED:
        return result
    device = get("device")
    if type(device) is dict:
        try:  # noqa: SIM105 (~160 a report: contextlib.suppress costs ~0.5 us each, try nothing)
            device = share(tuple(device.items()), device)
        except TypeError:  # a nested value: not shared
            pass
    out = {"status": status, "message": get("message"), "device": device}
    # KEPT_WHEN_SET, in its order, written out: a loop over the four costs ~0.3 us a result
    value = get("value")
    if value is not None:
        out["value"] = value
    value = get("unit")
    if value is not None:
        out["unit"] = value
    value = get("fault_code")
    if value is not None:
        out["fault_code"] = value
    value = get("remedy")
    if value is not None:
        out["remedy"] = value
    details = get("details")
    if details and type(details) is dict and not KEPT_DETAILS.isdisjoint(details):
        out["details"] = {k: v for k, v in details.items() if k in KEPT_DETAILS}
    return out


class Packed(Mapping[str, Any]):
    """A summary as the fleet holds it between reading and writing: its top-level entries as a
    mapping, its `checks` as one compressed pickle (about 5 kB for 8 GPUs' 162 results, against
    about 60 kB of Python objects), unpacked again on each read of `checks`. A reader that walks
    every host's checks (a renderer, the history) holds one host's checks at a time; what the
    aggregation itself needs of them is taken while the whole report is at hand (aggregate.Facts).
    Pickle, not JSON: it keeps what JSON text cannot (NaN, shared tuples) bit for bit."""

    __slots__ = ("_blob", "_side", "_top", "checks_count")

    def __init__(self, top: dict[str, Any], checks: list[dict[str, Any]] | bytes,
                 checks_count: int | None = None, side: bytes = b"") -> None:
        self._top = top
        if isinstance(checks, bytes):
            self._blob, self.checks_count, self._side = checks, checks_count or 0, side
        else:
            self._blob = _packed(checks)
            self.checks_count = len(checks)
            found = _side_checks(checks)  # as unpacked objects they took ~3 kB a host
            self._side = _packed(found) if found else b""

    def __getitem__(self, key: str) -> Any:
        if key == "checks":
            return pickle.loads(zlib.decompress(self._blob))
        return self._top[key]

    def __iter__(self) -> Iterator[str]:
        yield from self._top
        yield "checks"

    def __len__(self) -> int:
        return len(self._top) + 1

    def __contains__(self, key: object) -> bool:
        return key == "checks" or key in self._top

    def __reduce__(self) -> tuple[Any, ...]:
        return (Packed, (self._top, self._blob, self.checks_count, self._side))

    def with_host(self, host: str) -> Packed:
        """The same summary under the fleet's name for the host (its file's name)."""
        return Packed({**self._top, "host": host}, self._blob, self.checks_count, self._side)


def _packed(checks: list[dict[str, Any]]) -> bytes:
    return zlib.compress(pickle.dumps(checks, pickle.HIGHEST_PROTOCOL), 1)


def _side_checks(checks: Any) -> list[dict[str, Any]]:
    return [chk for chk in checks or [] if chk.get("id") in SIDE_CHECKS]


def side_checks(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The checks of a report or summary whose id is one of SIDE_CHECKS, in the report's order
    (a Packed summary's without unpacking the others): what a reader of only those checks sees
    in `checks`."""
    if isinstance(report, Packed):
        return pickle.loads(zlib.decompress(report._side)) if report._side else []
    return _side_checks(report.get("checks"))


def pack(summary: dict[str, Any]) -> Packed:
    """`summary` (Compactor.compact) as the fleet holds it."""
    return Packed({k: v for k, v in summary.items() if k != "checks"}, summary.get("checks", []))


def holds_checks(report: Mapping[str, Any]) -> bool:
    """Whether a report or summary lists any check (without unpacking a Packed one)."""
    if isinstance(report, Packed):
        return report.checks_count > 0
    return bool(report.get("checks"))
