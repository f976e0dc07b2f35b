"""A host report as the fleet holds it once it is folded into the aggregate.

A parsed report is about 225 kB of Python objects (68 kB of JSON, 162 results for 8 GPUs): a
fleet of 10 000 would hold 2.2 GB. The aggregation streams instead: each report is read, checked,
its figures, curves and facts extracted (aggregate.read_one), and then held as a summary of the
same shape (a mapping with the report's keys), so every reader of `HostEntry.report` works
unchanged on either:

- the top-level entries but `environment` and every structured (non-scalar) entry of `system`,
  identical strings kept once across the fleet;
- its `checks` packed away whole (Packed): the report's own JSON text compressed with LZ4 (about
  8.5 kB for 8 GPUs), read again with orjson when a reader asks for them; a report the loader had
  to change or read with json instead (a string it sanitised, an integer orjson reads otherwise)
  as a compressed pickle of its checks;
- the few checks the fabric summary reads (SIDE_CHECKS) packed apart too, reduced: of a result
  that PASSed or was SKIPped, only `status`, `message`, `device`, `value`, `unit`, `fault_code`,
  `remedy` and the `details` those readers use.

Packing the text as it came costs ~30 us a report, where building a reduced copy of the checks
result by result and pickling and compressing it cost ~500 us (the aggregation's largest cost);
each later read of the checks costs ~165 us against ~120, and the fleet's outputs read each host's
checks once (docs/fleet.md, Performance).
"""

from __future__ import annotations

import pickle
import zlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

try:
    import lz4.block as _lz4
    import orjson as _orjson
except ImportError:  # every report's checks are pickled and zlib-compressed instead
    _lz4 = None
    _orjson = None  # type: ignore[assignment]

# the side checks' results reduced: a SKIP's message stays (the HTML's row)
SLIMMED = frozenset({"PASS", "SKIP"})
# details a PASSing or SKIPped result of a side check keeps: what fabric_summary reads
KEPT_DETAILS = frozenset({"figures", "rails", "transports", "nccl_transport", "rail"})
# besides status, message and device: what a reader shows of such a result, kept when it has one
KEPT_WHEN_SET = ("value", "unit", "fault_code", "remedy")
TOP_LEVEL_DROPPED = frozenset({"checks", "system", "environment"})
# checks the fleet's fabric summary reads (fabric_summary: drawn in the HTML and the terminal):
# a Packed summary packs them apart too (side_checks), so that view never unpacks all of a host's
# checks (two reads of every host's packed checks, ~0.6 ms a host; these few, ~0.02 ms)
SIDE_CHECKS = frozenset({"rdma-rails", "nccl-transport", "nccl-allreduce", "xhost-collective"})


class Compactor:
    """Reduces reports one at a time. Top-level strings seen before are shared (one per fleet);
    the checks are packed away whole (Packed)."""

    def __init__(self) -> None:
        self._strings: dict[str, str] = {}

    def _text(self, value: Any) -> Any:
        return self._strings.setdefault(value, value) if type(value) is str else value

    def top(self, report: Mapping[str, Any]) -> dict[str, Any]:
        """The top-level entries a summary keeps of a report (all but `checks`)."""
        text = self._text
        out = {k: text(v) for k, v in report.items() if k not in TOP_LEVEL_DROPPED}
        system = report.get("system")
        if isinstance(system, dict):
            out["system"] = {k: text(v) for k, v in system.items() if not isinstance(v, dict | list)}
        return out

    def pack(self, report: Mapping[str, Any], text: bytes | None = None) -> Packed:
        """The summary of a report as the fleet holds it. `text`: the JSON text orjson reads
        into `report` exactly (loader.HostReport.text), kept compressed in place of its checks."""
        return Packed.of(self.top(report), report.get("checks", []), text)


def _slim(result: dict[str, Any], share: Callable[[Any, Any], Any]) -> dict[str, Any]:
    get = result.get
    status = get("status")
    if status not in SLIMMED:
        return result
    device = get("device")
    if type(device) is dict:
        try:  # noqa: SIM105 (a device mapping with a nested value is not shared)
            device = share(tuple(device.items()), device)
        except TypeError:
            pass
    out = {"status": status, "message": get("message"), "device": device}
    for key in KEPT_WHEN_SET:
        value = get(key)
        if value is not None:
            out[key] = value
    details = get("details")
    if details and type(details) is dict and not KEPT_DETAILS.isdisjoint(details):
        out["details"] = {k: v for k, v in details.items() if k in KEPT_DETAILS}
    return out


class Packed(Mapping[str, Any]):
    """A summary as the fleet holds it between reading and writing: its top-level entries as a
    mapping, its `checks` packed (the module's docstring says how), unpacked again on each read
    of `checks`, a fresh copy each time. A reader that walks every host's checks (a renderer, the
    history) holds one host's checks at a time; what the aggregation itself needs of them is
    taken while the whole report is at hand (aggregate.Facts). Where the checks are pickled, NaN
    and shared objects are kept bit for bit."""

    __slots__ = ("_blob", "_side", "_text", "_top", "checks_count")

    def __init__(self, top: dict[str, Any], blob: bytes, checks_count: int, side: bytes = b"",
                 text: bool = False) -> None:
        self._top, self._blob, self.checks_count, self._side, self._text = top, blob, checks_count, side, text

    @classmethod
    def of(cls, top: dict[str, Any], checks: list[dict[str, Any]], text: bytes | None = None) -> Packed:
        """`top` and `checks` packed; `text` as for Compactor.pack."""
        found = _side_checks(checks)  # a few hundred bytes: pickled, not compressed
        side = pickle.dumps(_slimmed(found), pickle.HIGHEST_PROTOCOL) if found else b""
        if text is not None and _lz4 is not None:
            return cls(top, _lz4.compress(text), len(checks), side, True)
        return cls(top, _packed(checks), len(checks), side)

    def __getitem__(self, key: str) -> Any:
        if key == "checks":
            if self._text:
                return _orjson.loads(_lz4.decompress(self._blob))["checks"]  # type: ignore[union-attr]
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
        return (Packed, (self._top, self._blob, self.checks_count, self._side, self._text))

    def with_host(self, host: str) -> Packed:
        """The same summary under the fleet's name for the host (its file's name)."""
        return Packed({**self._top, "host": host}, self._blob, self.checks_count, self._side, self._text)


def _packed(checks: list[dict[str, Any]]) -> bytes:
    return zlib.compress(pickle.dumps(checks, pickle.HIGHEST_PROTOCOL), 1)


def _slimmed(checks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The side checks reduced (one device mapping per GPU, shared by its results)."""
    devices: dict[Any, Any] = {}
    share = devices.setdefault
    return [{**{k: v for k, v in chk.items() if k != "results"},
             "results": [_slim(r, share) for r in chk.get("results", [])]} for chk in checks]


def _side_checks(checks: Any) -> list[dict[str, Any]]:
    return [chk for chk in checks or [] if chk.get("id") in SIDE_CHECKS]


def side_checks(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The checks of a report or summary whose id is one of SIDE_CHECKS, in the report's order
    (a Packed summary's without unpacking the others, reduced): what a reader of only those
    checks sees in `checks`."""
    if isinstance(report, Packed):
        return pickle.loads(report._side) if report._side else []
    return _side_checks(report.get("checks"))


def holds_checks(report: Mapping[str, Any]) -> bool:
    """Whether a report or summary lists any check (without unpacking a Packed one)."""
    if isinstance(report, Packed):
        return report.checks_count > 0
    return bool(report.get("checks"))
