"""The .prom output, read back with prometheus_client's own parser."""

from __future__ import annotations

import datetime as dt
import os
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from checks.fleet import fleet_junit
from checks.fleet.history import Lemon
from checks.render import prometheus
from checks.report import aggregate

sys.path.insert(0, str(Path(__file__).resolve().parent))
import drift_fleet


def _parse(path) -> dict[str, list]:
    text = path.read_text()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name, family in families.items():
        assert f"# HELP {name} " in text and f"# TYPE {name} gauge" in text
        assert family.type == "gauge" and family.documentation
    return {name: f.samples for name, f in families.items()}


def _one(samples, **labels):
    [match] = [s for s in samples if all(s.labels.get(k) == v for k, v in labels.items())]
    return match


def test_one_host(tmp_path, small_fleet) -> None:
    report = next(r for r in small_fleet if r["host"] == "node0012")
    families = _parse(prometheus.write([report], tmp_path / "nodecert.prom"))
    status = families["nodecert_check_status"]
    assert _one(status, check="ecc-errors", gpu="5").labels["status"] == "FAIL"
    assert _one(status, check="ecc-errors", gpu="4").labels["status"] == "PASS"
    ecc5 = _one(status, check="ecc-errors", gpu="5").labels
    assert ecc5["uuid"].startswith("GPU-")
    assert (ecc5["code"], ecc5["fault_code"]) == ("GPU002", "GPU002")
    assert ecc5["pci"] == _one(families["nodecert_gpu_info"], gpu="5").labels["pci"] != ""
    assert _one(status, check="ecc-errors", gpu="4").labels["fault_code"] == ""
    assert {s.value for s in status} == {1.0}
    assert _one(status, check="xid-events").labels["gpu"] == ""  # host-level check
    assert _one(families["nodecert_host_healthy"], host="node0012").value == 0.0
    assert _one(families["nodecert_checks"], status="FAIL").value == 1.0

    tflops = next(r["details"]["figures"]["matmul_bf16_tflops"]
                  for c in report["checks"] if c["id"] == "gpu-matmul"
                  for r in c["results"] if r["device"]["index"] == 3)
    assert _one(families["nodecert_matmul_bf16_flops"], gpu="3").value == pytest.approx(tflops * 1e12)
    assert "nodecert_allreduce_busbw_bytes_per_second" in families
    assert "nodecert_dataloader_max_samples_per_second" in families

    finished = dt.datetime.fromisoformat(report["started_at"]).timestamp() + report["duration_s"]
    assert families["nodecert_last_run_timestamp_seconds"][0].value == pytest.approx(finished)


def test_write_is_atomic_and_leaves_no_temporary_file(tmp_path, small_fleet) -> None:
    path = tmp_path / "nodecert.prom"
    prometheus.write(small_fleet[:1], path)
    first = os.stat(path).st_ino
    prometheus.write(small_fleet[1:2], path)
    assert os.stat(path).st_ino != first  # replaced by rename, never rewritten in place
    assert os.listdir(tmp_path) == ["nodecert.prom"]
    assert 'host="node0001"' in path.read_text()


def test_fleet_directory(tmp_path, small_fleet) -> None:
    fleet = aggregate.from_reports(small_fleet)
    paths = prometheus.write_fleet(fleet, tmp_path / "textfiles", host_files=True)
    assert len(paths) == 25 and all(p.suffix == ".prom" for p in paths)
    # the default: the bounded summary alone; host files an earlier run left are removed
    fleet_file = tmp_path / "textfiles" / "nodecert-fleet.prom"
    assert prometheus.write_fleet(fleet, tmp_path / "textfiles") == [fleet_file]
    assert os.listdir(tmp_path / "textfiles") == ["nodecert-fleet.prom"]
    families = _parse(tmp_path / "textfiles" / "nodecert-fleet.prom")
    assert "nodecert_check_status" not in families and "nodecert_gpu_info" not in families
    healthy = {s.labels["host"]: (s.labels["status"], s.value)
               for s in families["nodecert_fleet_host_healthy"]}
    assert len(healthy) == 24
    assert healthy["node0012"] == ("FAIL", 0.0) and healthy["node0000"] == ("PASS", 1.0)
    assert healthy["node0007"] == ("FAIL", 0.0)  # a straggler FAIL: its own report passed
    stamps = families["nodecert_fleet_host_report_timestamp_seconds"]
    assert len(stamps) == 24 and {s.value for s in stamps} == {h.report_finished_at for h in fleet.hosts}
    hosts = {s.labels["status"]: s.value for s in families["nodecert_fleet_hosts"]}
    assert hosts == {"PASS": 20.0, "WARN": 1.0, "FAIL": 3.0, "ERROR": 0.0, "MISSING": 0.0}
    slow = families["nodecert_straggler_deficit_ratio"]
    assert _one(slow, host="node0010", figure="allreduce_busbw_gbs").value == pytest.approx(0.4, abs=0.03)
    assert _one(slow, host="node0007").labels["gpu"] == "3"
    assert _one(slow, host="node0007").labels["pci"] != ""
    assert _one(slow, host="node0010", figure="allreduce_busbw_gbs").labels["pci"] == ""
    [stamp] = families["nodecert_fleet_last_run_timestamp_seconds"]
    assert stamp.value == pytest.approx(dt.datetime.fromisoformat(fleet.generated_at).timestamp())


