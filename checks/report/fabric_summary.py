"""Per-host fabric summary for the fleet views: each GPU's nearest NIC (the rails map of check
rdma-rails), the transports NCCL used (nccl-allreduce in the node, xhost-collective across
hosts, judged by nccl-transport / the cross-host stage), and the per-rail cross-host runs (each
rail's busbw and verdict, worst over its groups). Read from the host reports' details."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from checks.report import summary

TRANSPORT_SOURCES = ("xhost-collective", "nccl-allreduce")
# every check read here: a fleet's summary keeps them at hand (summary.SIDE_CHECKS, a test holds
# this set within it)
READS = frozenset({"rdma-rails", "nccl-transport", *TRANSPORT_SOURCES})


@dataclass(frozen=True)
class HostFabric:
    host: str
    rails: str  # "GPU0->mlx5_0 (pcie-switch), GPU1->mlx5_3 (pcie-switch), ..."
    transports: str  # "xhost-collective: NET/IB+GDRDMA x16, P2P x48 [PASS]"
    rail_runs: str = ""  # "rail0 (mlx5_0/ens1) 41.2 GB/s PASS; rail1 (mlx5_1/ens2) 3.1 GB/s FAIL"


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


STATUS_ORDER = ("PASS", "SKIP", "WARN", "ERROR", "FAIL")


def _rail_runs(report: dict[str, Any]) -> str:
    """Per rail of the cross-host stage: the lowest busbw this host measured on it and the worst
    status of its groups (the merged results carry the rail in details.rail)."""
    rails: dict[str, dict[str, Any]] = {}
    for chk in report.get("checks") or []:
        if chk.get("id") != "xhost-collective":
            continue
        for result in chk.get("results") or []:
            details = result.get("details") or {}
            rail = details.get("rail")
            if not rail:
                continue
            row = rails.setdefault(rail["name"], {"rail": rail, "gbs": None, "status": "PASS"})
            gbs = (details.get("figures") or {}).get("xhost_allreduce_busbw_gbs")
            if gbs is not None:
                row["gbs"] = gbs if row["gbs"] is None else min(row["gbs"], gbs)
            status = str(result.get("status") or "ERROR")
            if STATUS_ORDER.index(status) > STATUS_ORDER.index(row["status"]):
                row["status"] = status
    parts = []
    for name, row in sorted(rails.items()):
        rail = row["rail"]
        figure = f"{row['gbs']:.3g} GB/s " if row["gbs"] is not None else "no figure "
        parts.append(f"{name} ({rail.get('hca') or '-'}/{rail.get('ifname')}) {figure}"
                     f"{row['status']}")
    return "; ".join(parts)


def summarise(hosts: Iterable[Any]) -> list[HostFabric]:
    """One row per host whose report has a rails map, NCCL transports or per-rail cross-host
    runs (fleet HostEntry)."""
    rows = []
    for entry in hosts:
        # the only checks read here, without unpacking a fleet's summary (summary.Packed)
        report = {"checks": summary.side_checks(getattr(entry, "report", None) or {})}
        rails, transports, runs = _rails(report), _transports(report), _rail_runs(report)
        if rails or transports or runs:
            rows.append(HostFabric(entry.host, rails, transports, runs))
    return rows
