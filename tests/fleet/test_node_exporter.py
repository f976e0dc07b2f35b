"""Our .prom output served by the real node_exporter (textfile collector) and scraped over HTTP,
the way Prometheus sees it: names, labels (host, GPU index, PCI address, UUID, check id, fault
code), values, stale files replaced, and rewrites never half-read."""

from __future__ import annotations

import copy
import datetime as dt
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from checks.devtools import synthetic
from checks.devtools.synthetic import Broken
from checks.render import prometheus

sys.path.insert(0, str(Path(__file__).resolve().parent))
from promtools import (
    APT_HINT,
    FLEET_GONE,
    FLEET_ODD,
    FLEET_QUIET,
    NodeExporter,
    node_exporter_binary,
    samples,
    two_fleet_runs,
)

ECC = Broken("node0001", "ecc-errors", gpu=5, message="GPU5: 2 volatile uncorrectable ECC errors")


@pytest.fixture(scope="module", autouse=True)
def _need_node_exporter() -> None:
    if node_exporter_binary() is None:
        pytest.fail(f"no node_exporter: {APT_HINT}")


@pytest.fixture
def textfiles(tmp_path: Path) -> Path:
    directory = tmp_path / "textfile"
    directory.mkdir()
    return directory


@pytest.fixture
def exporter(textfiles: Path) -> Iterator[NodeExporter]:
    with NodeExporter(textfiles) as ne:
        yield ne


def _families(text: str) -> dict[str, list]:
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def _one(series: list, **labels: str):
    [match] = [s for s in series if all(s.labels.get(k) == v for k, v in labels.items())]
    return match


def _no_textfile_error(families: dict[str, list]) -> None:
    [err] = families["node_textfile_scrape_error"]
    assert err.value == 0.0


def _device(report: dict[str, Any], check: str, gpu: int) -> dict[str, Any]:
    return next(r["device"] for c in report["checks"] if c["id"] == check
                for r in c["results"] if (r["device"] or {}).get("index") == gpu)


def test_one_host_scraped_with_every_label(textfiles, exporter, h100_report) -> None:
    [report] = synthetic.build(2, base=h100_report, broken=[ECC])[1:]
    prometheus.write([report], textfiles / "nodecert.prom")
    families = _families(exporter.scrape())
    _no_textfile_error(families)

    dev = _device(report, "ecc-errors", 5)
    ecc = _one(families["nodecert_check_status"], check="ecc-errors", gpu="5")
    assert ecc.value == 1.0
    assert ecc.labels == {"host": "node0001", "check": "ecc-errors", "code": "GPU002",
                          "fault_code": "GPU002", "gpu": "5", "pci": dev["pci"], "uuid": dev["uuid"],
                          "UUID": dev["uuid"], "pci_bus_id": prometheus.dcgm_pci_bus_id(dev["pci"]),
                          "status": "FAIL"}
    # dcgm-exporter's spelling: an 8-hex domain, upper case (PromQL joins need the same bytes)
    assert re.fullmatch(r"[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7]", ecc.labels["pci_bus_id"])
    assert ecc.labels["pci_bus_id"].lower().endswith(dev["pci"].lower())
    healthy_ecc = _one(families["nodecert_check_status"], check="ecc-errors", gpu="4")
    assert (healthy_ecc.labels["status"], healthy_ecc.labels["fault_code"]) == ("PASS", "")
    assert healthy_ecc.labels["pci"] == _device(report, "ecc-errors", 4)["pci"]

    info = families["nodecert_gpu_info"]
    assert len(info) == 8
    gpu5 = _one(info, gpu="5")
    assert (gpu5.labels["pci"], gpu5.labels["uuid"], gpu5.labels["serial"]) == (
        dev["pci"], dev["uuid"], dev["serial"])

    tflops = next(r["details"]["figures"]["matmul_bf16_tflops"] for c in report["checks"]
                  if c["id"] == "gpu-matmul" for r in c["results"] if r["device"]["index"] == 3)
    matmul = _one(families["nodecert_matmul_bf16_flops"], gpu="3")
    assert matmul.value == pytest.approx(tflops * 1e12)
    assert matmul.labels["pci"] == _device(report, "gpu-matmul", 3)["pci"]

    assert _one(families["nodecert_host_healthy"], host="node0001").value == 0.0
    assert _one(families["nodecert_checks"], status="FAIL").value == 1.0
    finished = dt.datetime.fromisoformat(report["started_at"]).timestamp() + report["duration_s"]
    assert _one(families["nodecert_last_run_timestamp_seconds"], host="node0001").value == \
        pytest.approx(finished)
    mtime = _one(families["node_textfile_mtime_seconds"])
    assert mtime.labels["file"].endswith("nodecert.prom")


