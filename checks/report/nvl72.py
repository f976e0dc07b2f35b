"""NVL72 NVLink domains across the fleet: one cluster UUID / clique and one IMEX node list.

A tray alone cannot tell that it sits in the wrong NVLink domain: its GPUs registered, its IMEX
service runs. Only the fleet sees that the trays one IMEX node list names (one domain, as the
administrator configured it) report different cluster UUIDs or clique IDs (NCCL then uses the
network between them instead of multi-node NVLink: NVIDIA/nccl#1301), or that trays of one
cluster UUID were given different IMEX node lists (IMEX fails to initialise when the maps
differ: NVIDIA IMEX guide, "Deployment Models").

Input: the per-tray results of the node checks `nvl72-fabric` (details cluster_uuid, clique_id)
and `imex-service` (details nodes). Output: one finding per tray that disagrees with the majority
of its domain; aggregate.py turns them into the fleet check below.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

CHECK_ID = "nvl72-domain"
CODE = "FLT030"
TITLE = "NVL72: one cluster UUID, clique and IMEX node list per NVLink domain"


@dataclass(frozen=True)
class Tray:
    host: str
    cluster_uuid: str
    clique_id: int
    imex_nodes: tuple[str, ...] | None  # None: the tray's report has no IMEX node list
    # why its identity cannot be compared (a schema-valid report may give any JSON value in
    # details): that tray's ERROR, never a crash of the fleet report nor a tray left out
    problem: str | None = None

    @property
    def fabric(self) -> tuple[str, int]:
        return self.cluster_uuid, self.clique_id


@dataclass(frozen=True)
class Finding:
    host: str
    status: str
    message: str


def _details(report: Mapping[str, Any], check_id: str,
             statuses: tuple[str, ...] = ("PASS", "WARN", "FAIL", "ERROR")) -> dict[str, Any] | None:
    """The details of the first result of `check_id` with one of `statuses` that has any."""
    for chk in report.get("checks", []):
        if chk.get("id") == check_id:
            for result in chk.get("results", []):
                details = result.get("details")
                if isinstance(details, dict) and details and result.get("status") in statuses:
                    return details
    return None


def _identity_problem(uuid: Any, clique: Any, nodes: Any) -> str | None:
    """Why a tray's fabric identity is not what the node check writes: a cluster UUID (text), a
    clique ID (an integer) and an IMEX node list (names)."""
    if not isinstance(uuid, str):
        return f"cluster_uuid {uuid!r:.40} is not text"
    if type(clique) is not int:
        return f"clique_id {clique!r:.40} is not an integer"
    if nodes and not (isinstance(nodes, list) and all(isinstance(n, str) for n in nodes)):
        return f"the IMEX node list {nodes!r:.60} is not a list of node names"
    return None


def trays(reports: Iterable[tuple[str, Mapping[str, Any]]]) -> list[Tray]:
    """The hosts whose report has a tray-level fabric identity; one that is malformed has its
    `problem`."""
    found = []
    for host, report in reports:
        # Only a tray whose GPUs all registered has one identity (a failing tray is already
        # failed by its own report).
        fabric = _details(report, "nvl72-fabric", ("PASS",))
        if not fabric or "cluster_uuid" not in fabric:
            continue
        imex = _details(report, "imex-service")
        uuid, clique, nodes = fabric["cluster_uuid"], fabric.get("clique_id", 0), (imex or {}).get("nodes")
        problem = _identity_problem(uuid, clique, nodes)
        if problem:
            found.append(Tray(host, "", 0, None, problem))
        else:
            found.append(Tray(host, uuid, clique, tuple(sorted(nodes)) if nodes else None))
    return found


def _majority(values: list[Any]) -> Any | None:
    """The value most trays agree on; None when the top two tie (no side can be blamed)."""
    top = Counter(values).most_common(2)
    if len(top) == 2 and top[0][1] == top[1][1]:
        return None
    return top[0][0]


def _short(uuid: str) -> str:
    return uuid.split("-", 1)[0] + "-..."


def find(reports: Iterable[tuple[str, Mapping[str, Any]]]) -> list[Finding]:
    """Trays that disagree with their domain (FAIL), or whose identity cannot be read (ERROR),
    one finding per tray, sorted by host."""
    read = trays(reports)
    unreadable = [Finding(t.host, "ERROR", f"its NVLink domain cannot be checked: {t.problem}")
                  for t in read if t.problem]
    all_trays = [t for t in read if not t.problem]
    messages: dict[str, list[str]] = {}

    # 1. One IMEX node list = one domain as configured: its trays must report one fabric.
    by_imex: dict[tuple[str, ...], list[Tray]] = {}
    for tray in all_trays:
        if tray.imex_nodes:
            by_imex.setdefault(tray.imex_nodes, []).append(tray)
    for members in by_imex.values():
        if len(members) < 2:
            continue
        want = _majority([t.fabric for t in members])
        for tray in members:
            if want is None:
                if len({t.fabric for t in members}) > 1:
                    messages.setdefault(tray.host, []).append(
                        f"trays of one IMEX node list split evenly between NVLink domains; this "
                        f"tray reports {_short(tray.cluster_uuid)} / clique {tray.clique_id}")
            elif tray.fabric != want:
                others = sum(1 for t in members if t.fabric == want)
                messages.setdefault(tray.host, []).append(
                    f"reports cluster UUID {tray.cluster_uuid} / clique {tray.clique_id}; the "
                    f"other {others} tray(s) of its IMEX node list report {want[0]} / clique "
                    f"{want[1]}")

    # 2. One NVLink domain (cluster UUID and clique): its trays must share one IMEX node list.
    by_fabric: dict[tuple[str, int], list[Tray]] = {}
    for tray in all_trays:
        by_fabric.setdefault(tray.fabric, []).append(tray)
    for (uuid, clique), members in by_fabric.items():
        if len(members) < 2:
            continue
        want_nodes = _majority([t.imex_nodes for t in members])
        for tray in members:
            if want_nodes is None or tray.imex_nodes == want_nodes:
                continue
            if tray.imex_nodes is None:
                what = "has no IMEX node list"
            else:
                missing = sorted(set(want_nodes or ()) - set(tray.imex_nodes))
                extra = sorted(set(tray.imex_nodes) - set(want_nodes or ()))
                what = "IMEX node list differs (" + "; ".join(
                    part for part in (f"missing {', '.join(missing)}" if missing else "",
                                      f"extra {', '.join(extra)}" if extra else "") if part) + ")"
            messages.setdefault(tray.host, []).append(
                f"{what} from the other trays of NVLink domain {_short(uuid)} / clique {clique}")
    disagree = [Finding(host, "FAIL", "; ".join(parts)) for host, parts in messages.items()]
    return sorted([*unreadable, *disagree], key=lambda f: f.host)


def domains(reports: Iterable[tuple[str, dict[str, Any]]]) -> dict[tuple[str, int], list[str]]:
    """Hosts per NVLink domain (cluster UUID, clique), for reports and tests."""
    out: dict[tuple[str, int], list[str]] = {}
    for tray in trays(reports):
        if not tray.problem:
            out.setdefault(tray.fabric, []).append(tray.host)
    return {k: sorted(v) for k, v in out.items()}
