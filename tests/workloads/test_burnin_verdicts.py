"""Burn-in judges throughput and clocks under load; without an NVML sample it is not a PASS."""

from __future__ import annotations

from typing import Any

import pytest

from checks.node.suite.burnin import clock_problems, load_samples


@pytest.mark.parametrize("clock,fails,warns", [
    (1755, 0, 0),    # power-capped H100 under GEMM load: 89 % of 1980
    (1300, 0, 1),    # 66 %: below the warn fraction
    (840, 1, 0),     # 42 %: HW slowdown territory (clocks halved or worse)
])
def test_sm_clock_under_load_against_max(clock: int, fails: int, warns: int) -> None:
    samples = [{"sm_clock_mhz": clock, "utilization_gpu": 100}] * 3
    f, w, median = clock_problems(samples, max_mhz=1980, warn_fraction=0.7, fail_fraction=0.5)
    assert (len(f), len(w)) == (fails, warns)
    assert median == clock


def test_clock_is_the_median_so_one_dip_does_not_fail() -> None:
    samples = [{"sm_clock_mhz": c} for c in (1755, 1750, 300, 1760)]
    f, w, median = clock_problems(samples, max_mhz=1980, warn_fraction=0.7, fail_fraction=0.5)
    assert (f, w, median) == ([], [], 1752.5)


def test_unknown_max_clock_is_not_judged() -> None:
    assert clock_problems([{"sm_clock_mhz": 300}], max_mhz=None, warn_fraction=0.7,
                          fail_fraction=0.5) == ([], [], None)


def test_only_busy_answered_samples_count_as_under_load() -> None:
    samples = [{"t": 0, "gpu": 0, "sm_clock_mhz": 345, "utilization_gpu": 0},      # not yet busy
               {"t": 2, "gpu": 0, "sm_clock_mhz": 1755, "utilization_gpu": 100},
               {"t": 4, "gpu": 0, "sm_clock_mhz": None, "clock_event_reasons": None},  # failed
               {"t": 6, "error": "NVMLError_Unknown"}]
    assert load_samples(samples, 50) == [samples[1]]


def results(report: dict[str, Any]) -> list[dict[str, Any]]:
    return next(c for c in report["checks"] if c["id"] == "burn-in")["results"]


def test_healthy_burn_in_passes_with_clock_and_throughput_figures(run_cli: Any) -> None:
    code, report = run_cli("--simulate", "h100-sxm-8x-healthy", "--level", "burn-in",
                           "--only", "burn-in")
    assert code == 0
    rows = results(report)
    assert [r["status"] for r in rows] == ["PASS"] * 8
    assert rows[0]["details"]["figures"] == {"burnin_tflops": 690.0,
                                             "burnin_sm_clock_mhz": 1755.0}
    assert "SM 1755 of 1980 MHz under load" in rows[0]["message"]


def test_gpu_slow_under_load_with_normal_clocks_fails_on_throughput(run_cli: Any) -> None:
    code, report = run_cli("--simulate", "workload-burnin-slow-gpu", "--level", "burn-in",
                           "--only", "burn-in")
    assert code == 1
    rows = results(report)
    assert [r["device"]["index"] for r in rows if r["status"] == "FAIL"] == [3]
    assert {r["status"] for i, r in enumerate(rows) if i != 3} == {"PASS"}
    msg = rows[3]["message"]
    assert "straggler: 238 TFLOP/s is 65 % below the median of the other GPUs" in msg
    assert "below 494 (0.5 x 989 spec peak" in msg
    assert rows[3]["fault_code"] == "BRN001"


def test_straggler_rule_alone_catches_it_without_a_spec_peak(run_cli: Any) -> None:
    _, report = run_cli("--simulate", "workload-burnin-slow-gpu", "--level", "burn-in",
                        "--only", "burn-in", "--profile", "generic")
    rows = results(report)
    assert rows[3]["status"] == "FAIL" and "below 494" not in rows[3]["message"]
    assert "straggler" in rows[3]["message"]


def test_hw_slowdown_under_load_fails_with_clock_and_reasons(run_cli: Any) -> None:
    code, report = run_cli("--simulate", "workload-burnin-hw-slowdown", "--level", "burn-in",
                           "--only", "burn-in")
    assert code == 1
    rows = results(report)
    assert [r["device"]["index"] for r in rows if r["status"] == "FAIL"] == [6]
    msg = rows[6]["message"]
    assert "clocks throttled under load: HW slowdown, HW thermal slowdown" in msg
    assert "840 MHz = 42 % of its max 1980 MHz" in msg


def test_no_nvml_sample_under_load_is_an_error_never_a_pass(run_cli: Any) -> None:
    code, report = run_cli("--simulate", "workload-burnin-no-nvml-samples", "--level",
                           "burn-in", "--only", "burn-in")
    assert code == 1
    rows = results(report)
    assert {r["status"] for r in rows} == {"ERROR"}
    assert {r["fault_code"] for r in rows} == {"BRN001-E"}
    assert "clocks and throttling under load not measured" in rows[0]["message"]


def test_sampler_failures_without_gpu_rows_are_named() -> None:
    # What burn.py records when the sampler itself raises: rows with only "t" and "error".
    from checks import profiles
    from checks.hw.fixture import FixtureBackend
    from checks.node.context import Context, Options
    from checks.node.suite.burnin import burn_in

    class SamplerBroke(FixtureBackend):
        def workload(self, name: str, **params: Any) -> Any:
            m = super().workload(name, **params)
            m["samples"] = [{"t": 0.0, "error": "NVMLError_GpuIsLost: GPU is lost"}]
            return m

    hw = SamplerBroke.from_file("h100-sxm-8x-healthy")
    ctx = Context(hw, profiles.load("h100-sxm"), Options(level="burn-in", duration_s=60))
    rows = list(burn_in(ctx))
    assert len(rows) == 8 and {r.status.value for r in rows} == {"ERROR"}
    assert "NVML gave no sample while it ran (1 sampling error(s), first: NVMLError_GpuIsLost" \
        in rows[0].message
