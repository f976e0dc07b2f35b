"""The GPU paths for real: cuda matmul and copy bandwidth, P2P, NCCL collectives, pinned
DataLoader batches, burn-in with NVML samples. Skipped cleanly without a CUDA device."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from checks.hw.linux import LinuxBackend
from checks.hw.measure import burn, local
from checks.hw.measure import collective_run as collective
from checks.hw.measure import compute_run as compute
from checks.hw.measure import dataloader_run as dataloader
from checks.node.suite.collective import judge_collectives

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


def test_matmul_and_copy_bandwidth_on_every_gpu() -> None:
    rows = local.run(LinuxBackend(), "matmul", device="cuda", dtypes=["bf16", "fp32"], n=4096,
                     min_time_s=0.05)
    assert len(rows) == GPUS
    for row in rows:
        assert row["tflops"]["bf16"] > row["tflops"]["fp32"] > 0
        assert row["pci"] is None or row["pci"].count(":") == 2
    bw = local.run(LinuxBackend(), "membw", device="cuda", nbytes=1 << 28, min_time_s=0.05)
    assert all(r["copy_gbs"] > 50 for r in bw)


@pytest.mark.skipif(GPUS < 2, reason="needs two GPUs")
def test_p2p_matrix_covers_every_ordered_pair() -> None:
    m = compute.p2p(64 << 20, repeats=2, min_time_s=0.02)
    assert m["count"] == GPUS
    for i in range(GPUS):
        for j in range(GPUS):
            assert (m["bandwidth_gbs"][i][j] is None) == (i == j)


@pytest.mark.skipif(GPUS < 2, reason="needs two GPUs")
def test_nccl_collectives_exact_with_bus_bandwidth(tmp_path: Path) -> None:
    sweep = {"min_bytes": 8, "max_bytes": 64 << 20, "factor": 4, "warmup": 2, "iters": 5,
             "check_iters": 5, "check_elems": 1 << 20}
    m = collective.run(nproc=GPUS, sweep=sweep, backend="nccl", timeout_s=300, stall_s=60,
                       workdir=tmp_path / "work")
    assert m["ok"], m["summary"] + m["log_tail"]
    assert m["backend"] == "nccl" and m["errors"] == []
    result = judge_collectives(m, None, on_gpu=True)
    assert result.status.value == "PASS" and result.value > 1.0


def test_pinned_batches_reach_the_gpu() -> None:
    m = dataloader.scaling([0, 2], length=8, rounds=1, width=256, pin_memory=True)
    assert m["pin_memory"]["all_pinned"] and m["pin_memory"]["h2d_gbs"] > 0


def test_gpu_burn_is_bit_identical_across_devices_with_nvml_samples() -> None:
    m = local.run(LinuxBackend(), "burn_in", device="cuda", duration_s=3, n=2048, dtype="bf16",
                  sample_interval_s=0.5)
    digests = {d["digest_last"] for d in m["devices"]}
    assert len(digests) == 1 and all(d["mismatched_elements"] == 0 for d in m["devices"])
    assert m["samples"] and "sm_clock_mhz" in m["samples"][0]


def test_cpu_and_gpu_burn_share_the_comparison() -> None:
    m = burn.burn([torch.device("cuda", 0)], duration_s=0.5, n=512, dtype="fp16")
    assert m["devices"][0]["iterations"] > 1


SUPERVISOR = """
import os, pynvml
from checks.hw.linux import LinuxBackend
from checks.hw.measure import local
hw = LinuxBackend()
assert hw.torch().cuda_available
local.run(hw, "matmul", device="cuda", dtypes=["fp32"], n=512, min_time_s=0.01)
local.run(hw, "membw", device="cuda", nbytes=1 << 24, min_time_s=0.01)
pynvml.nvmlInit()
pids = {p.pid for i in range(pynvml.nvmlDeviceGetCount())
        for p in pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(i))}
print("SUPERVISOR-HOLDS-CONTEXT" if os.getpid() in pids else "SUPERVISOR-CLEAN")
"""


def test_supervising_process_holds_no_cuda_context_after_measuring() -> None:
    # What keeps EXCLUSIVE_PROCESS GPUs free for the ranks of the next check: reading torch's
    # view and measuring (in a child) leave this process without a context on any GPU.
    import os
    import subprocess
    import sys

    root = str(Path(__file__).resolve().parents[2])
    out = subprocess.run([sys.executable, "-c", SUPERVISOR], capture_output=True, text=True,
                         timeout=600, env={**os.environ, "PYTHONPATH": root})
    assert "SUPERVISOR-CLEAN" in out.stdout, out.stdout + out.stderr
