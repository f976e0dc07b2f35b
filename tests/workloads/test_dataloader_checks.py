"""Real DataLoaders (fork workers, small) and the DataLoader verdicts on synthetic figures."""

from __future__ import annotations

import os

import pytest

from checks.hw.measure import dataloader_run as dataloader
from checks.model import Status
from checks.node.suite.dataloader import (
    judge_scaling,
    judge_shm,
    judge_worker_death,
    judge_workers,
    scaling_counts,
)
from checks.supervise import procs


def test_fork_workers_deliver_every_index_once_and_persist() -> None:
    m = dataloader.start_methods(["fork"], persistent=[True, False], workers=2, length=24)
    persistent, fresh = m["runs"]
    assert persistent["ok"] and fresh["ok"]
    assert persistent["workers_reused"] is True and len(persistent["epochs"]) == 2
    assert persistent["epochs"][0]["samples"] == 24
    assert judge_workers(m).status is Status.PASS


def test_audit_catches_missing_duplicated_and_wrong_samples() -> None:
    import torch

    good = dataloader.PatternDataset(6)
    batch = {"index": torch.tensor([0, 1, 1, 3]),
             "data": torch.stack([good[i]["data"] for i in (0, 1, 1, 3)])}
    batch["data"][3, 0] += 1  # sample 3 corrupted in transit
    audit = dataloader._audit([batch], 6, good.width)
    assert not audit["ok"]
    assert audit["missing"] == [2, 4, 5] and audit["duplicated"] == [1] and audit["wrong"] == [3]


def test_broken_start_method_fails_naming_it() -> None:
    m = {"runs": [{"start_method": "fork", "persistent_workers": True, "ok": True},
                  {"start_method": "spawn", "persistent_workers": False, "ok": False,
                   "error": "RuntimeError: DataLoader worker (pid 7) is killed by signal: Bus "
                            "error"}]}
    result = judge_workers(m)
    assert result.status is Status.FAIL
    assert "spawn non-persistent: RuntimeError" in result.message and result.remedy


def test_killed_worker_is_detected_not_hung_on() -> None:
    m = dataloader.worker_death(length=40, kill_at=13, timeout_s=1.0, deadline_s=30)
    assert m["detected"] and not m["hung"], m
    assert m["seconds"] < 15
    assert "DataLoader worker" in m["error"] or "Connection reset" in m["error"]
    assert m["leftover_pids"] == []
    assert procs.children(os.getpid()) == []
    assert judge_worker_death(m).status is Status.PASS


def test_worker_death_verdicts() -> None:
    hung = {"hung": True, "detected": False, "deadline_s": 30, "timeout_s": 1}
    assert judge_worker_death(hung).status is Status.FAIL
    silent = {"hung": False, "detected": False, "batches_before": 20, "deadline_s": 30,
              "timeout_s": 1}
    assert "silently" in judge_worker_death(silent).message


def test_scaling_returns_identical_data_for_every_worker_count() -> None:
    m = dataloader.scaling([0, 1, 2], length=12, rounds=20, width=256)
    digests = {p["digest"] for p in m["points"]}
    assert len(digests) == 1 and all(p["samples"] == 12 for p in m["points"])
    result = judge_scaling(m, 0.9, cpus=2)
    assert result.status is Status.PASS
    assert [p["workers"] for p in result.details["curve"]] == [0, 1, 2]
    # A worker count that changes the data is a FAIL, never a speed question.
    m["points"][2]["digest"] = "different"
    assert judge_scaling(m, 0.9, cpus=2).status is Status.FAIL


@pytest.mark.parametrize("cpus,cap,counts", [(2, 32, [0, 1, 2]), (6, 32, [0, 1, 2, 4, 6]),
                                             (224, 32, [0, 1, 2, 4, 8, 16, 32]),
                                             (1, 32, [0, 1])])
def test_scaling_worker_counts(cpus: int, cap: int, counts: list[int]) -> None:
    assert scaling_counts(cpus, cap) == counts


def test_shm_verdict_says_how_to_fix() -> None:
    need = {"ranks": 8, "batch_bytes": 19_267_584, "workers": 8, "prefetch": 2,
            "needed_bytes": 8 * 17 * 19_267_584}
    result = judge_shm(64 << 20, 64 << 20, need, 1.5)
    assert result.status is Status.FAIL
    assert "bus error" in result.message and "--shm-size" in (result.remedy or "")
    assert judge_shm(1 << 40, 1 << 40, need, 1.5).status is Status.PASS

