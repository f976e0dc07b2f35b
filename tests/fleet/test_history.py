"""Run history in SQLite: lemons are GPUs (by UUID, wherever they moved) failing N of the last M runs."""

from __future__ import annotations

import sqlite3
from typing import Any

import pytest

from checks.fleet import aggregate, history, synthetic
from checks.fleet.synthetic import Broken, Slow

LEMON_UUID = "GPU-1e301e30-0000-4000-8000-000000000001"


def _run(
    base: dict[str, Any], run_id: str, *, broken=(), slow=(), moved_to: str | None = None
) -> aggregate.Fleet:
    """4 hosts; the lemon GPU sits in node0001 (index 1), or in `moved_to` (index 2)."""
    reports = synthetic.build(4, base=base, run_id=run_id, broken=broken, slow=slow)
    by_host = {r["host"]: r for r in reports}
    if moved_to:
        synthetic.set_uuid(by_host[moved_to], 2, LEMON_UUID)
    else:
        synthetic.set_uuid(by_host["node0001"], 1, LEMON_UUID)
    return aggregate.from_reports(reports, run_id=run_id)


@pytest.fixture()
def store(tmp_path) -> history.History:
    with history.History(tmp_path / "reports" / "history.sqlite") as db:
        yield db


def test_a_gpu_failing_twice_is_a_lemon_even_after_it_moved(store, h100_report) -> None:
    store.record(_run(h100_report, "r1", broken=[Broken("node0001", "ecc-errors", gpu=1)]))
    store.record(_run(h100_report, "r2"))
    store.record(
        _run(
            h100_report,
            "r3",
            broken=[Broken("node0003", "ecc-errors", gpu=2), Broken("node0000", "row-remap", gpu=4)],
            moved_to="node0003",
        )
    )
    [lemon] = store.lemons()
    assert lemon.uuid == LEMON_UUID
    assert (lemon.failed_runs, lemon.seen_runs, lemon.window) == (2, 3, 5)
    assert lemon.hosts == ("node0001", "node0003")
    assert lemon.checks == ("ecc-errors",)
    assert lemon.last_failed_run == "r3"


def test_only_the_last_m_runs_count(store, h100_report) -> None:
    store.record(_run(h100_report, "r1", broken=[Broken("node0001", "ecc-errors", gpu=1)]))
    store.record(_run(h100_report, "r2", broken=[Broken("node0001", "ecc-errors", gpu=1)]))
    for i in range(3, 7):
        store.record(_run(h100_report, f"r{i}"))
    assert store.lemons(failures=2, runs=5) == []
    assert [lemon.uuid for lemon in store.lemons(failures=2, runs=6)] == [LEMON_UUID]


def test_recording_a_run_again_replaces_it(store, h100_report) -> None:
    run = _run(h100_report, "r1", broken=[Broken("node0001", "ecc-errors", gpu=1)])
    store.record(run)
    store.record(run)
    assert store.runs() == ["r1"]
    assert store.lemons(failures=2) == []


def test_a_straggler_fail_counts_as_a_failure(store, h100_report) -> None:
    for run_id in ("r1", "r2"):
        store.record(_run(h100_report, run_id, slow=[Slow("node0001", "matmul_bf16_tflops", 0.5, gpu=1)]))
    [lemon] = store.lemons()
    assert lemon.uuid == LEMON_UUID and lemon.checks == ("straggler:gpu-matmul/matmul_bf16_tflops",)


def test_figures_and_gpus_are_stored(store, h100_report) -> None:
    store.record(_run(h100_report, "r1"))
    db = sqlite3.connect(store.path)
    assert db.execute("SELECT COUNT(*) FROM gpus WHERE run_id = 'r1'").fetchone() == (32,)
    names = {n for (n,) in db.execute("SELECT DISTINCT name FROM figures")}
    assert names == {
        "matmul_bf16_tflops",
        "membw_copy_gbs",
        "allreduce_busbw_gbs",
        "dataloader_max_samples_per_s",
    }
    value = db.execute(
        "SELECT value FROM figures WHERE gpu_uuid = ? AND name = 'membw_copy_gbs'", (LEMON_UUID,)
    ).fetchone()[0]
    assert value == pytest.approx(synthetic.MEM_BW_GBS, rel=0.03)