def test_a_lemon_is_placed_where_it_is_now(tmp_path, small_fleet) -> None:
    fleet = aggregate.from_reports(small_fleet)
    node12 = next(r for r in small_fleet if r["host"] == "node0012")
    gpu5 = next(r["device"] for c in node12["checks"] if c["id"] == "ecc-errors"
                for r in c["results"] if r["device"]["index"] == 5)
    fleet.lemons = [
        Lemon(gpu5["uuid"], 3, 4, 5, ("node0003", "node0012"), ("ecc-errors",), "run-small"),
        Lemon("GPU-gone", 2, 2, 5, ("node0099",), ("row-remap",), "run-0"),  # not in this run
    ]
    families = _parse(prometheus.write_fleet(fleet, tmp_path)[-1])
    lemons = families["nodecert_lemon_failed_runs"]
    here = _one(lemons, uuid=gpu5["uuid"])
    assert here.value == 3.0
    assert here.labels == {"uuid": gpu5["uuid"], "host": "node0003,node0012", "gpu": "5",
                           "pci": gpu5["pci"], "UUID": gpu5["uuid"],
                           "pci_bus_id": prometheus.dcgm_pci_bus_id(gpu5["pci"])}
    assert _one(lemons, uuid="GPU-gone").labels == {"uuid": "GPU-gone", "host": "node0099",
                                                    "gpu": "", "pci": "", "UUID": "GPU-gone",
                                                    "pci_bus_id": ""}


@pytest.mark.parametrize(("result", "fault"), [
    ({"status": "FAIL", "fault_code": "GPU002"}, "GPU002"),
    ({"status": "ERROR", "fault_code": "XHOST01-E"}, "XHOST01-E"),
    ({"status": "FAIL", "fault_code": None}, "GPU004"),    # a report from before the runner set it
    ({"status": "WARN"}, "GPU004"),
    ({"status": "ERROR", "fault_code": None}, "GPU004-E"),  # "could not collect" has its own code
    ({"status": "PASS", "fault_code": None}, ""),
    ({"status": "SKIP"}, ""),
])
def test_fault_code(result: dict, fault: str) -> None:
    assert prometheus.fault_code(result, "GPU004") == fault


def test_gpu_info_names_every_gpu_once(tmp_path, small_fleet) -> None:
    report = small_fleet[0]
    families = _parse(prometheus.write([report], tmp_path / "nodecert.prom"))
    info = families["nodecert_gpu_info"]
    assert sorted(int(s.labels["gpu"]) for s in info) == list(range(8))
    assert len({s.labels["uuid"] for s in info}) == len({s.labels["pci"] for s in info}) == 8
    assert all(s.labels["name"] == "NVIDIA H100 80GB HBM3" and s.labels["serial"] for s in info)


@pytest.mark.parametrize(("figure", "metric", "factor"), [
    ("matmul_bf16_tflops", "nodecert_matmul_bf16_flops", 1e12),
    ("membw_copy_gbs", "nodecert_membw_copy_bytes_per_second", 1e9),
    ("samples_per_s", "nodecert_samples_per_second", 1.0),
    ("step_time_ms", "nodecert_step_time_seconds", 1e-3),
    ("latency_us", "nodecert_latency_seconds", 1e-6),
    ("epoch_s", "nodecert_epoch_seconds", 1.0),
    ("Odd-Name", "nodecert_odd_name", 1.0),
])
def test_figure_metric_names(figure: str, metric: str, factor: float) -> None:
    got = prometheus.figure_metric(figure)
    assert (got.name, got.factor) == (metric, factor)


