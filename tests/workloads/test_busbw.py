"""nccl-tests arithmetic: bus factors (odd world sizes too), sweep sizes, rows, the table."""

from __future__ import annotations

import pytest

from checks.hw.measure import busbw


@pytest.mark.parametrize("op,n,factor", [
    ("all_reduce", 2, 1.0), ("all_reduce", 3, 4 / 3), ("all_reduce", 8, 1.75),
    ("all_gather", 2, 0.5), ("all_gather", 3, 2 / 3), ("reduce_scatter", 8, 0.875),
    ("broadcast", 3, 1.0), ("all_reduce", 1, 0.0),
])
def test_bus_factor_matches_nccl_tests(op: str, n: int, factor: float) -> None:
    assert busbw.bus_factor(op, n) == pytest.approx(factor)


def test_unknown_op_and_bad_rank_count_raise() -> None:
    with pytest.raises(ValueError):
        busbw.bus_factor("all_to_all_v", 2)
    with pytest.raises(ValueError):
        busbw.bus_factor("all_reduce", 0)


def test_sweep_sizes_are_inclusive_powers() -> None:
    assert busbw.sweep_sizes(8, 64) == [8, 16, 32, 64]
    assert busbw.sweep_sizes(8, 100, 4) == [8, 32]
    assert busbw.sweep_sizes(8, 268435456)[-1] == 268435456


def test_gather_and_scatter_counts_divide_by_world_size() -> None:
    assert busbw.elements_for("all_gather", 8, 3) == 3  # at least one element per rank
    assert busbw.elements_for("reduce_scatter", 1024, 3) == 255
    assert busbw.elements_for("all_reduce", 8, 3) == 2


def test_row_completion_from_time_or_busbw() -> None:
    row = busbw.complete_row("all_reduce", {"bytes": 1_000_000, "time_us": 1000.0}, 4)
    assert row["algbw_gbs"] == pytest.approx(1.0)
    assert row["busbw_gbs"] == pytest.approx(1.5)
    back = busbw.complete_row("all_reduce", {"bytes": 1_000_000, "busbw_gbs": 1.5}, 4)
    assert back["time_us"] == pytest.approx(1000.0)
    with pytest.raises(ValueError):
        busbw.complete_row("all_reduce", {"bytes": 8}, 4)


def test_table_has_nccl_tests_columns_and_summary() -> None:
    rows = [busbw.complete_row("all_gather", {"bytes": b, "count": b // 4, "time_us": 10.0}, 3)
            for b in (12, 1200)]
    text = busbw.format_table("all_gather", rows, nranks=3, backend="gloo")
    assert "algbw" in text and "busbw" in text and "#wrong" in text
    assert "Avg bus bandwidth" in text and "Out of bounds values : 0 OK" in text
    assert len(text.splitlines()) == 4 + 2 + 3
