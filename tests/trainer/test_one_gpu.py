"""A host with one visible GPU (issue 44): one rank on it, and every job that needs two GPUs is
SKIP "needs 2 GPUs, this host has 1" without a launch (two ranks sharing the GPU over gloo would
pass and prove nothing about the node); a run whose every job skipped exits 77, which a caller
tells from a failure (1). The decision is trainer.placement.plan_ranks, the code the GPU path runs,
given made-up GPU counts here (torch.cuda's count replaced for the CLI); no rank is launched."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from trainer import launcher
from trainer import trainer_cli as cli
from trainer.config import TrainConfig
from trainer.jobs import ORDER
from trainer.placement import CPU_RANKS, RankPlan, plan_ranks
from trainer.report import FAIL, PASS, SKIP, JobReport

ONE_RANK = ["single", "throughput"]
TWO_GPU_REASON = "needs 2 GPUs, this host has 1"


def _one_gpu_skips(jobs: list[str]) -> dict[str, str]:
    return {j: "needs 4 GPUs, this host has 1" if j == "hybrid" else TWO_GPU_REASON
            for j in jobs if j not in ONE_RANK}


@pytest.mark.parametrize(("requested", "preference", "gpus", "share", "nnodes", "expected"), [
    (None, "auto", 1, False, 1, RankPlan(1, False, _one_gpu_skips(list(ORDER)))),
    (1, "auto", 1, False, 1, RankPlan(1, False, _one_gpu_skips(list(ORDER)))),   # --nproc 1
    (None, "cuda", 1, False, 1, RankPlan(1, False, _one_gpu_skips(list(ORDER)))),
    (None, "auto", 2, False, 1, RankPlan(2, False, {})),
    (None, "auto", 8, False, 1, RankPlan(8, False, {})),
    (None, "auto", 1, False, 2, RankPlan(1, False, {})),      # one GPU per node, NCCL across nodes
    (2, "auto", 1, True, 1, RankPlan(2, True, {})),           # --nproc 2 --share-gpu: on purpose
    (None, "auto", 0, False, 1, RankPlan(CPU_RANKS, False, {})),   # CPU host: the CPU stand-in
    (None, "cpu", 1, False, 1, RankPlan(CPU_RANKS, False, {})),    # --device cpu on a GPU host
])
def test_plan_ranks(requested: int | None, preference: str, gpus: int, share: bool, nnodes: int,
                    expected: RankPlan) -> None:
    assert plan_ranks(list(ORDER), requested, preference, gpus, share=share,
                      nnodes=nnodes) == expected


def test_two_ranks_on_one_gpu_without_share_is_still_a_usage_error() -> None:
    with pytest.raises(ValueError, match="--share-gpu"):
        plan_ranks(["ddp"], 2, "auto", 1)


def _visible_gpus(monkeypatch: pytest.MonkeyPatch, count: int) -> None:
    """torch.cuda as a host with `count` visible GPUs answers it (launcher.cuda_count asks)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(cli, "_unusable_gpus", lambda device: None)


def _no_launch(*args: object, **kwargs: object) -> None:
    raise AssertionError("no rank may be launched")


