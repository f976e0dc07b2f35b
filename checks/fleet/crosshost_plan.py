"""Controller side of the cross-host stage: plan the groups, judge them, name the culprits.

Modes: `all` puts every host in one torchrun group; `pairs` runs hosts in pairs, then in pairs
shifted by one, so each host meets two partners: a host whose every pair fails while its
partners pass elsewhere is the suspect; a pair that fails while both hosts pass elsewhere is a
bad link. Inside a failed group the culprit is the host that never reported (did not join or
unreachable), else the one whose ranks made the least progress (a hang), else the one whose rank
crashed on its own (peers that lost it are not blamed); a host whose agent could not reach the
rendezvous at all is named before the hosts that waited for it.

Bandwidth: a group that finished is still slow when its all-reduce busbw (the lowest its hosts
measured) is below the plan's floor (`min_busbw_gbs`, from `plan --min-busbw-gbs`), or more than
`slow_pct` per cent below the best group of the run. In one group the ring runs at its slowest
link, so only pairs mode can tell the slow host (every pair with it is slow) from a slow link
(one pair slow, both hosts fast with their other partner); in `all` mode the floor fails the group.

Node reports live in reports/<run-id>/crosshost/<group>/<host>.json; `merge` folds each host's
results into reports/<run-id>/<host>.json (victims of another host's fault become WARN naming the
culprit), so the fleet report, HTML, Prometheus and Slurm see them like any other check.

Per-rail runs (`rails` in the plan, checks/node/rails.py): the mode's rounds once per rail, each group
pinned to one rail. The bandwidth rule compares every group of the run (all rails of one fabric
should measure alike), and pairs mode judges each rail on its own: a host whose every pair on
rail1 is slow while its rail0 pairs are fine is named with that rail (`rail_suspects`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from checks import cliutil
from checks.node.rails import Rail, parse_rails
from checks.supervise.launch import PEER_LOSS

XHOST_IDS = ("xhost-collective", "xhost-ddp")
BUSBW_FIGURE = "xhost_allreduce_busbw_gbs"
# Pairs of one fabric should measure alike; at less than half of the best pair a link is broken
# (a port at a lower rate, a flapping link, traffic on the wrong interface), not noisy.
DEFAULT_SLOW_PCT = 50.0


def _groups(hosts: list[str], shift: int) -> list[list[str]]:
    order = hosts[shift:] + hosts[:shift]
    groups = [order[i:i + 2] for i in range(0, len(order) - 1, 2)]
    if len(order) % 2:  # the odd one out joins the last pair
        groups[-1].append(order[-1])
    return groups


def _layouts(hosts: list[str], mode: str) -> list[list[list[str]]]:
    if mode == "all":
        return [[list(hosts)]]
    if mode == "pairs":
        layouts = [_groups(hosts, 0)]
        shifted = _groups(hosts, 1)
        if {frozenset(g) for g in shifted} != {frozenset(g) for g in layouts[0]}:
            layouts.append(shifted)
        return layouts
    raise ValueError(f"unknown mode {mode!r} (all, pairs)")


def _rounds(layouts: list[list[list[str]]], addresses: dict[str, str], base_port: int, run_id: str,
            rails: list[Rail] | None) -> list[list[dict[str, Any]]]:
    rounds: list[list[dict[str, Any]]] = []
    port = base_port
    pinned: list[Rail | None] = list(rails) if rails else [None]
    for rail in pinned:
        prefix = f"{rail.name}-" if rail else ""
        for r, layout in enumerate(layouts):
            groups: list[dict[str, Any]] = []
            for g, members in enumerate(layout):
                leader = members[0]
                group: dict[str, Any] = {"id": f"{prefix}r{r}g{g}", "hosts": members, "port": port,
                                         "endpoint": f"{addresses.get(leader, leader)}:{port}",
                                         "rdzv_id": f"{run_id}-{prefix}r{r}g{g}"}
                if rail:
                    group["rail"] = rail.to_dict()
                groups.append(group)
                port += 1
            rounds.append(groups)
    return rounds


def _by_host(hosts: list[str], rounds: list[list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    by_host: dict[str, list[dict[str, Any]]] = {h: [] for h in hosts}
    for groups in rounds:
        for group in groups:
            for rank, host in enumerate(group["hosts"]):
                by_host[host].append({"group": group["id"], "nnodes": len(group["hosts"]),
                                      "node_rank": rank, "endpoint": group["endpoint"],
                                      "rdzv_id": group["rdzv_id"],
                                      **({"rail": group["rail"]} if "rail" in group else {})})
    return by_host


def plan(hosts: list[str], mode: str = "all", base_port: int = 29400, run_id: str = "nodecert",
         addresses: dict[str, str] | None = None, min_busbw_gbs: float | None = None,
         slow_pct: float = DEFAULT_SLOW_PCT, rails: list[Rail] | None = None) -> dict[str, Any]:
    """Rounds of groups; each group has its leader (first host: rendezvous endpoint), port and id.
    Groups of a round get distinct ports, so several can share one machine in tests. The
    bandwidth rule travels with the plan, so the merge judges by what was planned. With `rails`
    the mode's rounds repeat once per rail (one rail at a time), each group carrying its rail;
    the rendezvous stays on the hosts' addresses, the data moves over the rail."""
    if min_busbw_gbs is not None and min_busbw_gbs <= 0:
        raise ValueError(f"min_busbw_gbs must be > 0 (got {min_busbw_gbs:g})")
    if not 0 < slow_pct < 100:
        raise ValueError(f"slow_pct must be between 0 and 100 (got {slow_pct:g})")
    if len(hosts) < 2:
        return {"mode": mode, "rounds": [], "reason": "fewer than 2 hosts: nothing to pair"}
    if len(set(hosts)) != len(hosts):
        raise ValueError("duplicate host names")
    addresses = addresses or {}
    rounds = _rounds(_layouts(hosts, mode), addresses, base_port, run_id, rails)
    by_host = _by_host(hosts, rounds)
    out: dict[str, Any] = {"mode": mode, "rounds": rounds, "hosts": by_host,
           "busbw_rule": {"min_busbw_gbs": min_busbw_gbs, "slow_pct": slow_pct}}
    if rails:
        out["rails"] = [r.to_dict() for r in rails]
    return out


