"""A host report reduced to what the fleet keeps of it once it is folded into the aggregate.

A parsed report is about 225 kB of Python objects (68 kB of JSON, 162 results for 8 GPUs): a
fleet of 10 000 would hold 2.2 GB. The aggregation streams instead: each report is read, checked,
its figures and curves extracted, and then reduced by `compact` to a summary of the same shape
(a dict with the report's keys, `checks` with their `results`), so every reader of
`HostEntry.report` works unchanged on either. What the summary leaves out:

- `environment` and every structured (non-scalar) entry of `system`;
- of a result that PASSed: everything but `status`, `message`, `device`, `value`, `unit`,
  `fault_code` and the `details` the fleet reads (`figures`, the digest's, the fabric's): its
  `expected`, `remedy`, and the curve (already extracted as a `figures.Curve`);
- nothing of a result that did not pass, nor of the checks whose details the NVL72 domain reads.

Identical strings are kept once across the fleet (check ids, titles, messages, units), and one
device mapping per GPU is shared by all its results in the host's summary: a summary is read,
never written to.
"""

from __future__ import annotations

from typing import Any

# details a PASSing result keeps: read by figures (history, Prometheus), digest_groups and
# fabric_summary
KEPT_DETAILS = frozenset({"figures", "digest", "model", "reference", "rails", "transports",
                          "nccl_transport", "rail"})
# checks whose results are kept whole: nvl72 reads any of their details
WHOLE_CHECKS = frozenset({"nvl72-fabric", "imex-service"})
# besides status, message and device: what the HTML (value, unit) and Prometheus (fault_code)
# show of a passing result, kept when the report gives one
KEPT_WHEN_SET = ("value", "unit", "fault_code")
TOP_LEVEL_DROPPED = frozenset({"checks", "system", "environment"})


class Compactor:
    """Reduces reports one at a time; strings seen before are shared (one per fleet)."""

    def __init__(self) -> None:
        self._strings: dict[str, str] = {}

    def text(self, value: Any) -> Any:
        if isinstance(value, str):
            return self._strings.setdefault(value, value)
        return value

    def _device(self, device: Any, seen: dict[Any, Any]) -> Any:
        if not isinstance(device, dict):
            return device
        try:
            key = tuple(device.items())
            hash(key)
        except TypeError:  # a nested value: keep it as it is
            return device
        shared = seen.get(key)
        if shared is None:
            shared = seen[key] = {self.text(k): self.text(v) for k, v in device.items()}
        return shared

    def _result(self, result: dict[str, Any], devices: dict[Any, Any]) -> dict[str, Any]:
        if result.get("status") != "PASS":
            return result
        out = {"status": "PASS", "message": self.text(result.get("message")),
               "device": self._device(result.get("device"), devices)}
        for key in KEPT_WHEN_SET:
            if result.get(key) is not None:
                out[key] = self.text(result[key])
        details = result.get("details")
        if isinstance(details, dict):
            kept = {k: v for k, v in details.items() if k in KEPT_DETAILS}
            if kept:
                out["details"] = kept
        return out

    def compact(self, report: dict[str, Any]) -> dict[str, Any]:
        """The summary of a report that passed the loader's checks (schema-valid)."""
        out = {k: self.text(v) for k, v in report.items() if k not in TOP_LEVEL_DROPPED}
        system = report.get("system")
        if isinstance(system, dict):
            out["system"] = {k: self.text(v) for k, v in system.items() if not isinstance(v, dict | list)}
        devices: dict[Any, Any] = {}
        checks = []
        for chk in report.get("checks", []):
            small = {k: self.text(v) for k, v in chk.items() if k != "results"}
            whole = chk.get("id") in WHOLE_CHECKS
            small["results"] = [r if whole else self._result(r, devices) for r in chk.get("results", [])]
            checks.append(small)
        out["checks"] = checks
        return out
