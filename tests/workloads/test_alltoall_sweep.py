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


def test_all_to_all_is_timed_and_verified_in_the_sweep(one_rank_group: Any) -> None:
    from checks.hw.measure import collective_rank

    c, rank = one_rank_group
    rows = collective_rank.sweep(c, rank, "all_to_all", [64, 4096], 1, 2)
    assert [r["bytes"] for r in rows] == [64, 4096]
    assert all(r["wrong"] == 0 and r["time_us"] > 0 and r["busbw_gbs"] == 0 for r in rows)
