"""Fleet aggregation: many host reports of one run → one verdict, who failed what, stragglers.

A host is named by its report's file name (the playbook fetches reports/<run-id>/<host>.json with
the inventory name); the hostname recorded inside the report is kept as `hostname`.

Host status in the fleet:
  PASS     report PASS, no WARN result, no finding
  WARN     report PASS with WARN results, or a WARN finding
  FAIL     report FAIL (any FAIL or ERROR result), or a FAIL finding
  ERROR    report unreadable (not JSON, or not valid against the report schema)
  MISSING  expected (inventory) but no report; the caller's reason, e.g. "unreachable"
The fleet passes when every host is PASS or WARN.

Findings are the fleet's own verdicts on a host, which its report cannot give: a straggler, a
GPU computing other bits than its group (digest), a figure drifting from its own history, a lemon
GPU (the last two come from the history: set_drift, set_lemons). Each one is listed in the host's
entry (`findings`, one line `reason` each: what a drain reason names) and raises its status.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from checks import profiles
from checks.model import Status
from checks.report import digest_groups as digests_
from checks.report import figures as figs
from checks.report import gpu_identity, nvl72
from checks.report import load as loader
from checks.report import stragglers as strag
from checks.report import summary as summary_
from checks.report.findings import Drift, Finding, HostEntry, Lemon

SCHEMA_VERSION = "1.2"
HOST_STATUSES = ("PASS", "WARN", "FAIL", "ERROR", "MISSING")
PROBLEM_STATUSES = ("FAIL", "ERROR", "MISSING")


@dataclass
class Occurrence:
    """One host's non-passing results for one check."""

    host: str
    status: str
    message: str
    gpus: list[str]

    def to_dict(self) -> dict[str, Any]:
        return vars(self).copy()


@dataclass
class CheckSpread:
    """Which hosts one check did not pass on."""

    check: str
    code: str
    title: str
    occurrences: list[Occurrence]

    @property
    def status(self) -> str:
        return str(max((Status(o.status) for o in self.occurrences), key=lambda s: s.severity))

    def to_dict(self) -> dict[str, Any]:
        return {"check": self.check, "code": self.code, "title": self.title, "status": self.status,
                "hosts": [o.to_dict() for o in self.occurrences]}