@dataclass
class GroupVerdict:
    id: str
    hosts: list[str]
    ok: bool
    culprits: list[str] = field(default_factory=list)
    reason: str = ""
    busbw_gbs: float | None = None  # the lowest all-reduce busbw its hosts measured
    slow: bool = False              # finished, but below the bandwidth rule
    host_evidence: bool = False     # culprits named from their own state, not from the pairing
    rail: dict[str, Any] | None = None  # per-rail run: the rail this group was pinned to
    best_gbs: float | None = None   # the best group's busbw the slow rule compared with

    @property
    def rail_label(self) -> str:
        return Rail.from_dict(self.rail).label if self.rail else ""

    def to_dict(self) -> dict[str, Any]:
        out = {"id": self.id, "hosts": self.hosts, "ok": self.ok, "culprits": self.culprits,
               "reason": self.reason, "busbw_gbs": self.busbw_gbs, "slow": self.slow}
        if self.rail:
            out.update(rail=self.rail, best_gbs=self.best_gbs)
        return out


@dataclass
class Analysis:
    mode: str
    groups: list[GroupVerdict]
    suspects: list[str] = field(default_factory=list)  # hosts to blame
    bad_links: list[list[str]] = field(default_factory=list)
    # Per-rail runs: [{"host", "rail", "hca", "ifname"}] and [{"hosts", "rail", ...}]
    rail_suspects: list[dict[str, Any]] = field(default_factory=list)
    rail_links: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out = {"mode": self.mode, "groups": [g.to_dict() for g in self.groups],
               "suspects": self.suspects, "bad_links": self.bad_links}
        if any(g.rail for g in self.groups):
            out.update(rail_suspects=self.rail_suspects, rail_links=self.rail_links)
        return out


def _results(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for c in report.get("checks", []) if c["id"] in XHOST_IDS for r in c["results"]]


def _busbw(reports: dict[str, dict[str, Any]], hosts: list[str]) -> float | None:
    seen = [float(f) for h in hosts for c in reports[h].get("checks", [])
            if c["id"] == "xhost-collective" for r in c["results"]
            if (f := ((r.get("details") or {}).get("figures") or {}).get(BUSBW_FIGURE)) is not None]
    return min(seen) if len(seen) == len(hosts) else None


def _rendezvous_unreachable(reports: dict[str, dict[str, Any]], hosts: list[str]) -> list[str]:
    return [h for h in hosts for r in _results(reports[h])
            if (r.get("details") or {}).get("rendezvous") == "unreachable"]


