"""The acceptance stage on one GPU (issue 44): what needs two ranks is SKIP with its reason,
never a pass. The stage plans its ranks through trainer.placement.plan_ranks, the decision the
trainer's CLI makes: one rank on the GPU, `train-single` and `train-throughput` run, every other
job SKIPs "needs N GPUs, this host has 1" (two ranks sharing the GPU over gloo passed DDP,
SyncBN and localize while proving nothing about the node)."""

from __future__ import annotations

import copy
from typing import Any

from checks import profiles
from checks.hw.fixture import FixtureBackend, load_scenario
from checks.node import node_cli as cli
from checks.node.context import Context, Options
from checks.node.suite import acceptance
from trainer.placement import one_gpu_reason, plan_ranks

ONE_GPU = "node-vm-h100-1gpu"  # a cloud VM with one H100 passed through (leptonai/gpud#1140)
ONE_GPU_JOBS = ["single", "throughput"]


def _ctx(scenario: dict[str, Any], **options: Any) -> Context:
    return Context(FixtureBackend(scenario), profiles.load("generic"), Options(**options))


def _scenario(**torch_spec: Any) -> dict[str, Any]:
    data = copy.deepcopy(load_scenario(ONE_GPU))
    data["torch"].update(torch_spec)
    return data


def test_one_gpu_runs_one_rank_and_skips_what_needs_two() -> None:
    ctx = _ctx(_scenario())
    p = acceptance.plan(ctx)
    assert (p.nproc, p.shared) == (1, False)
    assert p.jobs == ONE_GPU_JOBS
    skipped = [j for j in acceptance.JOBS if j not in ONE_GPU_JOBS]
    assert sorted(p.verdicts) == sorted(skipped)
    for job in skipped:
        result = acceptance._job_check(ctx, job)
        assert result.status == "SKIP" and result.message == one_gpu_reason(job), (job, result)
    assert acceptance._job_check(ctx, "ddp").message == "needs 2 GPUs, this host has 1"
    assert ctx not in acceptance._cache  # nothing launched


def test_the_stage_and_the_trainer_make_one_decision() -> None:
    ctx = _ctx(_scenario())
    p = acceptance.plan(ctx)
    trainer = plan_ranks(list(acceptance.JOBS), None, "auto", 1)
    assert p.nproc == trainer.nproc and p.shared == trainer.shared
    assert {j: r.message for j, r in p.verdicts.items()} == trainer.skips


def test_one_gpu_through_the_cli_names_the_reason_for_every_multi_gpu_job(tmp_path) -> None:
    out = tmp_path / "report.json"
    only = ",".join(f"train-{j}" for j in acceptance.JOBS)
    cli.main(["--simulate", ONE_GPU, "--level", "standard", "--only", only, "--json", str(out),
              "-q"])
    import json

    checks = {c["id"]: c for c in json.loads(out.read_text())["checks"]}
    for job in ("ddp", "syncbn", "localize", "fsdp", "ckpt"):
        (result,) = checks[f"train-{job}"]["results"]
        assert result["status"] == "SKIP" and result["message"] == "needs 2 GPUs, this host has 1", \
            (job, result)
    (hybrid,) = checks["train-hybrid"]["results"]
    assert hybrid["message"] == "needs 4 GPUs, this host has 1"
    for job in ONE_GPU_JOBS:  # they would run on the real GPU; simulated hardware says so
        (result,) = checks[f"train-{job}"]["results"]
        assert result["message"] == acceptance.SIMULATED


def test_expected_gpus_missing_still_fail_before_the_one_gpu_skips() -> None:
    p = acceptance.plan(_ctx(_scenario(), expect_gpus=2))
    assert p.verdicts["ddp"].status == "FAIL"
    assert p.verdicts["throughput"].status == "FAIL"  # it would measure 1 GPU, not 2
    assert p.verdicts["localize"].status == "SKIP"  # per GPU, but needs two ranks
    assert p.jobs == ["single"]


def test_cpu_host_keeps_its_four_gloo_ranks() -> None:
    p = acceptance.plan(_ctx(copy.deepcopy(load_scenario("cpu-only-healthy"))))
    assert (p.nproc, p.shared) == (4, False)
    assert "ddp" in p.jobs and "localize" in p.jobs
    assert p.verdicts["dp"].status == "SKIP" and "needs ≥ 2 CUDA devices" in p.verdicts["dp"].message