@dataclass
class Fleet:
    run_id: str | None
    source: str | None
    hosts: list[HostEntry]
    by_check: list[CheckSpread]
    figure_stats: list[strag.FigureStats]
    stragglers: list[strag.Straggler]
    figure_groups: dict[strag.PeerKey, list[figs.Figure]]
    curves: list[figs.Curve]
    lemons: list[Lemon] = field(default_factory=list)  # filled in from the history by the caller
    drift: list[Drift] = field(default_factory=list)  # every figure judged against its own history
    digests: digests_.Analysis | None = None  # reference digests grouped by stack
    history_run: str | None = None  # the key this run is recorded under in the history
    generated_at: str = field(default_factory=lambda: dt.datetime.now(dt.timezone.utc).isoformat())

    @property
    def summary(self) -> dict[str, int]:
        counts = Counter(h.status for h in self.hosts)
        return {"hosts": len(self.hosts), **{s: counts.get(s, 0) for s in HOST_STATUSES}}

    @property
    def site_policies(self) -> dict[str, int]:
        """Hosts per site policy they ran under ("package" for none): one policy is the rule; two
        say some nodes judge with other thresholds than their peers."""
        counts = Counter(h.site or "package" for h in self.hosts if h.report is not None)
        return dict(sorted(counts.items()))

    @property
    def verdict(self) -> str:
        return "FAIL" if any(h.status in PROBLEM_STATUSES for h in self.hosts) else "PASS"

    @property
    def exit_code(self) -> int:
        return 1 if self.verdict == "FAIL" else 0

    @property
    def drifts(self) -> list[Drift]:
        """The figures drifting below their own baseline (WARN or FAIL)."""
        return [d for d in self.drift if d.status]

    def set_drift(self, drift: list[Drift]) -> None:
        """Attach drift verdicts (drift.find) and fold them into the host statuses."""
        self.drift = drift
        _add_findings(self.hosts, "drift", [(d.host, _drift_finding(d)) for d in drift if d.status])

    def set_lemons(self, lemons: list[Lemon]) -> None:
        """Attach the history's lemons; a host holding a lemon GPU in this run FAILs (the GPU is
        to be replaced: it failed in N of the last M runs, whether or not it failed this time)."""
        self.lemons = lemons
        # the walk over every host's checks only for lemons' UUIDs (most runs have none)
        where = _gpus_by_uuid(self.hosts, {lemon.uuid for lemon in lemons}) if lemons else {}
        _add_findings(self.hosts, "lemon", [
            (where[lemon.uuid][0], _lemon_finding(lemon, where[lemon.uuid][1]))
            for lemon in lemons if lemon.uuid in where])

    @property
    def reports(self) -> list[Mapping[str, Any]]:
        """The readable reports, each with `host` set to the fleet's name for it: their summaries
        (summary.py, same shape) when the fleet was read from a directory (read, load)."""
        return [h.report for h in self.hosts if h.report is not None]

    def to_dict(self) -> dict[str, Any]:
        return self._dict([h.to_dict() for h in self.hosts])

    def json_chunks(self, extra: Mapping[str, Any] | None = None) -> Iterator[str]:
        """json.dumps({**to_dict(), **extra}, indent=2) + "\n", one host entry at a time (the
        hosts' entries are never all built at once)."""
        head = {**self._dict([]), **(extra or {})}
        yield "{"
        for i, (key, value) in enumerate(head.items()):
            yield f"{',' if i else ''}\n  {json.dumps(key)}: "
            if key == "hosts" and self.hosts:
                for j, h in enumerate(self.hosts):
                    entry = json.dumps(h.to_dict(), indent=2).replace("\n", "\n    ")
                    yield f"{',' if j else '['}\n    {entry}"
                yield "\n  ]"
            else:
                yield json.dumps(value, indent=2).replace("\n", "\n  ")
        yield "\n}\n"

    def _dict(self, hosts: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "schema": loader.FLEET_SCHEMA_NAME, "schema_version": SCHEMA_VERSION,
            "run_id": self.run_id, "history_run": self.history_run,
            "generated_at": self.generated_at, "source": self.source,
            "straggler_rule": {"default_pct": strag.DEFAULT_PCT, "warn_fraction": strag.WARN_FRACTION,
                               "min_peers": strag.MIN_PEERS},
            "verdict": self.verdict, "exit_code": self.exit_code, "summary": self.summary,
            "site_policies": self.site_policies,
            "hosts": hosts,
            "by_check": [c.to_dict() for c in self.by_check],
            "figures": [s.to_dict() for s in self.figure_stats],
            "stragglers": [s.to_dict() for s in self.stragglers],
            "lemons": [lemon.to_dict() for lemon in self.lemons],
            "drift": [d.to_dict() for d in self.drifts],
            "digests": self.digests.to_dict() if self.digests else None,
        }


def site_of(report: Mapping[str, Any]) -> str | None:
    """The short digest of the site file a report says it ran under (options.site.sha256), None
    without one or for one that is not a digest (a report's text is not trusted)."""
    options = report.get("options")
    site = options.get("site") if isinstance(options, Mapping) else None
    digest = site.get("sha256") if isinstance(site, Mapping) else None
    if isinstance(digest, str) and len(digest) == 64 and all(c in "0123456789abcdef" for c in digest):
        return digest[:12]
    return None


@functools.cache
def straggler_pct(profile_name: str) -> float:
    try:
        value = profiles.load(profile_name).get("straggler_pct", strag.DEFAULT_PCT)
    except profiles.ProfileError:
        return strag.DEFAULT_PCT
    return float(value) if isinstance(value, int | float) else strag.DEFAULT_PCT


# One check a host did not pass: id, code, title, the worst status and its message, the GPUs
SpreadRow = tuple[str, str, str, str, str, list[str]]


# a check of a consistent report (its status the worst of its results) with one of these statuses
# has no FAIL, ERROR or WARN result
_ALL_PASSED = frozenset({"PASS", "SKIP"})


def spread_rows(report: Mapping[str, Any], consistent: bool = False) -> list[SpreadRow]:
    """The checks of one report with a FAIL, ERROR or WARN result, as _spread lists them.
    `consistent`: the report passed report_schema.consistency_problem, so a check's status says
    whether any of its results is one of those (the others' results are not walked)."""
    rows = []
    for chk in report.get("checks", []):
        if consistent and chk["status"] in _ALL_PASSED:
            continue
        bad = [r for r in chk["results"] if r["status"] in ("FAIL", "ERROR", "WARN")]
        if not bad:
            continue
        worst = max(bad, key=lambda r: Status(r["status"]).severity)
        gpus = sorted({ref.label() for r in bad if (ref := figs.GpuRef.from_device(r.get("device")))})
        rows.append((chk["id"], chk["code"], chk["title"], worst["status"], worst["message"], gpus))
    return rows


