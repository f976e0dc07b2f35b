"""`python -m checks --level standard` on this machine, through main(argv): the workload
checks run for real (gloo ranks, CPU compute, real DataLoader workers) and pass."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # importlib mode: tests/ for hostdisk
from hostdisk import Window

pytestmark = pytest.mark.slow

REAL_ON_CPU = ["nccl-allreduce", "dataloader-workers", "dataloader-shm", "dataloader-scaling",
               "dataloader-worker-death"]
# Named after the GPU: measured on the CPU here, but never a PASS without a GPU.
GPU_NAMED = ["gpu-matmul", "gpu-membw", "p2p-bandwidth"]


def test_standard_level_passes_here_with_the_workload_checks_run(run_cli: Any) -> None:
    with Window() as disk:
        code, report = run_cli("--level", "standard")
    checks = {c["id"]: c for c in report["checks"]}
    statuses = {i: checks[i]["status"] for i in REAL_ON_CPU}
    assert statuses == dict.fromkeys(REAL_ON_CPU, "PASS"), {
        i: checks[i]["results"][0]["message"] for i in REAL_ON_CPU}
    assert {i: checks[i]["status"] for i in GPU_NAMED} == dict.fromkeys(GPU_NAMED, "SKIP")
    # disk-space judges this host's shared disk: what it must say is read apart (tests/hostdisk.py).
    assert checks["disk-space"]["status"] in disk.allowed(), checks["disk-space"]["results"]
    assert [(c["id"], c["status"]) for c in report["checks"] if c["id"] != "disk-space"
            and c["status"] in ("FAIL", "ERROR")] == []
    assert code == (1 if checks["disk-space"]["status"] == "FAIL" else 0)
    (col,) = checks["nccl-allreduce"]["results"]
    assert col["details"]["backend"] == "gloo" and col["details"]["world_size"] == 2
    assert col["details"]["curve"][-1]["bytes"] == 4 << 20
    runs = checks["dataloader-workers"]["results"][0]["details"]["runs"]
    assert {(r["start_method"], r["persistent_workers"]) for r in runs} == {
        (m, p) for m in ("fork", "forkserver", "spawn") for p in (True, False)}
    matmul = checks["gpu-matmul"]["results"][0]
    assert matmul["details"]["figures"]["cpu_matmul_fp32_gflops"] > 0
    assert matmul["message"].startswith("no GPU on this host; measured the CPU instead")
    membw = checks["gpu-membw"]["results"][0]
    assert membw["details"]["figures"]["cpu_membw_copy_gbs"] > 0