def _misaddressed(reports: dict[str, dict[str, Any]], hosts: list[str]) -> dict[str, Any]:
    return {h: (r.get("details") or {})["address"] for h in hosts for r in _results(reports[h])
            if ((r.get("details") or {}).get("address") or {}).get("mismatch")}


def _misaddressed_reason(host: str, view: dict[str, Any]) -> str:
    if view.get("ifname"):
        where = (f"--ifname {view['ifname']} has address {view.get('ifname_address') or 'none'}")
        fix = "name the interface that reaches the other hosts"
    else:
        where = ("its hostname resolves to "
                 + (", ".join(view.get("hostname_addresses") or []) or "nothing"))
        fix = "set --ifname (nodecert_ifname) or fix the hostname's address"
    return (f"{host}: {where}, but it reaches the rendezvous from {view.get('route_source')}: "
            f"gloo/NCCL sockets used an address the others cannot reach; {fix}")


def _judge_group(group: dict[str, Any], reports: dict[str, dict[str, Any]]) -> GroupVerdict:
    hosts = group["hosts"]
    missing = [h for h in hosts if h not in reports]
    if missing:
        return GroupVerdict(group["id"], hosts, False, missing,
                            f"{', '.join(missing)} did not report (unreachable, or never joined "
                            "the rendezvous)")
    failed = {h: [r for r in _results(rep) if r["status"] in ("FAIL", "ERROR")]
              for h, rep in reports.items() if h in hosts}
    if not any(failed.values()):
        return GroupVerdict(group["id"], hosts, True, busbw_gbs=_busbw(reports, hosts))
    misaddressed = _misaddressed(reports, hosts)
    if misaddressed:
        return GroupVerdict(group["id"], hosts, False, sorted(misaddressed), "; ".join(
            _misaddressed_reason(h, v) for h, v in sorted(misaddressed.items())),
            host_evidence=True)
    cut_off = _rendezvous_unreachable(reports, hosts)
    endpoint = group.get("endpoint", "")
    if cut_off and len(cut_off) == len(hosts) - 1 and hosts[0] not in cut_off and len(hosts) > 2:
        return GroupVerdict(group["id"], hosts, False, [hosts[0]],
                            f"no other host could reach the rendezvous endpoint {endpoint} on "
                            f"{hosts[0]}")
    if cut_off and len(cut_off) < len(hosts):
        named = sorted(cut_off) + ([hosts[0]] if len(hosts) == 2 else [])
        return GroupVerdict(group["id"], hosts, False, named,
                            f"{', '.join(sorted(cut_off))} could not reach the rendezvous "
                            f"endpoint {endpoint} on {hosts[0]}"
                            + ("; with two hosts either end may be at fault" if len(hosts) == 2
                               else "; the others waited for it"))
    ranks: dict[str, dict[str, Any]] = {}  # global rank -> state, with the host that reported it
    for host in hosts:
        for result in failed[host]:
            for rank, view in (result.get("details", {}).get("ranks") or {}).items():
                ranks.setdefault(rank, {**view, "reported_by": host})
    own = [v for v in ranks.values() if v.get("state") == "crashed" or
           (v.get("state") == "error" and not PEER_LOSS.search(v.get("error") or ""))]
    if own:
        culprits = sorted({v["reported_by"] for v in own})
        reason = "; ".join(f"rank on {v['reported_by']} {v['state']} after '{v.get('phase')}'"
                           + (f": {v['error']}" if v.get("error") else "") for v in own)
        return GroupVerdict(group["id"], hosts, False, culprits, reason)
    progress = [v for v in ranks.values() if v.get("seq") is not None]
    if progress:
        low = min(int(v["seq"]) for v in progress)
        stuck = [v for v in progress if int(v["seq"]) == low]
        if len(stuck) < len(progress):  # some ranks got further: the least advanced stopped first
            culprits = sorted({v["reported_by"] for v in stuck})
            return GroupVerdict(group["id"], hosts, False, culprits,
                                f"ranks on {', '.join(culprits)} stopped first (last heartbeat "
                                f"'{stuck[0].get('phase')}'); the others waited on them")
    culprits = sorted(h for h, bad in failed.items() if bad)
    first = next(r for h in culprits for r in failed[h])
    return GroupVerdict(group["id"], hosts, False, culprits, first["message"])


