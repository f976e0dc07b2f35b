"""NaN and infinity are never PASS: node thresholds, straggler rules, the fleet's statistics, the
profile thresholds and the --expect-* options."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from checks.devtools import synthetic
from checks.fleet.fleet_cli import main as fleet_main
from checks.model import Result, Status, finite_or_error, passed
from checks.node import node_cli, rules

NAN, INF = math.nan, math.inf


@pytest.mark.parametrize(("value", "floor", "below"), [
    (NAN, 10.0, True), (INF, 10.0, True), (-INF, 10.0, True),
    (9.9, 10.0, True), (10.0, 10.0, False), (11.0, 10.0, False),
])
def test_below_is_true_for_anything_not_a_finite_number(value, floor, below) -> None:
    assert rules.below(value, floor) is below


def test_a_nan_member_is_a_straggler_and_does_not_poison_its_peers() -> None:
    slow = rules.stragglers({0: 100.0, 1: NAN, 2: 99.0, 3: 101.0, 4: 70.0}, pct=10)
    assert set(slow) == {1, 4}
    assert slow[1].shortfall_pct == INF and slow[4].peers_median == 100.0


@pytest.mark.parametrize("result", [
    passed("bf16 ok", value=NAN), passed("ok", value=INF),
    passed("ok", value=1.0, details={"figures": {"matmul_bf16_tflops": NAN}}),
    Result(Status.WARN, "slow", value=-INF),
])
def test_a_pass_or_warn_with_a_non_finite_figure_is_an_error(result) -> None:
    judged = finite_or_error(result)
    assert judged.status is Status.ERROR and "not a finite number" in judged.message


def test_finite_results_are_left_alone() -> None:
    ok = passed("fine", value=1.0, details={"figures": {"x": 2.0}})
    assert finite_or_error(ok) is ok


def _nan_scenario(tmp_path: Path) -> Path:
    data = {"description": "test: the healthy H100 node with NaN figures from a broken measurement",
            "extends": "h100-sxm-8x-healthy",
            "measurements": {"matmul": {3: {"bf16": NAN, "fp16": 770.8, "tf32": 379.4, "fp32": 50.7}},
                             "membw": {2: NAN, 5: INF},
                             "p2p": {"default_gbs": NAN}}}
    path = tmp_path / "nan.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_nan_matmul_membw_and_p2p_figures_are_not_pass(tmp_path) -> None:
    out = tmp_path / "r.json"
    code = node_cli.main(["--simulate", str(_nan_scenario(tmp_path)), "--level", "standard",
                          "--only", "gpu-matmul,gpu-membw,p2p-bandwidth", "--json", str(out), "-q"])
    report = json.loads(out.read_text())
    checks = {c["id"]: c for c in report["checks"]}
    assert code == 1 and report["verdict"] == "FAIL"
    for check_id in ("gpu-matmul", "gpu-membw", "p2p-bandwidth"):
        assert checks[check_id]["status"] in ("FAIL", "ERROR"), checks[check_id]
    by_gpu = {r["device"]["index"]: r["status"] for r in checks["gpu-matmul"]["results"]}
    assert by_gpu[3] in ("FAIL", "ERROR") and by_gpu[0] == "PASS"
    membw = {r["device"]["index"]: r["status"] for r in checks["gpu-membw"]["results"]}
    assert membw[2] != "PASS" and membw[5] != "PASS" and membw[0] == "PASS"


@pytest.mark.parametrize("argv", [
    ["--expect-rdma-rate", "nan"], ["--expect-rdma-rate", "inf"], ["--expect-rdma-rate", "-400"],
    ["--expect-rdma-rate", "0"], ["--expect-gpus", "-1"], ["--expect-gpus", "nan"],
    ["--expect-nvlink", "1e3"], ["--expect-rdma-nics", "-2"], ["--nproc", "0"],
])
def test_expectations_that_are_not_finite_positive_numbers_are_usage_errors(argv, capsys) -> None:
    assert node_cli.main(["--simulate", "h100-sxm-8x-healthy", "--level", "quick", *argv]) == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]  # argparse: its usage block, then the one error line
    assert "Traceback" not in err and f"error: argument {argv[0]}: " in last


def test_a_nan_figure_in_a_fleet_is_a_straggler_fail(tmp_path) -> None:
    base = synthetic.base_report("h100-sxm-8x-healthy")
    reports = synthetic.build(4, base=base, run_id="r1")
    broken = copy.deepcopy(reports[2])
    for chk in broken["checks"]:
        for r in chk["results"]:
            figures: dict[str, Any] = (r.get("details") or {}).get("figures") or {}
            if "matmul_bf16_tflops" in figures and (r.get("device") or {}).get("index") == 1:
                figures["matmul_bf16_tflops"] = NAN
    reports[2] = broken
    run = tmp_path / "run"
    run.mkdir()
    for doc in reports:
        (run / f"{doc['host']}.json").write_text(json.dumps(doc))  # NaN as JSON's NaN extension
    out = tmp_path / "fleet.json"
    assert fleet_main(["report", str(run), "--no-history", "--json", str(out), "-q"]) == 1
    fleet = json.loads(out.read_text())  # strict JSON: no NaN written
    nan = [s for s in fleet["stragglers"] if s["value"] is None]
    assert len(nan) == 1 and nan[0]["host"] == broken["host"] and nan[0]["status"] == "FAIL"
    assert nan[0]["gpu"]["index"] == 1 and "not a finite number" in nan[0]["reason"]
    assert {h["host"]: h["status"] for h in fleet["hosts"]}[broken["host"]] == "FAIL"
    matmul = [f for f in fleet["figures"] if f["name"] == "matmul_bf16_tflops"]
    assert all(math.isfinite(f["median"]) for f in matmul)
