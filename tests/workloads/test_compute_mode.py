"""Compute modes: EXCLUSIVE_PROCESS causes no false FAIL (one process per GPU, the supervisor
holds no CUDA context); PROHIBITED GPUs are left alone and SKIPped with the reason."""

from __future__ import annotations

from typing import Any

import pytest

from checks.hw.fixture import FixtureBackend
from checks.hw.measure import local

WORKLOAD = ["nccl-allreduce", "p2p-bandwidth", "gpu-matmul", "gpu-membw", "dataloader-scaling",
            "burn-in"]


def by_id(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["id"]: c for c in report["checks"]}


def test_exclusive_process_gpus_pass_every_workload_check(run_cli: Any) -> None:
    code, report = run_cli("--simulate", "workload-compute-exclusive", "--level", "burn-in")
    checks = by_id(report)
    assert {i: checks[i]["status"] for i in WORKLOAD} == dict.fromkeys(WORKLOAD, "PASS")
    assert checks["nccl-allreduce"]["results"][0]["details"]["world_size"] == 8
    assert code == 0


def test_exclusive_process_skips_a_launch_that_would_share_a_gpu(run_cli: Any) -> None:
    _, report = run_cli("--simulate", "workload-compute-exclusive", "--only", "nccl-allreduce",
                        "--nproc", "16")
    (result,) = by_id(report)["nccl-allreduce"]["results"]
    assert result["status"] == "SKIP"
    assert "needs 2 processes on one GPU" in result["message"]
    assert "EXCLUSIVE_PROCESS" in result["message"]


def test_more_ranks_than_gpus_skips_in_default_mode_too(run_cli: Any) -> None:
    _, report = run_cli("--simulate", "h100-sxm-8x-healthy", "--only", "nccl-allreduce",
                        "--nproc", "12")
    (result,) = by_id(report)["nccl-allreduce"]["results"]
    assert result["status"] == "SKIP" and "NCCL needs a GPU of its own" in result["message"]


def test_prohibited_gpu_is_skipped_with_the_reason_and_the_others_measured(run_cli: Any
                                                                          ) -> None:
    code, report = run_cli("--simulate", "workload-compute-prohibited", "--level", "burn-in")
    checks = by_id(report)
    # The node fails, and only for the reason that is true: compute-mode names the GPU.
    assert code == 1
    assert {c["id"] for c in report["checks"] if c["status"] in ("FAIL", "ERROR")} == {"compute-mode"}
    (bad,) = [r for r in checks["compute-mode"]["results"] if r["status"] == "FAIL"]
    assert bad["device"]["pci"] == "0000:3a:00.0"
    for check_id in ("gpu-matmul", "gpu-membw", "burn-in"):
        rows = checks[check_id]["results"]
        assert [r["status"] for r in rows] == ["PASS", "PASS", "SKIP"] + ["PASS"] * 5, check_id
        assert "compute mode PROHIBITED on GPU2 (0000:3a:00.0)" in rows[2]["message"]
    for check_id in ("nccl-allreduce", "p2p-bandwidth"):  # every GPU together: cannot run
        (result,) = checks[check_id]["results"]
        assert result["status"] == "SKIP" and "PROHIBITED" in result["message"]
    scaling = checks["dataloader-scaling"]["results"][0]
    assert scaling["status"] == "PASS" and "pin_memory not tried" in scaling["message"]


def test_prohibited_gpu_is_never_handed_to_the_measurement() -> None:
    seen: list[tuple[str, dict[str, Any]]] = []

    class Spy(FixtureBackend):
        def workload(self, name: str, **params: Any) -> Any:
            seen.append((name, params))
            return super().workload(name, **params)

    from checks import profiles
    from checks.node.context import Context, Options
    from checks.node.suite.compute import gpu_matmul

    ctx = Context(Spy.from_file("workload-compute-prohibited"), profiles.load("h100-sxm"),
                  Options())
    rows = list(gpu_matmul(ctx))
    assert seen == [("matmul", {**seen[0][1], "exclude_pci": ["0000:3a:00.0"]})]
    assert [r.device.index for r in rows if r.status.value == "PASS"] == [0, 1, 3, 4, 5, 6, 7]