def analyse(the_plan: dict[str, Any], node_reports: dict[str, dict[str, dict[str, Any]]]
            ) -> Analysis:
    """`node_reports[group_id][host]` = that host's cross-host report for the group."""
    verdicts = []
    for groups in the_plan.get("rounds", []):
        for g in groups:
            verdict = _judge_group(g, node_reports.get(g["id"], {}))
            verdict.rail = g.get("rail")
            verdicts.append(verdict)
    _apply_busbw_rule(verdicts, the_plan.get("busbw_rule") or {})
    analysis = Analysis(the_plan.get("mode", "all"), verdicts)
    # Each rail is judged on its own: a host slow on rail1 is not excused by its rail0 pairs.
    by_rail: dict[str, list[GroupVerdict]] = {}
    for v in verdicts:
        by_rail.setdefault((v.rail or {}).get("name", ""), []).append(v)
    suspects: set[str] = set()
    for rail_name, members in by_rail.items():
        if analysis.mode == "pairs":
            named, links = _pairs_culprits(members)
        else:
            named = sorted({c for v in members if not v.ok for c in v.culprits})
            links = []
        suspects |= set(named)
        for link in links:
            if link not in analysis.bad_links:
                analysis.bad_links.append(link)
        rail = members[0].rail
        if rail:
            analysis.rail_suspects += [{"host": h, "rail": rail_name, "hca": rail.get("hca"),
                                        "ifname": rail.get("ifname")} for h in named]
            analysis.rail_links += [{"hosts": link, "rail": rail_name, "hca": rail.get("hca"),
                                     "ifname": rail.get("ifname")} for link in links]
    analysis.suspects = sorted(suspects)
    return analysis


def _pairs_culprits(verdicts: list[GroupVerdict]) -> tuple[list[str], list[list[str]]]:
    """Pairs mode over the groups of one rail (or of a run without rails): the hosts that failed
    in every group (suspects) and the pairs that failed while both hosts passed elsewhere."""
    ok_hosts = {h for v in verdicts if v.ok for h in v.hosts}
    links = [v.hosts for v in verdicts
             if not v.ok and not v.host_evidence and all(h in ok_hosts for h in v.hosts)]
    every_failed = {h for v in verdicts for h in v.hosts} - ok_hosts
    every_failed |= {h for v in verdicts if v.host_evidence for h in v.culprits}
    # Pairs know more than one group: blame the suspect in a group, or the link itself.
    for v in verdicts:
        if not v.ok:
            named = [h for h in v.hosts if h in every_failed]
            v.culprits = named or (list(v.hosts) if v.slow or not v.culprits else v.culprits)
    return sorted(every_failed), links


def _apply_busbw_rule(verdicts: list[GroupVerdict], rule: dict[str, Any]) -> None:
    floor = rule.get("min_busbw_gbs")
    pct = float(rule.get("slow_pct") or DEFAULT_SLOW_PCT)
    measured = [v for v in verdicts if v.ok and v.busbw_gbs is not None]
    figures = [v.busbw_gbs for v in measured if v.busbw_gbs is not None]
    best = max(figures) if len(figures) > 1 else None
    for v in measured:
        assert v.busbw_gbs is not None
        why = []
        if floor is not None and v.busbw_gbs < float(floor):
            why.append(f"below the floor of {float(floor):g} GB/s")
        if best and v.busbw_gbs < best * (1 - pct / 100):
            what = "rail" if v.rail else "group"
            why.append(f"more than {pct:g} % below the best {what} ({best:.3g} GB/s)")
        if why:
            v.ok, v.slow, v.culprits, v.best_gbs = False, True, list(v.hosts), best
            v.reason = f"all-reduce busbw {v.busbw_gbs:.3g} GB/s, {' and '.join(why)}"


# What malformed cross-host files raise while they are judged or merged (a group that is not a
# mapping, a check without results, a figure that is a string): that file is not trusted.
MALFORMED = (KeyError, TypeError, ValueError, AttributeError, IndexError, RecursionError, OverflowError)


def _read_json(path: Path) -> Any:
    """The JSON at `path` through the report loader's bounded reader (a FIFO or device is never
    waited on, the size is capped, a 4 000-digit integer or a key named twice refused), its
    control and bidirectional characters escaped (load.cleaned: a node's message reaches the
    terminal through the analysis); raises OSError or ValueError."""
    from checks.report import load

    raw = load.read_regular(path)
    try:
        return load.cleaned(load.parse_json(raw), raw)
    except RecursionError:
        raise ValueError("nested too deep") from None


