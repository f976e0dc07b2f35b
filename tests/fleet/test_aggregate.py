"""Aggregation over 1 000 hosts x 8 GPUs: the report names exactly the planted faults."""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

import jsonschema
import pytest

from checks.devtools import synthetic
from checks.devtools.synthetic import Slow
from checks.report import aggregate, figures, load, stragglers
from checks.report.figures import Figure, GpuRef

from .conftest import PlantedFleet


@pytest.fixture(scope="module")
def fleet(planted: PlantedFleet) -> aggregate.Fleet:
    return aggregate.load(planted.directory, expected_hosts=planted.hosts, host_errors=planted.missing)


def test_stragglers_are_exactly_the_planted_ones(fleet: aggregate.Fleet, planted: PlantedFleet) -> None:
    found = {(s.host, s.name, s.gpu.index if s.gpu else None, s.status) for s in fleet.stragglers}
    expected = {(s.host, s.figure, s.gpu, "FAIL" if s.factor < 0.9 else "WARN") for s in planted.slow}
    assert found == expected


def test_failed_checks_name_exactly_the_planted_hosts_and_gpus(fleet: aggregate.Fleet,
                                                               planted: PlantedFleet) -> None:
    where = {c.check: [(o.host, o.gpus, o.message) for o in c.occurrences] for c in fleet.by_check}
    assert where == {b.check: [(b.host, [f"GPU{b.gpu}"] if b.gpu is not None else [], b.message)]
                     for b in planted.broken}


def test_host_statuses(fleet: aggregate.Fleet, planted: PlantedFleet) -> None:
    by_status: dict[str, set[str]] = defaultdict(set)
    for h in fleet.hosts:
        by_status[h.status].add(h.host)
    assert by_status["FAIL"] == ({s.host for s in planted.slow if s.factor < 0.9}
                                 | {b.host for b in planted.broken})
    assert by_status["WARN"] == {s.host for s in planted.slow if s.factor >= 0.9}
    assert by_status["ERROR"] == set(planted.unreadable)
    assert by_status["MISSING"] == set(planted.missing)
    assert len(by_status["PASS"]) == 1004 - 12
    assert fleet.summary == {"hosts": 1004, "PASS": 992, "WARN": 2, "FAIL": 6, "ERROR": 2, "MISSING": 2}
    assert (fleet.verdict, fleet.exit_code) == ("FAIL", 1)


def test_unreadable_and_missing_hosts_say_why(fleet: aggregate.Fleet, planted: PlantedFleet) -> None:
    hosts = {h.host: h for h in fleet.hosts}
    for name in planted.unreadable:
        assert hosts[name].reason.startswith("report unreadable: ")
    assert "BROKEN" in hosts["node1001"].reason  # the schema violation is quoted
    assert "checks/0/results/0/status" in hosts["node1001"].reason
    for name, reason in planted.missing.items():
        assert hosts[name].reason == reason


def test_medians_are_per_peer_group(fleet: aggregate.Fleet) -> None:
    stats = {(s.key.name, s.key.scope): s for s in fleet.figure_stats}
    assert stats[("matmul_bf16_tflops", "gpu")].count == 8000
    assert stats[("allreduce_busbw_gbs", "host")].count == 1000
    median = stats[("matmul_bf16_tflops", "gpu")].median
    assert median == pytest.approx(synthetic.MATMUL_BF16_TFLOPS, rel=0.01)
    assert {s.key.profile for s in fleet.figure_stats} == {"h100-sxm"}


def test_fleet_summary_matches_its_schema(fleet: aggregate.Fleet, fleet_schema: dict[str, Any]) -> None:
    jsonschema.Draft202012Validator.check_schema(fleet_schema)
    doc = json.loads(json.dumps(fleet.to_dict()))
    jsonschema.Draft202012Validator(fleet_schema).validate(doc)
    assert doc["stragglers"][0]["status"] == "FAIL"


def test_curves_are_collected(fleet: aggregate.Fleet) -> None:
    checks = {c.check for c in fleet.curves}
    assert checks == {"nccl-allreduce", "dataloader-scaling"}
    allreduce = next(c for c in fleet.curves if c.check == "nccl-allreduce")
    assert allreduce.gpu is None and allreduce.points[0]["bytes"] == 8