@dataclass(frozen=True)
class Facts:
    """What the aggregation reads of a host's checks, taken once while the whole report is at
    hand (the summary it keeps packs its checks away: summary.Packed)."""

    spread: list[SpreadRow]
    digests: list[tuple[digests_.GroupKey, digests_.Entry]]
    nvl72: bool  # it is an NVL72 tray with a fabric identity (nvl72.trays)
    gpus: gpu_identity.GpuIds = ()  # the GPU UUIDs and serials its results name
    hardware: bool = False  # measured on real hardware (backend linux), not simulated

    @classmethod
    def of(cls, host: str, report: Mapping[str, Any], consistent: bool = False) -> Facts:
        """`consistent`: as for spread_rows (the loader checked the report)."""
        return cls(spread_rows(report, consistent), list(digests_.entries_of(host, report)),
                   bool(nvl72.trays([(host, report)])), gpu_identity.ids_of(report),
                   report.get("backend") == "linux")


def _spread(entries: list[HostEntry], facts: Mapping[str, Facts]) -> list[CheckSpread]:
    spreads: dict[str, CheckSpread] = {}
    for entry in entries:
        row = facts.get(entry.host)
        for check, code, title, status, message, gpus in row.spread if row else ():
            spread = spreads.setdefault(check, CheckSpread(check, code, title, []))
            spread.occurrences.append(Occurrence(entry.host, status, message, gpus))
            entry.problems.append(check)
    order = {"FAIL": 0, "ERROR": 1, "WARN": 2}
    return sorted(spreads.values(), key=lambda c: (order[c.status], -len(c.occurrences), c.check))


def _gpu_text(gpu: figs.GpuRef | None) -> str:
    return f"{gpu.label()} " if gpu else ""


def _straggler_finding(s: strag.Straggler) -> Finding:
    return Finding("straggler", s.status, s.check, s.gpu,
                   f"{_gpu_text(s.gpu)}{s.check} {s.name} {s.value:g}: {s.deficit_pct:.1f} % worse "
                   f"than the fleet median {s.median:g} (FAIL above {s.threshold_pct:g} %)", s.name)


def _digest_finding(odd: digests_.Odd) -> Finding:
    return Finding("digest", odd.status, digests_.CHECK_ID, odd.gpu, f"{_gpu_text(odd.gpu)}{odd.message}")


def _drift_finding(d: Drift) -> Finding:
    assert d.status is not None
    return Finding("drift", d.status, d.check, d.gpu,
                   f"{_gpu_text(d.gpu)}{d.check} {d.name} {d.value:g}: {d.deficit_pct:.1f} % worse "
                   f"than its own {d.baseline_kind} baseline {d.baseline:g} (FAIL above "
                   f"{d.fail_pct:g} %)", d.name)


def _lemon_finding(lemon: Lemon, gpu: figs.GpuRef) -> Finding:
    return Finding("lemon", "FAIL", ",".join(lemon.checks), gpu,
                   f"{_gpu_text(gpu)}{lemon.uuid} failed in {lemon.failed_runs} of the last "
                   f"{lemon.window} runs ({', '.join(lemon.checks)}): replace it")


def _gpus_by_uuid(hosts: list[HostEntry], wanted: set[str]) -> dict[str, tuple[str, figs.GpuRef]]:
    """GPU UUID → (host, GPU) where this run's reports first name it, for the `wanted` UUIDs
    (the walk ends when each one is found)."""
    found: dict[str, tuple[str, figs.GpuRef]] = {}
    for entry in hosts:
        for chk in (entry.report or {}).get("checks", []):
            for r in chk["results"]:
                device = r.get("device")
                uuid = device.get("uuid") if type(device) is dict else None
                if uuid not in wanted or uuid in found:
                    continue
                ref = figs.GpuRef.from_device(device)
                if ref is not None and ref.uuid:
                    found[ref.uuid] = (entry.host, ref)
        if len(found) == len(wanted):
            break
    return found


def _add_findings(hosts: list[HostEntry], kind: str, found: list[tuple[str, Finding]]) -> None:
    """List each finding on its host (replacing earlier ones of this kind) and raise the host's
    status by it."""
    by_host = {h.host: h for h in hosts}
    for entry in hosts:
        entry.findings = [f for f in entry.findings if f.kind != kind]
    for host, finding in found:
        if host in by_host:
            by_host[host].findings.append(finding)
    _fold(hosts, ((host, f.status) for host, f in found))