def _node_report_ok(doc: Any) -> bool:
    """A cross-host node report shaped as merge() reads it: checks with an id and results."""
    if not isinstance(doc, dict) or not isinstance(doc.get("checks"), list):
        return False
    for chk in doc["checks"]:
        if not isinstance(chk, dict) or not isinstance(chk.get("id"), str):
            return False
        results = chk.get("results")
        if not isinstance(results, list) or not all(
                isinstance(r, dict) and isinstance(r.get("status"), str) and isinstance(r.get("message"), str)
                and isinstance(r.get("details") or {}, dict) for r in results):
            return False
    return True


def load_node_reports(crosshost_dir: Path) -> dict[str, dict[str, dict[str, Any]]]:
    found: dict[str, dict[str, dict[str, Any]]] = {}
    for path in sorted(crosshost_dir.glob("*/*.json")):
        try:
            doc = _read_json(path)
        except (OSError, ValueError):
            continue  # an unreadable node report counts as "did not report"
        if _node_report_ok(doc):
            found.setdefault(path.parent.name, {})[path.stem] = doc
    return found


def _warn(message: str) -> None:
    print(f"warning: {' '.join(message.split())[:300]}", file=sys.stderr)


def merge(run_dir: str | Path) -> Analysis | None:
    """Fold reports/<run>/crosshost/ into the host reports; None when there is no cross-host
    stage in this run, or when its plan cannot be read or judged (one warning line: the host
    reports are then left as they are, and the fleet is still reported)."""
    run_dir = Path(run_dir)
    cross = run_dir / "crosshost"
    plan_file = cross / "plan.json"
    if not plan_file.exists() and not plan_file.is_symlink():
        return None
    try:
        the_plan = _read_json(plan_file)
        if not isinstance(the_plan, dict):
            raise ValueError("not a JSON object")
        nodes = load_node_reports(cross)
        analysis = analyse(the_plan, nodes)
        summary = json.dumps(analysis.to_dict(), indent=2) + "\n"
    except (OSError, *MALFORMED) as exc:
        _warn(f"{plan_file}: cannot be judged ({exc.__class__.__name__}: {exc}); cross-host stage not merged")
        return None
    _write(cross / "analysis.json", summary)
    for host_file in sorted(run_dir.glob("*.json")):
        try:
            _merge_host(host_file, analysis, nodes)
        except (OSError, *MALFORMED) as exc:
            _warn(f"{host_file}: cross-host results not merged ({exc.__class__.__name__}: {exc})")
    return analysis