def test_stale_file_is_replaced_and_the_old_status_is_gone(textfiles, exporter, h100_report) -> None:
    broken = synthetic.build(2, base=h100_report, broken=[ECC])[1]
    prometheus.write([broken], textfiles / "nodecert.prom")
    before = _families(exporter.scrape())
    assert _one(before["nodecert_check_status"], check="ecc-errors", gpu="5").labels["status"] == "FAIL"

    repaired = synthetic.build(2, base=h100_report)[1]  # same host, same GPUs, ECC now clean
    prometheus.write([repaired], textfiles / "nodecert.prom")
    after = _families(exporter.scrape())
    _no_textfile_error(after)
    [ecc5] = [s for s in after["nodecert_check_status"]
              if s.labels["check"] == "ecc-errors" and s.labels["gpu"] == "5"]
    assert ecc5.labels["status"] == "PASS"  # the FAIL series is gone, not left beside it
    assert not [s for s in after["nodecert_check_status"] if s.labels["status"] == "FAIL"]
    assert _one(after["nodecert_host_healthy"], host="node0001").value == 1.0
    assert sorted(os.listdir(textfiles)) == ["nodecert.prom"]


def _two_runs(h100_report: dict[str, Any]) -> list[dict[str, Any]]:
    """The same host twice: first with a failed ECC check, then repaired, a day later."""
    first = synthetic.build(2, base=h100_report, broken=[ECC])[1]
    second = copy.deepcopy(synthetic.build(2, base=h100_report)[1])
    started = dt.datetime.fromisoformat(second["started_at"]) + dt.timedelta(days=1)
    second["started_at"] = started.isoformat()
    return [first, second]


def _scraped(exporter: NodeExporter) -> set | None:
    """The samples of one scrape, or None where node_exporter could not parse our file."""
    text = exporter.scrape()
    return samples(text) if _families(text)["node_textfile_scrape_error"][0].value == 0 else None


def _complete_files(textfiles: Path, runs: list[dict[str, Any]]) -> list[bytes]:
    return [prometheus.write([run], textfiles.parent / "render" / f"run{i}.prom").read_bytes()
            for i, run in enumerate(runs)]


def test_a_rewrite_never_shows_half_a_file(textfiles, exporter, h100_report, monkeypatch) -> None:
    """Scraped at the worst moment of our write (the new file written in full, not yet renamed
    over the old): node_exporter serves the previous complete file, and no temporary of ours is
    read as a second .prom; right after the rename it serves the new one."""
    first, second = _complete_files(textfiles, _two_runs(h100_report))
    target = textfiles / "nodecert.prom"
    target.write_bytes(first)
    mid_write: list[set | None] = []
    real_replace = os.replace

    def scrape_then_replace(src: Any, dst: Any) -> None:
        assert Path(src).parent == textfiles and not Path(src).name.endswith(".prom"), src
        mid_write.append(_scraped(exporter))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", scrape_then_replace)
    prometheus.write([_two_runs(h100_report)[1]], target)
    monkeypatch.undo()
    assert mid_write == [samples(first.decode())]
    assert _scraped(exporter) == samples(second.decode())
    assert sorted(os.listdir(textfiles)) == ["nodecert.prom"]


