"""Prometheus textfile-collector output (`.prom`) for node_exporter.

Two layouts. Each node writes its own file (`python -m checks --prometheus FILE`, every per-GPU
series of its last run) for its own node_exporter; the controller writes one bounded fleet file
(`nodecert-fleet.prom`: counts by status, one health series and one report-time series per host,
and a series per finding only), so that no single scrape carries the whole fleet. The old layout,
a file per host in the controller's directory, is still written on request (`host_files`).

Files are written with checks.safeio: to a private temporary in the same directory (not ending
in .prom, so the collector skips it), then renamed over the old file, so node_exporter reads the old
file or the new one, never half of one. Metric names follow Prometheus conventions: base units
(bytes, seconds, flops) and the unit as a suffix; figures are converted from the unit their name
ends in. Every metric, label, alert rule and dashboard panel is described in docs/prometheus.md;
the alert rules and dashboard that use these names live in checks/monitoring/.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from checks import safeio
from checks.model import Status

if TYPE_CHECKING:
    from checks.report.aggregate import Fleet

PREFIX = "nodecert"
STATUSES = [s.value for s in Status]
# Every per-GPU series carries the GPU three ways: index (changes when a GPU falls off the bus and
# the others renumber), PCI address (where it sits: what a technician pulls) and UUID (which board,
# wherever it moves); and twice more as NVIDIA's dcgm-exporter spells them (`UUID`, and
# `pci_bus_id` with an 8-hex domain in upper case: 00000000:1B:00.0), so that PromQL, which cannot
# change case, joins our series with DCGM's (docs/prometheus.md).
GPU_LABELS = ["gpu", "pci", "uuid", "UUID", "pci_bus_id"]
GpuLabels = tuple[str, str, str, str, str]
HEALTHY = ("PASS", "WARN")  # fleet host statuses that count as healthy
RESULT_LABELS = ["host", "check", "code", "fault_code", *GPU_LABELS]

# Figure-name suffix → (metric suffix, factor to the base unit, what the unit is)
UNITS: tuple[tuple[str, str, float, str], ...] = (
    ("_tflops", "_flops", 1e12, "floating-point operations per second"),
    ("_gflops", "_flops", 1e9, "floating-point operations per second"),
    ("_gbs", "_bytes_per_second", 1e9, "bytes per second"),
    ("_mbs", "_bytes_per_second", 1e6, "bytes per second"),
    ("_per_s", "_per_second", 1.0, "per second"),
    ("_us", "_seconds", 1e-6, "seconds"),
    ("_ms", "_seconds", 1e-3, "seconds"),
    ("_s", "_seconds", 1.0, "seconds"),
    ("_pct", "_ratio", 0.01, "ratio"),
    ("_bytes", "_bytes", 1.0, "bytes"),
)


@dataclass(frozen=True)
class FigureMetric:
    name: str
    factor: float
    unit: str


def figure_metric(figure: str) -> FigureMetric:
    """The metric for a figure: matmul_bf16_tflops → nodecert_matmul_bf16_flops (×1e12)."""
    clean = re.sub(r"[^a-zA-Z0-9_]", "_", figure).lower()
    for suffix, metric_suffix, factor, unit in UNITS:
        if clean.endswith(suffix):
            return FigureMetric(f"{PREFIX}_{clean[: -len(suffix)]}{metric_suffix}", factor, unit)
    return FigureMetric(f"{PREFIX}_{clean}", 1.0, "as measured")


def _timestamp(report: dict[str, Any]) -> float:
    try:
        started = dt.datetime.fromisoformat(report["started_at"])
    except (KeyError, TypeError, ValueError):
        return 0.0
    return started.timestamp() + float(report.get("duration_s") or 0.0)


PCI_ADDRESS = re.compile(r"^(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])$")


def dcgm_pci_bus_id(pci: str) -> str:
    """A PCI address as dcgm-exporter's `pci_bus_id` spells it (NVML's busId): 0000:1b:00.0 →
    00000000:1B:00.0; "" stays "", an address of another shape is passed on upper-cased."""
    found = PCI_ADDRESS.match(pci.strip())
    if not found:
        return pci.upper()
    domain, bus, dev, fn = found.groups()
    return f"{int(domain or '0', 16):08X}:{int(bus, 16):02X}:{int(dev, 16):02X}.{fn}"


def _gpu_labels(dev: dict[str, Any] | None) -> GpuLabels:
    """(index, PCI address, UUID, UUID, DCGM bus id) of a device dict, "" for what it lacks."""
    dev = dev or {}
    index = dev.get("index")
    pci, uuid = dev.get("pci") or "", dev.get("uuid") or ""
    return ("" if index is None else str(index)), pci, uuid, uuid, dcgm_pci_bus_id(pci)


def _device_labels(result: dict[str, Any]) -> GpuLabels:
    return _gpu_labels(result.get("device"))


def _ref_labels(gpu: Any) -> GpuLabels:
    """The labels of a GpuRef (fleet findings), "" throughout for a host-level one."""
    return _gpu_labels(gpu.to_dict() if gpu else None)


def fault_code(result: dict[str, Any], check_code: str) -> str:
    """The result's fault code; reports written before the runner filled it in get the runner's
    rule (WARN/FAIL: the check's code, ERROR: code-E, "could not collect"); PASS/SKIP: none."""
    if result.get("fault_code"):
        return str(result["fault_code"])
    status = result.get("status")
    if status in ("WARN", "FAIL"):
        return check_code
    return f"{check_code}-E" if status == "ERROR" else ""


class ReportCollector(Collector):
    """Metrics of host reports (`host` label from the report) and, optionally, of the fleet.
    `fleet_status` (host → status in the fleet) makes `nodecert_host_healthy` follow the fleet's
    verdict on a host rather than its own report's, where the fleet writes the host's file."""

    def __init__(self, reports: Iterable[dict[str, Any]], fleet: Fleet | None = None,
                 fleet_status: dict[str, str] | None = None) -> None:
        self.reports = list(reports)
        self.fleet = fleet
        self.fleet_status = fleet_status or {}

    def collect(self) -> Iterator[GaugeMetricFamily]:
        families = [*self._host_metrics(), *self._gpu_metrics(), *self._check_metrics(),
                    *self._figure_metrics()]
        if self.fleet is not None:
            families.extend(self._fleet_metrics(self.fleet))
        yield from (f for f in families if f.samples)

    def _host_metrics(self) -> Iterator[GaugeMetricFamily]:
        last = GaugeMetricFamily(f"{PREFIX}_last_run_timestamp_seconds",
                                 "When the last nodecert run on this host finished (Unix time).",
                                 labels=["host"])
        duration = GaugeMetricFamily(f"{PREFIX}_run_duration_seconds",
                                     "How long the last nodecert run took.", labels=["host"])
        healthy = GaugeMetricFamily(f"{PREFIX}_host_healthy",
                                    "1 when every check passed (PASS, WARN or SKIP) and, where the "
                                    "fleet report writes it, no fleet finding FAILs the host; else 0.",
                                    labels=["host", "level", "profile"])
        checks = GaugeMetricFamily(f"{PREFIX}_checks", "Number of checks by status in the last run.",
                                   labels=["host", "status"])
        for r in self.reports:
            host = r["host"]
            last.add_metric([host], _timestamp(r))
            duration.add_metric([host], float(r.get("duration_s") or 0.0))
            ok = (self.fleet_status[host] in HEALTHY if host in self.fleet_status
                  else r["verdict"] == "PASS")
            healthy.add_metric([host, r.get("level") or "", r["profile"]["name"]], 1.0 if ok else 0.0)
            for status in STATUSES:
                checks.add_metric([host, status], float(r["summary"].get(status, 0)))
        yield from (last, duration, healthy, checks)

    def _check_metrics(self) -> Iterator[GaugeMetricFamily]:
        # One series per check and GPU, labelled with the current status, value 1. Series for
        # the four other statuses at 0 would quintuple the cardinality (1 000 hosts x 8 GPUs x
        # 30 checks); rewriting the file drops the old status's series, which Prometheus then
        # marks stale.
        status = GaugeMetricFamily(
            f"{PREFIX}_check_status",
            "Outcome of a check on a host or GPU: 1, with the outcome in the status label and the "
            "fault code of the worst result in fault_code.",
            labels=[*RESULT_LABELS, "status"])
        for r in self.reports:
            for chk in r["checks"]:
                worst: dict[GpuLabels, dict[str, Any]] = {}  # worst result per GPU
                for res in chk["results"]:
                    key = _device_labels(res)
                    prev = worst.get(key)
                    if prev is None or Status(res["status"]).severity > Status(prev["status"]).severity:
                        worst[key] = res
                for gpu_labels, res in worst.items():
                    status.add_metric([r["host"], chk["id"], chk["code"], fault_code(res, chk["code"]),
                                       *gpu_labels, res["status"]], 1.0)
        yield status

    def _gpu_metrics(self) -> Iterator[GaugeMetricFamily]:
        info = GaugeMetricFamily(f"{PREFIX}_gpu_info",
                                 "A GPU the last run saw: 1, naming it by index, PCI address, UUID, "
                                 "model and board serial (join on uuid).",
                                 labels=["host", *GPU_LABELS, "name", "serial"])
        for r in self.reports:
            seen: dict[GpuLabels, dict[str, Any]] = {}
            for chk in r["checks"]:
                for res in chk["results"]:
                    dev = res.get("device") or {}
                    if dev.get("uuid") or dev.get("pci"):
                        seen.setdefault(_gpu_labels(dev), dev)
            for labels, dev in sorted(seen.items()):
                info.add_metric([r["host"], *labels, dev.get("name") or "", dev.get("serial") or ""],
                                1.0)
        yield info

    def _figure_metrics(self) -> Iterator[GaugeMetricFamily]:
        families: dict[str, GaugeMetricFamily] = {}
        for r in self.reports:
            for chk in r["checks"]:
                for res in chk["results"]:
                    figures = (res.get("details") or {}).get("figures") or {}
                    for name, value in figures.items():
                        if not isinstance(value, int | float) or isinstance(value, bool):
                            continue
                        metric = figure_metric(name)
                        family = families.get(metric.name)
                        if family is None:
                            family = families[metric.name] = GaugeMetricFamily(
                                metric.name, f"Figure measured by a nodecert check, in {metric.unit}.",
                                labels=["host", "check", *GPU_LABELS])
                        family.add_metric([r["host"], chk["id"], *_device_labels(res)],
                                          float(value) * metric.factor)
        yield from families.values()

    def _fleet_metrics(self, fleet: Fleet) -> Iterator[GaugeMetricFamily]:
        yield from fleet_families(fleet)


def fleet_families(fleet: Fleet) -> list[GaugeMetricFamily]:
    """The controller's bounded fleet summary: a few series per host, one per finding; never a
    per-GPU series of a host without a finding (those stay on the node's own exporter)."""
    last = GaugeMetricFamily(f"{PREFIX}_fleet_last_run_timestamp_seconds",
                             "When the last fleet report was generated (Unix time).")
    last.add_metric([], _fleet_timestamp(fleet))
    hosts = GaugeMetricFamily(f"{PREFIX}_fleet_hosts", "Hosts of the last fleet run by status.",
                              labels=["status"])
    for status, count in fleet.summary.items():
        if status != "hosts":
            hosts.add_metric([status], float(count))
    healthy = GaugeMetricFamily(
        f"{PREFIX}_fleet_host_healthy",
        "1 when the host is PASS or WARN in the last fleet run (its report and every fleet "
        "finding: straggler, drift, digest, lemon), else 0; status: its fleet status.",
        labels=["host", "status"])
    reported = GaugeMetricFamily(
        f"{PREFIX}_fleet_host_report_timestamp_seconds",
        "When the host's newest report finished (Unix time): this run's, else the last one the "
        "history holds. Stops advancing when its reports stop.", labels=["host"])
    missing = GaugeMetricFamily(f"{PREFIX}_fleet_host_missing",
                                "1 for a host with no fresh readable report in the last fleet run.",
                                labels=["host", "status", "reason"])
    for h in fleet.hosts:
        healthy.add_metric([h.host, h.status], 1.0 if h.status in HEALTHY else 0.0)
        if h.report_finished_at is not None:
            reported.add_metric([h.host], h.report_finished_at)
        if h.status in ("ERROR", "MISSING"):
            missing.add_metric([h.host, h.status, h.reason or ""], 1.0)
    slow = GaugeMetricFamily(f"{PREFIX}_straggler_deficit_ratio",
                             "How far a straggler is below the fleet median of its peers.",
                             labels=["host", "check", "figure", *GPU_LABELS, "status"])
    for s in fleet.stragglers:
        slow.add_metric([s.host, s.check, s.name, *_ref_labels(s.gpu), s.status], s.deficit_pct / 100)
    drift = GaugeMetricFamily(f"{PREFIX}_drift_deficit_ratio",
                              "How far a figure is below its own GPU's (or host's) baseline from "
                              "the history, for figures past the WARN limit.",
                              labels=["host", "check", "figure", *GPU_LABELS, "baseline", "status"])
    for d in fleet.drifts:
        drift.add_metric([d.host, d.check, d.name, *_ref_labels(d.gpu), d.baseline_kind,
                          str(d.status)], d.deficit_pct / 100)
    digest = GaugeMetricFamily(f"{PREFIX}_digest_mismatch",
                               "1 for a GPU whose reference digest is not its group's majority "
                               "(FAIL: other bits than the fleet; WARN: no majority to judge by).",
                               labels=["host", *GPU_LABELS, "digest", "majority", "status"])
    for odd in fleet.digests.odd if fleet.digests else ():
        digest.add_metric([odd.host, *_ref_labels(odd.gpu), odd.digest[:16],
                           (odd.majority or "")[:16], odd.status], 1.0)
    lemons = GaugeMetricFamily(f"{PREFIX}_lemon_failed_runs",
                               "Recent runs in which this GPU failed (listed when a lemon); "
                               "host lists every host it failed on, gpu and pci where it is now.",
                               labels=["uuid", "host", "gpu", "pci", "UUID", "pci_bus_id"])
    where = _gpus_by_uuid(fleet) if fleet.lemons else {}
    for lemon in fleet.lemons:
        index, pci, _, _, bus_id = where.get(lemon.uuid, ("", "", "", "", ""))
        lemons.add_metric([lemon.uuid, ",".join(lemon.hosts), index, pci, lemon.uuid, bus_id],
                          float(lemon.failed_runs))
    return [last, hosts, healthy, reported, missing, slow, drift, digest, lemons]


def _gpus_by_uuid(fleet: Fleet) -> dict[str, GpuLabels]:
    """UUID → the GPU's labels as the fleet's reports of this run name it."""
    found: dict[str, GpuLabels] = {}
    for r in fleet.reports:
        for chk in r["checks"]:
            for res in chk["results"]:
                labels = _device_labels(res)
                if labels[2]:
                    found.setdefault(labels[2], labels)
    return found


def _fleet_timestamp(fleet: Fleet) -> float:
    try:
        return dt.datetime.fromisoformat(fleet.generated_at).timestamp()
    except (TypeError, ValueError):
        return 0.0


def write(reports: list[dict[str, Any]], path: str | Path, fleet: Fleet | None = None,
          fleet_status: dict[str, str] | None = None) -> Path:
    """Write the reports' metrics (and the fleet's, if given) to `path` atomically."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ReportCollector(reports, fleet, fleet_status))
    # 0644: node_exporter reads the textfile directory as its own, unprivileged user.
    return safeio.write_bytes(path, generate_latest(registry), mode=0o644)


FLEET_FILE = "nodecert-fleet.prom"


# A file name has at most 255 bytes (Linux, and the filesystems node_exporter reads from), and
# safeio writes beside it under longer names (`.<name>.XXXXXXXX.tmp`, `<name>.concurrent-<pid>-<time>`)
HOST_FILE_MAX = 255 - 64


def host_file(host: str) -> str:
    """nodecert-<host>.prom. A node name may have 253 characters: a name too long for the file
    (HOST_FILE_MAX) keeps its first 150 characters and a digest of the whole name, so two long
    names never share a file."""
    name = f"nodecert-{host}.prom"
    if len(name.encode()) <= HOST_FILE_MAX:
        return name
    return f"nodecert-{host[:150]}-{hashlib.sha256(host.encode()).hexdigest()[:16]}.prom"


def write_fleet(fleet: Fleet, directory: str | Path, *, host_files: bool = False) -> list[Path]:
    """<directory>/nodecert-fleet.prom: the bounded fleet summary. With `host_files`, also the old
    layout's nodecert-<host>.prom for each host with a fresh report (its `nodecert_host_healthy`
    following the fleet's verdict); without, the host files an earlier run left there are
    removed, so that the directory holds the fleet summary alone."""
    directory = Path(directory)
    paths = [write([], directory / FLEET_FILE, fleet)]
    if host_files:
        status = {h.host: h.status for h in fleet.hosts}
        # dict(r): a packed summary's checks unpacked once for the host's file, not per metric
        paths.extend(write([dict(r)], safeio.confined(directory, host_file(r["host"])), fleet_status=status)
                     for r in fleet.reports)
    else:
        for old in directory.glob("nodecert-*.prom"):
            if old.name != FLEET_FILE:
                old.unlink(missing_ok=True)
    return paths