def finished_at(report: Mapping[str, Any]) -> float | None:
    """When a report's run finished (Unix time), None without a readable start time."""
    try:
        started = dt.datetime.fromisoformat(report["started_at"])
    except (KeyError, TypeError, ValueError):
        return None
    if started.tzinfo is None:
        started = started.replace(tzinfo=dt.timezone.utc)
    return started.timestamp() + float(report.get("duration_s") or 0.0)


def _fold(hosts: list[HostEntry], verdicts: Iterable[tuple[str, str]]) -> None:
    """Raise host statuses by fleet-level verdicts (host, "FAIL" | "WARN")."""
    worst: dict[str, str] = {}
    for host, status in verdicts:
        if worst.get(host) != "FAIL":
            worst[host] = status
    for entry in hosts:
        bad = worst.get(entry.host)
        if bad == "FAIL" and entry.status in ("PASS", "WARN"):
            entry.status = "FAIL"
        elif bad == "WARN" and entry.status == "PASS":
            entry.status = "WARN"


def _host_status(report: Mapping[str, Any]) -> str:
    if report["verdict"] == "FAIL":
        return "FAIL"
    return "WARN" if report["summary"].get("WARN") else "PASS"


@dataclass
class Summarised(loader.HostReport):
    """A host report as the fleet keeps it: `report` is its packed summary (summary.py),
    `published` the figures and curves and `facts` what the aggregation reads of its checks, both
    taken from the whole report before it was reduced."""

    # the loader's HostReport holds a parsed dict; a Summarised one its packed summary
    report: Mapping[str, Any] | None  # type: ignore[assignment]
    published: list[figs.Figure | figs.Curve] = field(default_factory=list)
    facts: Facts | None = None


_compactor: summary_.Compactor | None = None


def read_one(path: Path) -> loader.HostReport | None:
    """One report file read, checked and validated (loader.read), then reduced to what the fleet
    keeps of it; None for the fleet's own summary (loader.FLEET_FILE_NAMES). A module-level
    function, so that a process pool can run it (read's `map_`): what it returns is all it hands
    back. What the reduction still trips on in a report the loader passed is that host's ERROR,
    naming the exception: one report never ends the fleet report (in a forked reader, an
    exception would be raised again in the caller)."""
    global _compactor
    item = loader.read(path, validate=loader.validator(), keep_text=True,
                       summary_names=loader.FLEET_FILE_NAMES)
    if item is None or item.report is None:
        return item
    if _compactor is None:  # strings shared across the reports this process reads
        _compactor = summary_.Compactor()
    report = item.report
    try:
        return Summarised(item.host, _compactor.pack(report, item.text), None, item.path,
                          published=list(figs.extract(item.host, report)),
                          facts=Facts.of(item.host, report, consistent=True))
    except Exception as exc:  # whatever the report holds; the reason names the exception
        why = loader.clean(" ".join(f"{type(exc).__name__}: {exc}".split()))[:200]
        return loader.HostReport(item.host, None, f"report unreadable: {path.name}: the fleet could "
                                 f"not read it ({why})", path)


Mapper = Callable[[Callable[[Path], "loader.HostReport | None"], list[Path]],
                  Iterable["loader.HostReport | None"]]


def read(directory: Path, map_: Mapper | None = None) -> list[loader.HostReport]:
    """Every report in `directory` (read_one: checked, validated, reduced to its summary as soon
    as it is read): one whole report in memory at a time per process, whatever the fleet's size.
    `map_` (the builtin map by default) may run read_one in other processes; it must yield the
    results in the order of the paths, so every output is the same either way."""
    paths = sorted(directory.glob("*.json"), key=lambda p: p.name)  # one directory: as sorting Paths
    with loader.gc_paused():
        found = [item for item in (map_ or map)(read_one, paths) if item is not None]
    return loader.flag_duplicates(found)


def _kept(item: loader.HostReport, report: Mapping[str, Any]) -> tuple[list[figs.Figure | figs.Curve], Facts]:
    if isinstance(item, Summarised) and item.facts is not None:
        return item.published, item.facts
    return list(figs.extract(item.host, report)), Facts.of(item.host, report)


def _with_host(report: Mapping[str, Any], host: str) -> Mapping[str, Any]:
    if isinstance(report, summary_.Packed):
        return report.with_host(host)
    return {**report, "host": host}