def test_python_validator_agrees_with_the_fast_one(planted: PlantedFleet) -> None:
    paths = [*sorted(planted.directory.glob("node100[01].json")), planted.directory / "node0042.json"]
    fast = [load.read(p, validate=load.validator("auto")) for p in paths]
    slow = [load.read(p, validate=load.validator("python")) for p in paths]
    assert [f.report is None for f in fast] == [s.report is None for s in slow] == [True, True, False]
    assert "BROKEN" in slow[1].error


def test_a_fleet_summary_in_the_run_directory_is_not_a_host(tmp_path, h100_report) -> None:
    synthetic.write(synthetic.build(3, base=h100_report), tmp_path)
    first = aggregate.load(tmp_path)
    (tmp_path / "fleet.json").write_text(json.dumps(first.to_dict()))
    assert [h.host for h in aggregate.load(tmp_path).hosts] == ["node0000", "node0001", "node0002"]


def test_one_host_finds_a_slow_gpu_among_its_own(h100_report) -> None:
    [report] = synthetic.build(1, base=h100_report, slow=[Slow("node0000", "membw_copy_gbs", 0.7, gpu=6)])
    fleet = aggregate.from_reports([report])
    assert [(s.host, s.gpu.index, s.status) for s in fleet.stragglers] == [("node0000", 6, "FAIL")]
    assert fleet.hosts[0].status == "FAIL"


def test_different_gpu_models_are_not_peers(h100_report, cpu_report) -> None:
    reports = synthetic.build(3, base=h100_report)
    cpu = synthetic.build(3, base=cpu_report)
    for i, r in enumerate(cpu):
        r["host"] = f"cpu{i}"
    fleet = aggregate.from_reports(reports + cpu)
    profiles = {(s.key.name, s.key.profile) for s in fleet.figure_stats}
    assert ("allreduce_busbw_gbs", "h100-sxm") in profiles
    assert ("allreduce_busbw_gbs", "generic") in profiles
    assert fleet.stragglers == []


def test_straggler_pct_comes_from_the_profile() -> None:
    assert aggregate.straggler_pct("h100-sxm") == 10
    assert aggregate.straggler_pct("no-such-profile") == stragglers.DEFAULT_PCT


@pytest.mark.parametrize(("name", "higher"), [
    ("matmul_bf16_tflops", True), ("membw_copy_gbs", True), ("samples_per_s", True),
    ("step_time_ms", False), ("latency_us", False), ("epoch_s", False),
])
def test_direction_from_the_figure_name(name: str, higher: bool) -> None:
    assert figures.higher_is_better(name) is higher


def _figs(name: str, values: list[float]) -> dict[stragglers.PeerKey, list[Figure]]:
    figs = [Figure(f"h{i}", "chk", name, v, GpuRef(0, None, f"U{i}")) for i, v in enumerate(values)]
    return stragglers.group_by_host([("p", figs)])[0]


@pytest.mark.parametrize(("value", "status"), [
    (100.0, None), (96.0, None), (95.0, None),      # 5 % is not more than X/2
    (94.9, "WARN"), (90.0, "WARN"),                 # 10 % is not more than X
    (89.9, "FAIL"), (10.0, "FAIL"), (150.0, None),  # faster than the median is never a straggler
])
def test_straggler_rule_for_rates(value: float, status: str | None) -> None:
    _, found = stragglers.find(_figs("x_gbs", [100.0] * 9 + [value]), lambda p: 10.0)
    assert [s.status for s in found] == ([status] if status else [])


@pytest.mark.parametrize(("value", "status"), [(104.0, None), (106.0, "WARN"), (111.0, "FAIL"), (50.0, None)])
def test_straggler_rule_for_times(value: float, status: str | None) -> None:
    _, found = stragglers.find(_figs("step_ms", [100.0] * 9 + [value]), lambda p: 10.0)
    assert [s.status for s in found] == ([status] if status else [])


def test_straggler_limit_is_the_profiles(value: float = 85.0) -> None:
    _, strict = stragglers.find(_figs("x_gbs", [100.0] * 9 + [value]), lambda p: 10.0)
    _, loose = stragglers.find(_figs("x_gbs", [100.0] * 9 + [value]), lambda p: 40.0)
    assert [s.status for s in strict] == ["FAIL"] and loose == []


def test_too_few_peers_for_a_verdict() -> None:
    stats, found = stragglers.find(_figs("x_gbs", [100.0, 50.0]), lambda p: 10.0)
    assert found == [] and stats[0].count == 2
