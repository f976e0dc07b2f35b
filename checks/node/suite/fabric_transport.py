"""Multi-node readiness as NCCL sees it: no NCCL variable silently cripples a job (any GPU host),
and, after the collective check, the transport NCCL really used."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from checks.environment import env_value
from checks.hw.base import HardwareError
from checks.hw.measure.nccl_log import NcclLog
from checks.model import Result, error, fail, passed, skip, warn
from checks.node import workload_plan as plan
from checks.node.context import Context
from checks.node.registry import Budget, Cost, check
from checks.node.suite import p2p
from checks.node.suite.fabric_links import active_ports, rdma_of
from checks.node.topology import NVLINK

# name -> (values that hurt (lowercase), status, why)
NCCL_ENV_RULES: dict[str, tuple[tuple[str, ...], str, str]] = {
    "NCCL_P2P_DISABLE": (("1",), "FAIL", "disables NVLink/PCIe peer-to-peer: in-node traffic "
                         "goes through host memory"),
    "NCCL_P2P_LEVEL": (("loc", "0"), "FAIL", "LOC forbids P2P between any two GPUs "
                       "(stale NCCL_P2P_LEVEL=LOC: NVIDIA/nccl-tests#228)"),
    "NCCL_SHM_DISABLE": (("1",), "WARN", "disables the shared-memory transport"),
    "NCCL_NVLS_ENABLE": (("0",), "WARN", "disables NVLink SHARP on NVSwitch systems"),
    "NCCL_IB_DISABLE": (("1",), "FAIL", "disables InfiniBand/RoCE: NCCL falls back to TCP "
                        "sockets across nodes"),
    "NCCL_NET": (("socket",), "FAIL", "forces the TCP socket transport across nodes"),
    "NCCL_NET_GDR_LEVEL": (("loc", "0"), "WARN", "disables GPUDirect RDMA"),
}
# Only harmful where RDMA devices exist.
RDMA_ONLY = {"NCCL_IB_DISABLE", "NCCL_NET", "NCCL_NET_GDR_LEVEL"}


def _names_match(spec: str, names: list[str]) -> list[str]:
    """NCCL's interface/HCA list syntax: comma-separated prefixes, '=' for exact names, a
    leading '^' to exclude. Returns the names the list would select."""
    exact = spec.startswith("=")
    exclude = spec.lstrip("=").startswith("^")
    items = [i.split(":")[0] for i in spec.lstrip("=^").split(",") if i]

    def hit(name: str) -> bool:
        return any(name == i if exact else name.startswith(i) for i in items)

    return [n for n in names if hit(n) != exclude]


@check("nccl-env", code="NET007", title="no NCCL variable silently cripples a job",
       stage="health", tags=("fabric", "nccl"),
       budget=Budget(value=8, cost=Cost(cpu=1, gpu=1), source="estimated"))
def nccl_env(ctx: Context) -> list[Result]:
    """NCCL_* variables in this environment that disable a transport (NCCL_P2P_DISABLE,
    NCCL_P2P_LEVEL=LOC, NCCL_IB_DISABLE, NCCL_NET=Socket, ...) or name nothing that exists
    (NCCL_SOCKET_IFNAME naming no interface, NCCL_IB_HCA naming no HCA). The InfiniBand ones
    only FAIL where RDMA devices exist."""
    env = ctx.hw.environ()
    # Values as a report may show them: secret-looking ones masked (checks/report_schema.py).
    seen = {k: env_value(k, v) for k, v in env.items() if k.startswith("NCCL_")}
    try:
        rdma = [d.name for d in rdma_of(ctx)]
    except HardwareError:
        rdma = []
    results = []
    for name, (bad, status, why) in NCCL_ENV_RULES.items():
        value = seen.get(name)
        if value is None or value.strip().lower() not in bad:
            continue
        text = f"{name}={value}: {why}"
        kw = {"value": f"{name}={value}", "expected": f"{name} unset",
              "remedy": f"unset {name} (shell profile, /etc/environment, the container image, "
                        "the job script or ~/.nccl.conf / /etc/nccl.conf)"}
        if name in RDMA_ONLY and not rdma:
            results.append(passed(f"{text} (harmless here: no RDMA device)", **kw))
        elif status == "FAIL":
            results.append(fail(text, **kw))
        else:
            results.append(warn(text, **kw))
    ifname = seen.get("NCCL_SOCKET_IFNAME")
    if ifname:
        interfaces = ctx.hw.net_interfaces()
        if interfaces is None:
            results.append(error(f"NCCL_SOCKET_IFNAME={ifname}: interfaces not listable"))
        elif not _names_match(ifname, interfaces):
            results.append(fail(f"NCCL_SOCKET_IFNAME={ifname} selects no interface of this host "
                                f"({', '.join(interfaces)}): NCCL cannot bootstrap",
                                value=ifname, expected=f"one of {', '.join(interfaces)}",
                                remedy="set it to this host's cluster interface, or unset it"))
    hca = seen.get("NCCL_IB_HCA")
    if hca and rdma and not _names_match(hca, rdma):
        results.append(fail(f"NCCL_IB_HCA={hca} selects none of the HCAs ({', '.join(rdma)}): "
                            "NCCL falls back to sockets", value=hca,
                            expected=f"one of {', '.join(rdma)}",
                            remedy="name this host's HCAs (mlx5_0,...) or unset it"))
    if not results:
        listed = ", ".join(f"{k}={v}" for k, v in sorted(seen.items())) or "none set"
        results.append(passed(f"no NCCL variable disables a transport ({listed})",
                              value=sorted(seen)))
    return results


# --- Proof of transport ---------------------------------------------------------------------
RankPair = tuple[int, int]  # (lower rank, higher rank)


@dataclass(frozen=True)
class TransportExpectation:
    """What the node says NCCL should have used."""

    cross_host: bool
    rdma_up: tuple[str, ...]  # ACTIVE RDMA ports ("mlx5_0:1")
    nvlink: bool  # the GPUs have active NVLinks: in-node traffic must be P2P (every pair)
    nvls: bool  # NVSwitch + Hopper or later: NVLS expected
    # Per pair of in-node ranks, where the GPUs are not joined through NVSwitches: the pairs
    # NVLink joins (bridges, a direct board: P2P expected) and the pairs only PCIe joins (SHM or
    # P2P, as NCCL picks by the path). None: every pair as `nvlink` says. A pair in neither
    # set could not be told (no NVLink peer named by NVML).
    nvlink_pairs: frozenset[RankPair] | None = None
    pcie_pairs: frozenset[RankPair] = frozenset()
    labels: tuple[str, ...] = ()  # rank -> its GPU ("GPU3"), where known


def _peers_named(place: Any) -> bool:
    """NVML says where this GPU's NVLinks go (a remote PCI address, the driver's NVLink P2P
    peers, a fabric clique or a switch)."""
    return bool(place.nvlink_remotes or place.nvlink_p2p or place.fabric_clique
                or place.nvlink_to_switch)


def rank_paths(ctx: Context) -> tuple[frozenset[RankPair], frozenset[RankPair],
                                      tuple[str, ...]]:
    """NVLink pairs and PCIe pairs of the ranks of a launch on this host: rank r runs on
    visible GPU r (one rank per GPU in CUDA order, checks/hw/visible.py launch_gpus), and each
    pair is classed as p2p-bandwidth classes it (checks/node/topology.py). Two GPUs whose links
    NVML names no peer for are an NVLink pair when they are the only GPUs of the node with
    active links (a bridge joins two cards); otherwise their pair is left unknown."""
    gpus = plan.visible_gpus(ctx)
    pcis = [g.device.pci for g in gpus]
    if not gpus or not all(pcis):
        return frozenset(), frozenset(), ()
    lay = p2p.layout(ctx, {"count": len(gpus), "pci": pcis})
    try:
        linked = [g for g in ctx.gpus if not g.lost and plan.nvlinks_up(g)]
    except HardwareError:
        linked = []
    nvlink, pcie = set(), set()
    for (i, j), cls in lay.classes().items():
        if i > j:
            continue
        a, b = lay.places[i], lay.places[j]
        if cls == NVLINK:
            nvlink.add((i, j))
        elif not (a.nvlinks_active and b.nvlinks_active) or _peers_named(a) or _peers_named(b):
            pcie.add((i, j))
        elif len(linked) == 2:
            nvlink.add((i, j))
    return frozenset(nvlink), frozenset(pcie), tuple(lay.labels)


def expectation(ctx: Context, cross_host: bool) -> TransportExpectation:
    try:
        up = active_ports(rdma_of(ctx))
    except HardwareError:
        up = ()
    try:
        gpus = [g for g in ctx.gpus if not g.lost]
    except HardwareError:
        gpus = []
    nvlink = any(plan.nvlinks_up(g) for g in gpus)
    cc_min = str(ctx.profile.get("nccl.nvls_min_compute_capability"))
    cc = None
    for g in gpus[:1]:
        try:
            cc = g.handle.query("compute_capability")
        except HardwareError:
            cc = None
    switched = plan.nvswitch_system(ctx, gpus)
    nvls = switched and cc is not None and tuple(cc) >= tuple(
        int(x) for x in cc_min.split("."))
    if switched or not nvlink or cross_host:
        return TransportExpectation(cross_host, up, nvlink, nvls)
    # Bridged cards (H100/H200 NVL, A100 PCIe pairs) or a direct board: judged pair by pair.
    pairs, pcie, labels = rank_paths(ctx)
    return TransportExpectation(cross_host, up, nvlink, nvls, pairs, pcie, labels)


def _pair(c: Any) -> RankPair:
    return (min(c.src, c.dst), max(c.src, c.dst))


def _pair_names(pairs: list[RankPair], labels: tuple[str, ...]) -> str:
    def name(rank: int) -> str:
        return f"rank {rank} ({labels[rank]})" if rank < len(labels) else f"rank {rank}"

    shown = ", ".join(f"{name(a)} - {name(b)}" for a, b in pairs[:6])
    return shown + (f" and {len(pairs) - 6} more" if len(pairs) > 6 else "")


def _in_node(log: NcclLog, exp: TransportExpectation,
             details: dict[str, Any]) -> tuple[list[str], list[str]]:
    """In-node connections over SHM (or NET) where NVLink should carry them: the problems,
    and a note for pairs whose path could not be told."""
    problems: list[str] = []
    notes: list[str] = []
    in_node_other = [c for c in log.connections
                     if c.transport == "SHM" or (c.transport == "NET" and not exp.cross_host)]
    unknown: list[Any] = []
    if exp.nvlink_pairs is None:
        on_nvlink = in_node_other if exp.nvlink else []
    else:
        on_nvlink = [c for c in in_node_other if _pair(c) in exp.nvlink_pairs]
        unknown = [c for c in in_node_other
                   if _pair(c) not in exp.nvlink_pairs and _pair(c) not in exp.pcie_pairs]
        details["expected"]["nvlink_pairs"] = sorted(exp.nvlink_pairs)
        details["expected"]["pcie_pairs"] = sorted(exp.pcie_pairs)
    if on_nvlink and exp.nvlink_pairs is None:
        kinds_bad = sorted({c.kind for c in on_nvlink})
        problems.append(f"in-node traffic via {', '.join(kinds_bad)} although the GPUs have "
                        "NVLink: P2P is disabled (NCCL_P2P_DISABLE / NCCL_P2P_LEVEL) or broken")
    elif on_nvlink:
        kinds_bad = sorted({c.kind for c in on_nvlink})
        pairs = sorted({_pair(c) for c in on_nvlink})
        problems.append(f"in-node traffic via {', '.join(kinds_bad)} between "
                        f"{_pair_names(pairs, exp.labels)}, whose GPUs NVLink joins: P2P is "
                        "disabled (NCCL_P2P_DISABLE / NCCL_P2P_LEVEL) or the bridge is broken")
    if unknown:
        pairs = sorted({_pair(c) for c in unknown})
        notes.append(f"{sorted({c.kind for c in unknown})[0]} between "
                     f"{_pair_names(pairs, exp.labels)}: NVML names no NVLink peer of these "
                     "GPUs, so whether a bridge joins them is unknown")
    return problems, notes


def judge_transport(log: NcclLog, exp: TransportExpectation) -> Result:
    """FAIL when the log shows a transport the node should not have used (see the module doc
    and docs/multinode.md); ERROR when the log cannot tell."""
    details: dict[str, Any] = {"nccl": log.summary(), "expected": {
        "cross_host": exp.cross_host, "rdma_up": list(exp.rdma_up), "nvlink": exp.nvlink,
        "nvls": exp.nvls}}
    if not log.info_lines:
        return error("no NCCL INFO line captured: cannot tell which transport NCCL used",
                     details=details, remedy="run with NCCL_DEBUG=INFO "
                     "NCCL_DEBUG_SUBSYS=INIT,NET,GRAPH (the check sets them; something "
                     "overrode them, e.g. NCCL_DEBUG_FILE)")
    if not log.connections:
        return error(f"{log.info_lines} NCCL INFO lines but no channel connection line: cannot "
                     "tell which transport carried the data", details=details)
    kinds = log.kinds
    summary = ", ".join(f"{k} x{n}" for k, n in sorted(kinds.items()))
    version = f"NCCL {log.versions[0]}: " if log.versions else ""
    problems, notes = _in_node(log, exp, details)
    unknown = bool(notes)
    if exp.cross_host:
        sockets = log.socket
        if not log.net:
            problems.append("no inter-node (NET) connection in the log")
        elif sockets and exp.rdma_up:
            where = ", ".join(log.socket_interfaces) or "a TCP interface"
            problems.append(f"{len(sockets)} inter-node connection(s) moved over NET/Socket "
                            f"({where}) while RDMA ports {', '.join(exp.rdma_up)} are ACTIVE")
        elif sockets:
            notes.append("NET/Socket across hosts (no RDMA port up on this host)")
        no_gdr = [c for c in log.net if c.network != "Socket" and not c.gdr]
        if no_gdr and exp.rdma_up:
            disabled = f" (NCCL: GPU Direct RDMA Disabled for {', '.join(log.gdr_disabled)})" \
                if log.gdr_disabled else ""
            problems.append(f"{len(no_gdr)} inter-node connection(s) over "
                            f"{sorted({c.kind for c in no_gdr})[0]} without GDRDMA{disabled}: "
                            "GPUDirect RDMA is off")
    if exp.nvls and log.nvls_used is False:
        notes.append("NVLS not used (multicast not available or 0 nvls channels)")
    details["problems"] = problems
    if problems:
        return fail(f"{version}{'; '.join(problems)} [{summary}]", value=kinds, details=details,
                    remedy="see gpudirect-rdma, rdma-ports and nccl-env; the NCCL INFO lines "
                           "'NET/IB : Using', 'Using network' and 'GPU Direct RDMA' say why")
    if unknown:
        return warn(f"{version}{'; '.join(notes)} [{summary}]", value=kinds, details=details,
                    remedy="nvidia-smi topo -m shows NV# for a bridged pair: a bridged pair "
                           "over SHM means P2P is disabled or the bridge is broken (see nvlink, "
                           "p2p-bandwidth and nccl-env)")
    if notes and exp.nvls and log.nvls_used is False:
        return warn(f"{version}{'; '.join(notes)} [{summary}]", value=kinds, details=details,
                    remedy="NVLS needs Fabric Manager, CUDA >= 12.1 and NCCL >= 2.17; check "
                           "NCCL_NVLS_ENABLE and the fabric-manager check")
    note = f" ({'; '.join(notes)})" if notes else ""
    return passed(f"{version}{summary}{note}", value=kinds, details=details)


@check("nccl-transport", code="NET008",
       title="NCCL used the expected transports (P2P in node, IB+GDRDMA across nodes, NVLS)",
       level="standard", stage="workload", tags=("fabric", "nccl", "collective"),
       nvml=("compute_capability", "nvlink", "fabric_info", "nvlink_p2p_peers"),
       # reads the log of the nccl-allreduce launch (no launch of its own)
       budget=Budget(value=8, cost=Cost(cpu=1, gpu=1), source="estimated", min_gpus=2))
def nccl_transport(ctx: Context) -> Result:
    """Reads the NCCL INFO log the nccl-allreduce check captured and judges the transport of
    every channel against the node: in-node P2P where the GPUs have NVLink (every pair on an
    NVSwitch node; on bridged cards each pair NVLink joins, while a pair only PCIe joins may use
    SHM or P2P; WARN for a pair over SHM whose NVLink peer NVML does not name), NVLS on NVSwitch
    nodes that support it (WARN when missing). SKIP on CPU (gloo has no NCCL transport)."""
    outcome = ctx.outcomes.get("nccl-allreduce")
    if outcome is None:
        return skip("nccl-allreduce did not run: no NCCL log to read")
    details = outcome.results[0].details if outcome.results else {}
    if details.get("backend") != "nccl":
        return skip(f"the collective ran on {details.get('backend') or 'no'} backend (CPU "
                    "processes): no NCCL transport to prove")
    raw = details.get("nccl_log")
    if raw is None and ctx.hw.simulated:
        return skip("the scenario records no NCCL log (measurements.collectives.nccl_log)")
    if raw is None:
        return error("nccl-allreduce ran on NCCL but no NCCL log was captured")
    return judge_transport(NcclLog.from_dict(raw), expectation(ctx, cross_host=False))