def test_cli_on_one_gpu_skips_the_two_gpu_jobs_and_exits_77(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _visible_gpus(monkeypatch, 1)
    monkeypatch.setattr(launcher, "run_jobs", _no_launch)
    out = tmp_path / "report.json"
    assert cli.main(["ddp", "fsdp", "tp", "ckpt", "dp", "--json", str(out)]) == cli.EXIT_SKIP == 77
    reports = json.loads(out.read_text())
    assert list(reports) == ["dp", "ddp", "fsdp", "tp", "ckpt"]
    for job, r in reports.items():
        assert (r["status"], r["message"]) == (SKIP, TWO_GPU_REASON), job
        assert r["details"]["cuda_devices"] == 1
    assert f"ckpt      SKIP  {TWO_GPU_REASON}" in capsys.readouterr().out


def test_cli_on_one_gpu_launches_one_rank_for_the_one_gpu_jobs(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _visible_gpus(monkeypatch, 1)
    calls: list[tuple[list[str], int | None, bool]] = []

    def run_jobs(jobs: list[str], cfg: TrainConfig, *, nproc: int | None = None,
                 share_gpu: bool = False, **kw: object) -> launcher.SuiteOutcome:
        calls.append((list(jobs), nproc, share_gpu))
        return launcher.SuiteOutcome({j: JobReport(j, PASS, "ok") for j in jobs}, nproc or 0, 0.1)

    monkeypatch.setattr(launcher, "run_jobs", run_jobs)
    out = tmp_path / "report.json"
    assert cli.main(["all", "--json", str(out)]) == cli.EXIT_PASS
    assert calls == [(ONE_RANK, 1, False)]
    reports = json.loads(out.read_text())
    assert list(reports) == list(ORDER)
    assert {j for j, r in reports.items() if r["status"] == PASS} == set(ONE_RANK)
    assert all(r["status"] == SKIP for j, r in reports.items() if j not in ONE_RANK)


@pytest.mark.parametrize("gpus", [2, 8])
def test_cli_with_two_or_more_gpus_launches_every_job_one_rank_per_gpu(
        monkeypatch: pytest.MonkeyPatch, gpus: int) -> None:
    _visible_gpus(monkeypatch, gpus)
    calls: list[tuple[list[str], int | None]] = []

    def run_jobs(jobs: list[str], cfg: TrainConfig, *, nproc: int | None = None,
                 **kw: object) -> launcher.SuiteOutcome:
        calls.append((list(jobs), nproc))
        return launcher.SuiteOutcome({j: JobReport(j, PASS, "ok") for j in jobs}, nproc or 0, 0.1)

    monkeypatch.setattr(launcher, "run_jobs", run_jobs)
    assert cli.main(["ddp", "fsdp", "single"]) == cli.EXIT_PASS
    assert calls == [(["single", "ddp", "fsdp"], gpus)]


def test_a_failed_job_is_told_from_all_skipped() -> None:
    skip, ok, bad = JobReport("ddp", SKIP, "x"), JobReport("single", PASS, "y"), JobReport("tp", FAIL, "z")
    assert cli.exit_status([skip, skip]) == cli.EXIT_SKIP
    assert cli.exit_status([skip, ok]) == cli.EXIT_PASS
    assert cli.exit_status([skip, bad]) == cli.EXIT_FAIL
    assert len({cli.EXIT_PASS, cli.EXIT_FAIL, cli.EXIT_USAGE, cli.EXIT_SKIP}) == 4


def test_run_jobs_on_one_gpu_skips_without_launching(monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    """trainer.launcher.run_jobs without nproc (the library entry) decides the same way."""
    monkeypatch.setattr(launcher, "cuda_count", lambda: 1)
    monkeypatch.setattr(launcher, "exclusive_process", lambda: False)
    launched: list[tuple[list[str], int]] = []

    def launch_all(order: list[str], cfg: TrainConfig, base: Path, reports: dict[str, JobReport],
                   launches: list[object], *, nproc: int, **kw: object) -> None:
        launched.append((list(order), nproc))
        reports.update({j: JobReport(j, PASS, "ok") for j in order})

    monkeypatch.setattr(launcher, "_launch_all", launch_all)
    suite = launcher.run_jobs(["throughput", "ddp", "hybrid"], TrainConfig(), workdir=tmp_path)
    assert launched == [(["throughput"], 1)]
    assert suite.nproc == 1
    assert {j: (r.status, r.message) for j, r in suite.reports.items()} == {
        "ddp": (SKIP, TWO_GPU_REASON), "hybrid": (SKIP, "needs 4 GPUs, this host has 1"),
        "throughput": (PASS, "ok")}
    assert list(suite.reports) == ["ddp", "hybrid", "throughput"]
    launched.clear()
    suite = launcher.run_jobs(["ddp"], TrainConfig(), workdir=tmp_path)
    assert launched == [] and suite.reports["ddp"].status == SKIP and not suite.launches