def test_an_in_place_rewrite_is_caught_half_read(textfiles, exporter, h100_report) -> None:
    """The control for the test above: a file rewritten in place and scraped half way through is
    torn (unparsable, or a mix of runs), so the comparison above would see one."""
    first, second = _complete_files(textfiles, _two_runs(h100_report))
    target = textfiles / "nodecert.prom"
    target.write_bytes(first)
    with open(target, "wb") as f:
        f.write(second[: len(second) // 2])
        f.flush()
        torn = _scraped(exporter)
        f.write(second[len(second) // 2:])
    assert torn not in (samples(first.decode()), samples(second.decode()))
    assert _scraped(exporter) == samples(second.decode())


def test_fleet_directory_through_the_fleet_cli(tmp_path, textfiles, exporter, h100_report) -> None:
    """Two fleet runs through `python -m checks.fleet report`: a straggler GPU, a lemon (the same
    GPU failing in both runs), a GPU computing other bits than the fleet, a host whose reports
    stopped and one that vanished. The controller's exporter serves the bounded fleet summary;
    the nodes' own files (one exporter standing in for each node's) serve the per-GPU series."""
    nodes = tmp_path / "nodes"
    fleet = two_fleet_runs(tmp_path, h100_report, textfiles, nodes)
    families = _families(exporter.scrape())
    _no_textfile_error(families)
    [mtime] = families["node_textfile_mtime_seconds"]  # the fleet summary alone
    assert mtime.labels["file"].endswith("nodecert-fleet.prom")
    assert "nodecert_check_status" not in families and "nodecert_gpu_info" not in families

    hosts_by_status = {s.labels["status"]: s.value for s in families["nodecert_fleet_hosts"]}
    assert hosts_by_status == {k: float(v) for k, v in fleet["summary"].items() if k != "hosts"}
    assert hosts_by_status["MISSING"] == 2.0
    missing = {s.labels["host"]: s.labels for s in families["nodecert_fleet_host_missing"]}
    assert sorted(missing) == [FLEET_QUIET, FLEET_GONE]
    assert missing[FLEET_GONE]["reason"] == "no report since run run-1"
    healthy = {s.labels["host"]: (s.labels["status"], s.value)
               for s in families["nodecert_fleet_host_healthy"]}
    assert len(healthy) == 12
    assert healthy[FLEET_ODD[0]] == ("FAIL", 0.0)  # its own report passed: the digest finding FAILs it
    assert healthy["node0000"] == ("PASS", 1.0) and healthy[FLEET_GONE] == ("MISSING", 0.0)

    # the vanished host's node file is gone, yet the fleet keeps its last report time, two days old
    reported = {s.labels["host"]: s.value for s in families["nodecert_fleet_host_report_timestamp_seconds"]}
    assert len(reported) == 12
    assert reported["node0008"] - reported[FLEET_GONE] == pytest.approx(2 * 86400)

    report7 = next(r for r in synthetic.build(12, base=h100_report) if r["host"] == "node0007")
    dev = _device(report7, "gpu-matmul", 3)
    straggler = _one(families["nodecert_straggler_deficit_ratio"], host="node0007")
    assert straggler.labels == {"host": "node0007", "check": "gpu-matmul",
                                "figure": "matmul_bf16_tflops", "gpu": "3", "pci": dev["pci"],
                                "uuid": dev["uuid"], "UUID": dev["uuid"],
                                "pci_bus_id": prometheus.dcgm_pci_bus_id(dev["pci"]), "status": "FAIL"}
    assert straggler.value == pytest.approx(0.2, abs=0.03)
    [odd] = families["nodecert_digest_mismatch"]
    assert (odd.labels["host"], odd.labels["gpu"], odd.labels["status"]) == (*map(str, FLEET_ODD), "FAIL")

    # two lemons: node0004's GPU5 failed ECC twice, node0007's GPU3 was a FAIL straggler twice
    dev4 = _device(next(r for r in synthetic.build(12, base=h100_report) if r["host"] == "node0004"),
                   "ecc-errors", 5)
    assert sorted(lemon["uuid"] for lemon in fleet["lemons"]) == sorted([dev4["uuid"], dev["uuid"]])
    assert len(families["nodecert_lemon_failed_runs"]) == 2
    scraped = _one(families["nodecert_lemon_failed_runs"], uuid=dev4["uuid"])
    assert scraped.value == 2.0
    assert scraped.labels == {"uuid": dev4["uuid"], "host": "node0004", "gpu": "5", "pci": dev4["pci"],
                              "UUID": dev4["uuid"], "pci_bus_id": prometheus.dcgm_pci_bus_id(dev4["pci"])}
    generated = dt.datetime.fromisoformat(fleet["generated_at"]).timestamp()
    [fleet_ts] = families["nodecert_fleet_last_run_timestamp_seconds"]
    assert fleet_ts.value == pytest.approx(generated)

    with NodeExporter(nodes) as node_side:
        per_node = _families(node_side.scrape())
    _no_textfile_error(per_node)
    assert len(per_node["node_textfile_mtime_seconds"]) == 11  # the vanished host's file is gone
    failed = _one(per_node["nodecert_check_status"], host="node0004", check="ecc-errors", gpu="5")
    assert (failed.labels["status"], failed.labels["fault_code"]) == ("FAIL", "GPU002")
    # node0009's own file is the one from run 1: its timestamp is two days behind the others'
    last = {s.labels["host"]: s.value for s in per_node["nodecert_last_run_timestamp_seconds"]}
    assert last["node0008"] - last[FLEET_QUIET] == pytest.approx(2 * 86400)
