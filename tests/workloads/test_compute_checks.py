"""CPU paths of the compute and burn-in measurements, and the per-GPU verdicts on fixture
numbers (straggler rule, P2P pairs, burn-in samples)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from checks.hw.measure import burn
from checks.hw.measure import compute_run as compute
from checks.model import Status
from checks.node import rules
from checks.node.suite.burnin import majority_digest, sample_problems
from checks.node.suite.compute import judge_per_gpu
from checks.node.suite.p2p import judge_p2p


def test_cpu_matmul_and_copy_report_positive_figures() -> None:
    flops = compute.matmul(torch.device("cpu"), ["fp32"], 128, warmup=1, repeats=2,
                           min_time_s=0.01)
    assert set(flops) == {"fp32"} and flops["fp32"] > 0
    assert compute.copy_bandwidth(torch.device("cpu"), 1 << 20, warmup=1, repeats=2,
                                  min_time_s=0.01) > 0


def test_cpu_burn_repeats_bit_identical_results() -> None:
    m = burn.burn([torch.device("cpu")], duration_s=0.3, n=64, dtype="fp32")
    (d,) = m["devices"]
    assert d["iterations"] > 1 and d["mismatched_elements"] == 0
    assert d["digest_first"] == d["digest_last"]


def test_burn_notices_a_result_that_changes() -> None:
    calls = {"n": 0}
    real_mm = torch.mm

    def flaky_mm(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> Any:
        calls["n"] += 1
        result = real_mm(a, b, out=out) if out is not None else real_mm(a, b)
        if calls["n"] == 5:  # one GEMM goes wrong in one element
            result.view(torch.int32)[0, 0] ^= 1
        return result

    torch.mm = flaky_mm  # type: ignore[assignment]
    try:
        m = burn.burn([torch.device("cpu")], duration_s=0.2, n=32, dtype="fp32")
    finally:
        torch.mm = real_mm  # type: ignore[assignment]
    assert m["devices"][0]["mismatched_elements"] == 1


PEAKS = {"bf16_tflops": 989.0}


def test_per_gpu_verdict_names_the_straggler_and_the_threshold_separately() -> None:
    values = {i: {"bf16_tflops": v} for i, v in enumerate([788, 780, 792, 262, 785, 790, 771, 786])}
    loose = {"bf16_tflops": rules.Threshold(200.0, "loose")}
    verdicts = judge_per_gpu(values, ["bf16_tflops"], loose, PEAKS, 10, "TFLOP/s")
    assert [i for i, (problems, _) in verdicts.items() if problems] == [3]
    assert verdicts[3][0][0].startswith("straggler: bf16 262.0")
    strict = {"bf16_tflops": rules.Threshold(494.5, "0.5 x 989")}
    verdicts = judge_per_gpu(values, ["bf16_tflops"], strict, PEAKS, 10, "TFLOP/s")
    assert len(verdicts[3][0]) == 2  # below the threshold and a straggler
    assert "(80 % of 989)" in verdicts[0][1][0]


def _p2p(n: int, gbs: float, **pairs: float) -> dict[str, Any]:
    bw: list[list[float | None]] = [[None if i == j else gbs for j in range(n)] for i in range(n)]
    for key, value in pairs.items():
        i, j = map(int, key[1:].split("_"))
        bw[i][j] = value
    return {"count": n, "access": [[True] * n for _ in range(n)], "bandwidth_gbs": bw}


def _nvlink(n: int) -> dict[tuple[int, int], str]:
    return {(i, j): "nvlink" for i in range(n) for j in range(n) if i != j}


def test_p2p_names_a_slow_pair_and_passes_a_healthy_matrix() -> None:
    floor = dict.fromkeys(_nvlink(4), rules.Threshold(270, "derived"))
    (ok,) = judge_p2p(_p2p(4, 368.0), _nvlink(4), floor, 10)
    assert ok.status is Status.PASS
    (bad,) = judge_p2p(_p2p(4, 368.0, p2_1=120.0), _nvlink(4), floor, 10)
    assert bad.status is Status.FAIL and "GPU2->GPU1 (nvlink) 120.0 GB/s below 270.0" in bad.message
    (slow,) = judge_p2p(_p2p(4, 368.0, p0_3=300.0), _nvlink(4), {}, 10)
    assert slow.status is Status.FAIL and "GPU0->GPU3" in slow.message
    m = _p2p(2, 25.0)
    m["access"][0][1] = False
    (no_access,) = judge_p2p(m, _nvlink(2), {}, 10, access_expected=dict.fromkeys(_nvlink(2), True))
    assert no_access.status is Status.FAIL and "no peer access for GPU0->GPU1" in no_access.message
    (pcie,) = judge_p2p(m, _nvlink(2), {}, 10, access_expected=dict.fromkeys(_nvlink(2), False))
    assert pcie.status is Status.PASS


@pytest.mark.parametrize("sample,failures,warnings", [
    ({"clock_event_reasons": 0x4, "pcie_gen_current": 5, "pcie_width_current": 16,
      "temperature_c": 70}, 0, 0),                      # power cap under GEMM load is normal
    ({"clock_event_reasons": 0x40, "pcie_gen_current": 5, "pcie_width_current": 16,
      "temperature_c": 88}, 1, 1),                      # HW thermal slowdown, near slowdown
    ({"clock_event_reasons": 0, "pcie_gen_current": 3, "pcie_width_current": 8,
      "temperature_c": 60}, 1, 1),                      # link narrowed and downtrained
])
def test_burn_in_samples_under_load(sample: dict[str, Any], failures: int,
                                    warnings: int) -> None:
    f, w = sample_problems([sample], pcie_gen_max=5, pcie_width_max=16, slowdown_c=87,
                           margin_c=5)
    assert (len(f), len(w)) == (failures, warnings)


def test_majority_digest_needs_a_majority() -> None:
    assert majority_digest([{"d": "a"}, {"d": "a"}, {"d": "b"}], "d") == "a"
    assert majority_digest([{"d": "a"}, {"d": "b"}], "d") is None