def aggregate(found: Iterable[loader.HostReport], *, expected_hosts: Iterable[str] | None = None,
              host_errors: Mapping[str, str] | None = None, run_id: str | None = None,
              source: str | None = None) -> Fleet:
    """Aggregate the reports found. `expected_hosts` (the inventory) names the hosts that must
    have a report; `host_errors` gives the caller's reason for a host without one."""
    host_errors = dict(host_errors or {})
    entries: dict[str, HostEntry] = {}
    published: dict[str, list[figs.Figure | figs.Curve]] = {}
    facts: dict[str, Facts] = {}
    for item in found:
        if item.report is None:
            entries[item.host] = HostEntry(item.host, "ERROR", item.error or "report unreadable")
            continue
        report = _with_host(item.report, item.host)
        entries[item.host] = HostEntry(
            item.host, _host_status(report), host_errors.get(item.host), item.report["host"],
            report["profile"]["name"], dict(report["summary"]), report=report,
            report_finished_at=finished_at(report), site=site_of(report))
        published[item.host], facts[item.host] = _kept(item, item.report)
    for host in [*(expected_hosts or ()), *host_errors]:
        if host not in entries:
            entries[host] = HostEntry(host, "MISSING", host_errors.get(host) or "no report")
    hosts = sorted(entries.values(), key=lambda h: h.host)
    by_check = _spread(hosts, facts)
    # NVL72 trays of one NVLink domain must agree on cluster UUID, clique and IMEX node list.
    domain = nvl72.find((h.host, h.report) for h in hosts
                        if h.report is not None and h.host in facts and facts[h.host].nvl72)
    if domain:
        by_check.insert(0, CheckSpread(nvl72.CHECK_ID, nvl72.CODE, nvl72.TITLE,
                                       [Occurrence(f.host, f.status, f.message, []) for f in domain]))
        for finding in domain:
            entry = entries[finding.host]
            if entry.status in ("PASS", "WARN"):
                entry.status = finding.status  # FAIL, or ERROR: its identity could not be read
            if finding.status == "ERROR":
                entry.reason = entry.reason or f"{nvl72.CHECK_ID}: {finding.message}"
            entry.problems.append(nvl72.CHECK_ID)
    # One GPU sits in one host: a UUID or serial two hosts name is a finding on both.
    shared = gpu_identity.find((h.host, facts[h.host].hardware, facts[h.host].gpus)
                               for h in hosts if h.host in facts)
    if shared:
        by_check.insert(0, CheckSpread(gpu_identity.CHECK_ID, gpu_identity.CODE, gpu_identity.TITLE,
                                       [Occurrence(f.host, f.status, f.message, []) for f in shared]))
        for duplicate in shared:
            entry = entries[duplicate.host]
            entry.status = "FAIL" if entry.status in ("PASS", "WARN") else entry.status
            entry.problems.append(gpu_identity.CHECK_ID)

    profile_of = {h.host: h.profile or profiles.GENERIC for h in hosts}
    # a NaN figure is a finding (broken), never dropped; what is not a figure is a curve
    groups, broken, curves = strag.group_by_host(
        (profile_of[h.host], published.get(h.host, ())) for h in hosts if h.report is not None)
    stats, stragglers = strag.find(groups, straggler_pct)
    stragglers = strag.not_finite(broken, stats, profile_of.__getitem__, straggler_pct) + stragglers
    _add_findings(hosts, "straggler", [(s.host, _straggler_finding(s)) for s in stragglers])
    digest_analysis = digests_.analyse_entries(
        pair for h in hosts if h.host in facts for pair in facts[h.host].digests)
    _add_findings(hosts, "digest", [(odd.host, _digest_finding(odd)) for odd in digest_analysis.odd])

    if run_id is None:
        ids = Counter(h.report.get("run_id") for h in hosts if h.report and h.report.get("run_id"))
        run_id = ids.most_common(1)[0][0] if ids else None
    return Fleet(run_id, source, hosts, by_check, stats, stragglers, groups, curves,
                 digests=digest_analysis)


def from_reports(reports: Iterable[dict[str, Any]], **kw: Any) -> Fleet:
    """Aggregate reports already in memory (e.g. this host's, from `python -m checks --html`)."""
    return aggregate((loader.HostReport(r["host"], r) for r in reports), **kw)


def load(directory: str | Path, map_: Mapper | None = None, **kw: Any) -> Fleet:
    """Load and aggregate reports/<run-id>/*.json; the run id defaults to the directory name.
    Streams: the fleet holds each host's summary (read, with `map_`), never the whole reports."""
    directory = Path(directory)
    with loader.gc_paused():
        fleet = aggregate(read(directory, map_), source=str(directory), **kw)
    if fleet.run_id is None:
        fleet.run_id = directory.name
    return fleet


__all__ = ["Fleet", "HostEntry", "Summarised", "aggregate", "from_reports", "load", "read"]