def _write(path: Path, text: str) -> None:
    """Replace `path` with a new file: a symlink planted there is never written through."""
    tmp = path.with_name(f".{path.name}.xhost.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.replace(tmp, path)


def _merge_host(host_file: Path, analysis: Analysis, nodes: dict[str, dict[str, dict[str, Any]]]) -> None:
    host = host_file.stem
    if host_file.is_symlink():
        return  # the report loader refuses it too
    try:
        report = _read_json(host_file)
    except (OSError, ValueError):
        return  # the report loader says why
    if not _node_report_ok(report):
        return
    checks = [c for c in report["checks"] if c["id"] not in XHOST_IDS]
    for verdict in analysis.groups:
        members = nodes.get(verdict.id, {})
        if host in members:
            checks += [_attribute(chk, host, verdict)
                       for chk in members[host]["checks"] if chk["id"] in XHOST_IDS]
        elif host in verdict.hosts:
            checks.append(_absent(host, verdict))
    report["checks"] = checks
    _resummarise(report)
    _write(host_file, json.dumps(report, indent=2) + "\n")


def _attribute(chk: dict[str, Any], host: str, verdict: GroupVerdict | None) -> dict[str, Any]:
    """A host that failed only because another host broke the group is a victim: WARN."""
    chk = json.loads(json.dumps(chk))
    group = (chk["results"][0].get("details") or {}).get("group")
    rail = verdict.rail_label if verdict else ""
    on_rail = f" on {rail}" if rail else ""
    for result in chk["results"]:
        result["details"]["group_verdict"] = verdict.to_dict() if verdict else None
        if rail and not result["message"].startswith(rail):
            result["message"] = f"{rail}: {result['message']}"
        if not verdict or verdict.ok:
            continue
        slow_pass = verdict.slow and result["status"] == "PASS" and chk["id"] == "xhost-collective"
        if host not in verdict.culprits and (result["status"] in ("FAIL", "ERROR") or slow_pass):
            # A WARN carries a fault code (report schema); a PASS that became a WARN had none.
            result["status"] = "WARN"
            result["fault_code"] = result.get("fault_code") or chk.get("code", "XHOST001")
            result["message"] = (f"group {group}{on_rail} failed because of "
                                 f"{', '.join(verdict.culprits)} ({verdict.reason}); this host's "
                                 f"own view: {result['message']}")
        elif slow_pass and rail:
            others = [h for h in verdict.hosts if h != host]
            best = f" vs best rail {verdict.best_gbs:.3g} GB/s" if verdict.best_gbs else ""
            result["status"], result["fault_code"] = "FAIL", chk.get("code", "XHOST001")
            result["message"] = (f"{host} {rail} too slow: {verdict.busbw_gbs:.3g} GB/s{best} "
                                 f"(group {group} with {', '.join(others)}: {verdict.reason})")
        elif slow_pass:
            others = [h for h in verdict.hosts if h != host]
            result["status"], result["fault_code"] = "FAIL", chk.get("code", "XHOST001")
            result["message"] = (f"too slow across hosts in group {group} with "
                                 f"{', '.join(others)}: {verdict.reason}")
            result["remedy"] = ("compare this host's link with the others: port rate and errors "
                                "(ethtool, ibstat), NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME, "
                                "traffic shaping, and the switch port")
    order = {"SKIP": 0, "PASS": 1, "WARN": 2, "ERROR": 3, "FAIL": 4}
    chk["status"] = max((r["status"] for r in chk["results"]), key=order.__getitem__)
    return chk


def _absent(host: str, verdict: GroupVerdict) -> dict[str, Any]:
    """The host's own report exists but it never reported for this group."""
    result = {"status": "FAIL", "value": None, "unit": None, "expected": "joins the group",
              "message": f"did not take part in cross-host group {verdict.id} "
                         + (f"on {verdict.rail_label} " if verdict.rail else "")
                         + f"[{', '.join(verdict.hosts)}]: {verdict.reason}",
              "remedy": "check that the host reaches the rendezvous endpoint (firewall, "
                        "NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME) and that its stage did not crash",
              "device": None, "fault_code": "XHOST001",
              "details": {"group_verdict": verdict.to_dict()}}
    return {"id": "xhost-collective", "code": "XHOST001", "title": "collectives across hosts",
            "level": "standard", "tags": ["crosshost"], "status": "FAIL", "duration_s": 0.0,
            "results": [result]}


def _resummarise(report: dict[str, Any]) -> None:
    statuses = [c["status"] for c in report["checks"]]
    report["summary"] = {s: statuses.count(s) for s in ("PASS", "WARN", "FAIL", "SKIP", "ERROR")}
    bad = any(s in ("FAIL", "ERROR") for s in statuses)
    report["verdict"], report["exit_code"] = ("FAIL", 1) if bad else ("PASS", 0)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m checks.fleet.crosshost_plan",
                                description="Print the groups (JSON) of the cross-host stage for a "
                                            "list of hosts; each host then runs python -m "
                                            "checks.node.crosshost_node for its group.")
    p.add_argument("--hosts", required=True, help="comma-separated, in inventory order")
    p.add_argument("--mode", choices=("all", "pairs"), default="all")
    p.add_argument("--base-port", type=int, default=29400)
    p.add_argument("--run-id", default="nodecert")
    p.add_argument("--addresses", help='JSON {"host": "address"} (default: the host names)')
    p.add_argument("--min-busbw-gbs", type=float, metavar="GB/S",
                   help="all-reduce busbw floor for every group (default: none; e.g. 80%% of "
                        "the NICs' line rate in GB/s)")
    p.add_argument("--slow-pct", type=float, default=DEFAULT_SLOW_PCT, metavar="PCT",
                   help="a group this many per cent below the best group is slow "
                        f"(default {DEFAULT_SLOW_PCT:g})")
    p.add_argument("--rails", metavar="NAME=HCA/IFNAME[@GPU],...",
                   help="per-rail runs: the mode's groups once per rail, each pinned to that "
                        "rail (e.g. rail0=mlx5_0/ens1,rail1=mlx5_1/ens2; HCA '-' for a plain "
                        "interface)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = cliutil.parse(build_parser(), argv)
    if isinstance(args, int):
        return args
    try:
        hosts = [h for h in args.hosts.split(",") if h]
        print(json.dumps(plan(hosts, args.mode, args.base_port, args.run_id,
                              addresses=json.loads(args.addresses) if args.addresses else None,
                              min_busbw_gbs=args.min_busbw_gbs, slow_pct=args.slow_pct,
                              rails=parse_rails(args.rails) if args.rails else None)))
    except (ValueError, json.JSONDecodeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
