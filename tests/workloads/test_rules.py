"""Decision rules on fixture numbers: straggler, saturation, derived thresholds, shm need."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

from checks.node import rules

HEALTHY = {0: 788.1, 1: 779.5, 2: 792.6, 3: 775.2, 4: 784.9, 5: 790.3, 6: 770.8, 7: 786.0}


def test_healthy_node_spread_has_no_straggler() -> None:
    assert rules.stragglers(HEALTHY, 10) == {}


def test_gpu_three_times_slow_is_a_straggler_whatever_the_absolute_threshold() -> None:
    slow = {**HEALTHY, 3: 262.4}
    found = rules.stragglers(slow, 10)
    assert list(found) == [3]
    assert found[3].peers_median == pytest.approx(786.0)
    assert found[3].shortfall_pct == pytest.approx(66.6, abs=0.1)


@pytest.mark.parametrize("value,pct,flagged", [
    (700.0, 10, True),    # 10.9 % below 786
    (710.0, 10, False),   # 9.7 % below
    (740.0, 5, True),     # 5.9 % below, a tighter profile
])
def test_straggler_threshold_is_the_profile_percentage(value: float, pct: float,
                                                       flagged: bool) -> None:
    assert (3 in rules.stragglers({**HEALTHY, 3: value}, pct)) is flagged


def test_two_gpus_name_only_the_slower_one() -> None:
    assert list(rules.stragglers({"a": 100.0, "b": 80.0}, 10)) == ["b"]
    assert rules.stragglers({"a": 100.0}, 10) == {}


def test_saturation_is_first_point_within_fraction_of_best() -> None:
    curve = [{"workers": w, "samples_per_s": s}
             for w, s in [(0, 95), (1, 112), (2, 219), (4, 431), (8, 842), (16, 1530), (32, 1560)]]
    assert rules.saturation(curve, 0.9)["workers"] == 16
    flat = [{"workers": w, "samples_per_s": 80.0} for w in (0, 1, 2)]
    assert rules.saturation(flat, 0.9)["workers"] == 0


def test_derived_threshold_prefers_nvlink_then_pcie() -> None:
    nv = rules.derived_link_threshold(nvlinks=12, link_gbs=25, nvlink_fraction=0.7,
                                      pcie_gen=4, pcie_width=16, pcie_fraction=0.3)
    assert nv is not None and nv.value == pytest.approx(210.0) and "12 NVLinks" in nv.source
    pcie = rules.derived_link_threshold(nvlinks=0, link_gbs=25, nvlink_fraction=0.7,
                                        pcie_gen=4, pcie_width=16, pcie_fraction=0.3)
    assert pcie is not None and pcie.value == pytest.approx(1.969 * 16 * 0.3)
    assert rules.derived_link_threshold(nvlinks=0, link_gbs=None, nvlink_fraction=0.7,
                                        pcie_gen=None, pcie_width=None, pcie_fraction=0.3) is None


def test_shm_need_counts_every_rank_worker_and_prefetched_batch() -> None:
    assert rules.shm_needed(batch_bytes=10, workers=8, prefetch=2, ranks=8) == 8 * 17 * 10


def test_busbw_floor_comes_from_the_gpus_the_ranks_run_on() -> None:
    """CUDA_VISIBLE_DEVICES=6,7 on an 8-GPU node whose GPU 0 has half its NVLinks down: a
    2-rank all-reduce runs on GPUs 6 and 7 (18 links each), so the derived floor is theirs, not
    GPU 0's and GPU 1's."""
    from checks import profiles
    from checks.hw.fixture import FixtureBackend, load_scenario
    from checks.node.context import Context, Options
    from checks.node.suite.collective import busbw_threshold

    data = load_scenario("h100-sxm-8x-healthy")
    data["gpus"][0] = {**data["gpus"][0], "nvlink": {"links": 18, "inactive": list(range(9))}}

    def floor(env: dict[str, str]) -> float:
        data["host"] = {**data["host"], "env": env}
        ctx = Context(FixtureBackend(data), profiles.load("generic"), Options(level="quick"))
        threshold = busbw_threshold(ctx, 2)
        assert threshold is not None
        return threshold.value

    full = floor({"CUDA_VISIBLE_DEVICES": "6,7"})
    assert full == pytest.approx(18 * 25 * 0.7)  # generic: 25 GB/s per link x 0.7
    assert floor({}) == pytest.approx(9 * 25 * 0.7)  # unset: GPUs 0 and 1, GPU 0 half down


def test_busbw_floor_says_at_which_size_it_is_judged() -> None:
    from checks import profiles
    from checks.hw.fixture import FixtureBackend, load_scenario
    from checks.node.context import Context, Options
    from checks.node.suite.collective import busbw_threshold

    ctx = Context(FixtureBackend(load_scenario("h100-sxm-8x-healthy")), profiles.load("h100-sxm"),
                  Options(level="quick"))
    threshold = busbw_threshold(ctx, 8)
    assert threshold is not None and threshold.value == 400
    # Azure's ND H100 v5 gate, the source that states a size, runs at 16 GiB
    assert "published at 16 GiB: judged on the peak busbw of sizes up to 16 GiB" in threshold.source


def _h200_context() -> Any:
    from checks import profiles
    from checks.hw.fixture import FixtureBackend, load_scenario
    from checks.node.context import Context, Options

    return Context(FixtureBackend(load_scenario("field-azure-nd96isr-h200-azurehpc134")),
                   profiles.load("h200"), Options(level="quick"))


def test_h200_floor_is_judged_at_the_size_its_source_measured() -> None:
    """h200's 430 GB/s comes from Azure's gate, which runs all_reduce_perf at 16 GiB only: the
    sweep's all-reduce that judges it goes on to 16 GiB (the other ops stop at 256 MiB), and the
    threshold says so; a 4-rank run, judged on a derived floor, keeps the default top."""
    from checks.node.suite.collective import busbw_threshold, gpu_sweep

    ctx = _h200_context()
    sweep = dict(ctx.profile.get("collective.sweep_gpu"))
    assert sweep["max_bytes"] == 256 << 20
    assert gpu_sweep(ctx, sweep, 8)["max_bytes"] == 256 << 20
    assert gpu_sweep(ctx, sweep, 8)["floor_bytes"] == 16 << 30
    assert "floor_bytes" not in gpu_sweep(ctx, sweep, 4)
    threshold = busbw_threshold(ctx, 8)
    assert threshold is not None and threshold.value == 430
    assert "published at 16 GiB: judged on the peak busbw of sizes up to 16 GiB" in threshold.source
    derived = busbw_threshold(ctx, 4)
    assert derived is not None and "thresholds.allreduce_busbw_gbs" not in derived.source


def test_the_collective_launch_sweeps_to_the_floors_size() -> None:
    """nccl-allreduce on an 8x H200 node asks its launch's all-reduce for 16 GiB; on 8x H100 SXM
    for 16 GiB too (Azure's ND H100 v5 gate; at 256 MiB, the old top, a healthy node is below
    its 16 GiB figure); on a GB200 tray for 8 GiB."""
    from checks import profiles
    from checks.hw.base import NotSupported
    from checks.hw.fixture import FixtureBackend, load_scenario
    from checks.node.context import Context, Options
    from checks.node.suite.collective import nccl_allreduce

    asked: list[int] = []

    class Recording(FixtureBackend):
        def workload(self, name: str, **params: Any) -> Any:
            if name == "collectives":
                asked.append(int(params["sweep"].get("floor_bytes") or params["sweep"]["max_bytes"]))
            return super().workload(name, **params)

    for scenario, profile in (("field-azure-nd96isr-h200-azurehpc134", "h200"),
                              ("h100-sxm-8x-healthy", "h100-sxm"),
                              ("blackwell-gb200-tray-healthy", "gb200-nvl72")):
        with contextlib.suppress(NotSupported):  # the H200 recording has no collectives
            nccl_allreduce(Context(Recording(load_scenario(scenario)), profiles.load(profile),
                                   Options(level="standard")))
    # gb200-nvl72's tray floor (612) is Azure's ring figure at 8 GB
    assert asked == [16 << 30, 16 << 30, 8 << 30]