@pytest.mark.parametrize(("pci", "bus_id"), [
    ("0000:1b:00.0", "00000000:1B:00.0"),       # sysfs spelling
    ("00000000:1B:00.0", "00000000:1B:00.0"),   # NVML's, as dcgm-exporter prints it
    ("0001:ab:1f.7", "00000001:AB:1F.7"),
    ("1b:00.0", "00000000:1B:00.0"),             # no domain: domain 0
    ("", ""),
    ("not-an-address", "NOT-AN-ADDRESS"),
])
def test_dcgm_pci_bus_id(pci: str, bus_id: str) -> None:
    assert prometheus.dcgm_pci_bus_id(pci) == bus_id


def test_a_fleet_finding_marks_the_host_unhealthy_in_its_fleet_written_file(tmp_path, small_fleet) -> None:
    """node0007's own report passes; the fleet finds a straggler GPU: in the file the fleet
    writes for it (the old layout), nodecert_host_healthy is 0; its own file says 1."""
    fleet = aggregate.from_reports(small_fleet)
    [entry] = [h for h in fleet.hosts if h.host == "node0007"]
    assert entry.report["verdict"] == "PASS" and entry.status == "FAIL"
    [finding] = entry.findings
    assert (finding.kind, finding.status, finding.check, finding.gpu.index) == (
        "straggler", "FAIL", "gpu-matmul", 3)
    prometheus.write_fleet(fleet, tmp_path, host_files=True)
    fleet_written = _parse(tmp_path / "nodecert-node0007.prom")
    assert _one(fleet_written["nodecert_host_healthy"], host="node0007").value == 0.0
    own = _parse(prometheus.write([entry.report], tmp_path / "own" / "nodecert.prom"))
    assert _one(own["nodecert_host_healthy"], host="node0007").value == 1.0


def test_drift_and_digest_are_exported(tmp_path, h100_report) -> None:
    fleet = drift_fleet.build(h100_report, tmp_path / "history.sqlite")
    families = _parse(prometheus.write_fleet(fleet, tmp_path / "textfiles")[0])
    drift = {(s.labels["host"], s.labels["gpu"], s.labels["status"]): s
             for s in families["nodecert_drift_deficit_ratio"]}
    assert set(drift) == {("node0002", "5", "FAIL"), ("node0006", "1", "WARN")}
    fail = drift[("node0002", "5", "FAIL")]
    assert (fail.labels["check"], fail.labels["figure"], fail.labels["baseline"]) == (
        "gpu-matmul", "matmul_bf16_tflops", "median")
    assert fail.value == pytest.approx(0.11, abs=0.02) and fail.labels["pci_bus_id"].startswith("00000000:")
    [odd] = families["nodecert_digest_mismatch"]
    assert (odd.labels["host"], odd.labels["gpu"], odd.labels["status"]) == ("node0004", "3", "FAIL")
    assert odd.labels["digest"] == drift_fleet.ODD[:16] and odd.labels["majority"] == drift_fleet.GOOD[:16]
    healthy = {s.labels["host"]: s.value for s in families["nodecert_fleet_host_healthy"]}
    assert healthy["node0002"] == healthy["node0004"] == 0.0 and healthy["node0006"] == 1.0
    # and in the fleet summary JSON, per host, one line each: what the Slurm helper drains on
    hosts = {h["host"]: h for h in fleet.to_dict()["hosts"]}
    assert [(f["kind"], f["status"], f["gpu"]["index"]) for f in hosts["node0002"]["findings"]] == [
        ("straggler", "WARN", 5), ("drift", "FAIL", 5)]
    assert [(f["kind"], f["status"], f["gpu"]["index"]) for f in hosts["node0004"]["findings"]] == [
        ("digest", "FAIL", 3)]
    assert all("\n" not in f["reason"] for h in hosts.values() for f in h["findings"])
    # and in the fleet JUnit: a failing test case per FAIL finding, in the host's suite
    suites = {suite.get("name"): suite for suite in fleet_junit.to_xml(fleet).iter("testsuite")}
    [case] = [c for c in suites["node0004"] if c.get("name", "").startswith("digest ")]
    assert (case.get("name"), case.find("failure").get("type")) == ("digest reference-digest GPU3", "digest")
    drifting = [c for c in suites["node0002"] if c.get("name", "").startswith("drift ")]
    assert [c.find("failure") is not None for c in drifting] == [True]
