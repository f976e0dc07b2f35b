"""Per-host fabric summary for the fleet views: each GPU's nearest NIC (the rails map of check
rdma-rails) and the transports NCCL used (nccl-allreduce in the node, xhost-collective across
hosts, judged by nccl-transport / the cross-host stage). Read from the host reports' details."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

TRANSPORT_SOURCES = ("xhost-collective", "nccl-allreduce")


@dataclass(frozen=True)
class HostFabric:
    host: str
    rails: str  # "GPU0->mlx5_0 (pcie-switch), GPU1->mlx5_3 (pcie-switch), ..."
    transports: str  # "xhost-collective: NET/IB+GDRDMA x16, P2P x48 [PASS]"


def _results(report: dict[str, Any], check_id: str) -> list[dict[str, Any]]:
    for chk in report.get("checks") or []:
        if chk.get("id") == check_id:
            return list(chk.get("results") or [])
    return []


def _rails(report: dict[str, Any]) -> str:
    for result in _results(report, "rdma-rails"):
        table = (result.get("details") or {}).get("rails")
        if table:
            return ", ".join(f"{gpu.split()[0]}->{v.get('nic') or '-'} ({v.get('affinity')})"
                             for gpu, v in table.items())
    return ""


def _transports(report: dict[str, Any]) -> str:
    parts = []
    verdict = {r.get("status") for r in _results(report, "nccl-transport")}
    for source in TRANSPORT_SOURCES:
        for result in _results(report, source):
            details = result.get("details") or {}
            kinds = details.get("transports")
            if not kinds:
                continue
            status = (details.get("nccl_transport") or {}).get("status") or (
                next(iter(verdict)) if source == "nccl-allreduce" and len(verdict) == 1
                else None)
            text = ", ".join(f"{k} x{n}" for k, n in sorted(kinds.items()))
            parts.append(f"{source}: {text}" + (f" [{status}]" if status else ""))
    return "; ".join(parts)


def summarise(hosts: Iterable[Any]) -> list[HostFabric]:
    """One row per host whose report has a rails map or NCCL transports (fleet HostEntry)."""
    rows = []
    for entry in hosts:
        report = getattr(entry, "report", None) or {}
        rails, transports = _rails(report), _transports(report)
        if rails or transports:
            rows.append(HostFabric(entry.host, rails, transports))
    return rows
