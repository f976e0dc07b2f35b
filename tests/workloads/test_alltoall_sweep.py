"""All-to-all can be swept (gpu-proof's peak sweep): its bus factor, buffer sizes and one timed,
verified sweep in this process on a one-rank gloo group (no launch)."""

from __future__ import annotations

from typing import Any

import pytest

from checks.hw.measure import busbw


def test_all_to_all_bus_factor_and_buffers_follow_nccl_tests() -> None:
    assert busbw.bus_factor("all_to_all", 8) == pytest.approx(7 / 8)
    assert busbw.elements_for("all_to_all", 1000, 3) % 3 == 0
    row = busbw.complete_row("all_to_all", {"bytes": 8 << 20, "time_us": 1000.0}, 8)
    assert row["busbw_gbs"] == pytest.approx(row["algbw_gbs"] * 7 / 8)
    table = busbw.format_table("all_to_all", [row], nranks=8, backend="nccl")
    assert "all_to_all" in table and " none " in table
    assert set(busbw.SWEPT_OPS) == set(busbw.OPS) | {"all_to_all"}


class _Rank:
    rank = local_rank = 0
    world_size = 1

    def beat(self, phase: str) -> None:
        self.last = phase

    def should_corrupt(self, op: str) -> bool:
        return False


def test_all_to_all_is_timed_and_verified_in_the_sweep(tmp_path: Any) -> None:
    import torch
    import torch.distributed as dist

    from checks.hw.measure import collective_rank

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        c = collective_rank.Collectives(_Rank(), torch.device("cpu"))  # type: ignore[arg-type]
        rows = collective_rank.sweep(c, _Rank(), "all_to_all", [64, 4096], 1, 2)  # type: ignore[arg-type]
    finally:
        dist.destroy_process_group()
    assert [r["bytes"] for r in rows] == [64, 4096]
    assert all(r["wrong"] == 0 and r["time_us"] > 0 and r["busbw_gbs"] == 0 for r in rows)