@pytest.mark.parametrize("name,params,child", [
    ("matmul", {"device": "cuda"}, True),
    ("matmul", {"device": "cpu"}, False),
    ("membw", {"device": "cuda"}, True),
    ("burn_in", {"device": "cuda", "duration_s": 60}, True),
    ("burn_in", {"device": "cpu"}, False),
    ("p2p", {"nbytes": 1}, True),
    ("dataloader_scaling", {"pin_memory": True}, True),   # pinning creates a CUDA context
    ("dataloader_scaling", {"pin_memory": False}, False),
    ("collectives", {}, False),                            # torchrun ranks, one per GPU
    ("dataloader_workers", {}, False),
])
def test_every_cuda_measurement_runs_outside_the_supervisor(name: str, params: dict[str, Any],
                                                            child: bool) -> None:
    assert local.needs_child(name, params) is child
    if name == "burn_in" and child:
        assert local.child_timeout(name, params) == 60 + local.BURN_IN_MARGIN_S


def test_local_run_routes_gpu_work_to_the_child(monkeypatch: pytest.MonkeyPatch) -> None:
    from checks.hw.linux import LinuxBackend
    from checks.hw.measure import isolate

    calls: list[tuple[str, dict[str, Any], float]] = []
    monkeypatch.setattr(isolate, "run_child", lambda name, params, timeout_s: calls.append(
        (name, dict(params), timeout_s)) or ["from the child"])
    out = local.run(LinuxBackend(), "membw", device="cuda", nbytes=1 << 20)
    assert out == ["from the child"]
    assert calls == [("membw", {"device": "cuda", "nbytes": 1 << 20}, 870.0)]


def test_cpu_host_figures_are_information_under_skip_and_reach_the_fleet(
        run_cli: Any, tmp_path: Any) -> None:
    from checks.report import figures

    scenario = tmp_path / "cpu.yaml"
    scenario.write_text("extends: cpu-only-healthy\nmeasurements:\n"
                        "  matmul: {cpu: {fp32: 0.0612}}\n  membw: {cpu: {copy_gbs: 9.4}}\n")
    code, report = run_cli("--simulate", str(scenario), "--only", "gpu-matmul,gpu-membw")
    assert code == 0
    checks = by_id(report)
    (matmul,) = checks["gpu-matmul"]["results"]
    (membw,) = checks["gpu-membw"]["results"]
    assert matmul["status"] == membw["status"] == "SKIP"
    assert "measured the CPU instead: matmul 384^3 fp32 61.2 GFLOP/s" in matmul["message"]
    assert matmul["details"]["measured_on"] == "cpu"
    found = {(f.check, f.name): f.value for f in figures.extract("cpu-node", report)
             if isinstance(f, figures.Figure)}
    assert found == {("gpu-matmul", "cpu_matmul_fp32_gflops"): 61.2,
                     ("gpu-membw", "cpu_membw_copy_gbs"): 9.4}


def test_exclusive_process_skips_jobs_that_open_a_second_context(run_cli: Any) -> None:
    """DataParallel in rank 0 and the pipeline's cuda:1 check need a second CUDA context on a GPU
    another rank holds: SKIP with the reason under EXCLUSIVE_PROCESS, not a crash."""
    _, report = run_cli("--simulate", "workload-compute-exclusive", "--only", "train-dp",
                        "--only", "train-pipeline", "--only", "train-ddp")
    checks = by_id(report)
    for job in ("train-dp", "train-pipeline"):
        (result,) = checks[job]["results"]
        assert result["status"] == "SKIP" and "EXCLUSIVE_PROCESS" in result["message"], result
    (ddp,) = checks["train-ddp"]["results"]
    assert "EXCLUSIVE_PROCESS" not in ddp["message"]   # one rank per GPU: nothing to skip


def test_one_exclusive_gpu_runs_one_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    """A one-GPU host runs one rank, in any compute mode (EXCLUSIVE_PROCESS would refuse a
    second one); the jobs that need two GPUs SKIP (issue 44: two ranks sharing the GPU proved
    nothing), as in the default mode."""
    from types import SimpleNamespace

    from checks.node import workload_plan
    from checks.node.suite import acceptance

    monkeypatch.setattr(workload_plan, "platform", lambda ctx: SimpleNamespace(kind="cuda", devices=1))
    monkeypatch.setattr(workload_plan, "exclusive_gpus", lambda ctx: "GPU0 (0000:01:00.0)")
    ctx = SimpleNamespace(selected=None, options=SimpleNamespace(expect_gpus=None, nproc=None))
    p = acceptance.plan(ctx)
    assert (p.nproc, p.shared) == (1, False)
    assert p.jobs == ["single", "throughput"]
    assert p.verdicts["ddp"].message == "needs 2 GPUs, this host has 1"
    monkeypatch.setattr(workload_plan, "exclusive_gpus", lambda ctx: None)   # default mode
    default = acceptance.plan(ctx)
    assert (default.nproc, default.shared, default.jobs) == (1, False, ["single", "throughput"])
