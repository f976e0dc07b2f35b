"""The trainer run directly on GPUs in compute mode EXCLUSIVE_PROCESS: one rank on a one-GPU
host (two would share its one context), --share-gpu refused in one line, DataParallel SKIPped
with the reason, the pipeline's single-process split left out; NVML read through a stand-in
pynvml module (the real one needs a driver)."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest

from trainer import gpumode
from trainer.placement import choose_nproc

DEFAULT, EXCLUSIVE = 0, 3  # NVML_COMPUTEMODE_DEFAULT / _EXCLUSIVE_PROCESS


def fake_pynvml(modes: list[int], uuids: list[str] | None = None,
                init_error: bool = False, migs: dict[str, int] | None = None) -> types.ModuleType:
    """`migs`: MIG instance UUID -> the index of the GPU holding it."""
    n = types.ModuleType("pynvml")
    uuids = uuids or [f"GPU-{i:08d}" for i in range(len(modes))]
    migs = migs or {}

    def by_uuid(uuid: bytes | str) -> Any:
        text = uuid.decode() if isinstance(uuid, bytes) else uuid
        return ("mig", migs[text]) if text in migs else uuids.index(text)

    def init() -> None:
        if init_error:
            raise RuntimeError("NVML Shared Library Not Found")

    n.nvmlInit = init  # type: ignore[attr-defined]
    n.nvmlShutdown = lambda: None  # type: ignore[attr-defined]
    n.nvmlDeviceGetCount = lambda: len(modes)  # type: ignore[attr-defined]
    n.nvmlDeviceGetHandleByIndex = lambda i: i  # type: ignore[attr-defined]
    n.nvmlDeviceGetHandleByUUID = by_uuid  # type: ignore[attr-defined]
    n.nvmlDeviceGetUUID = lambda h: uuids[h].encode()  # type: ignore[attr-defined]
    n.nvmlDeviceGetDeviceHandleFromMigDeviceHandle = lambda m: m[1]  # type: ignore[attr-defined]
    n.nvmlDeviceGetIndex = lambda h: h  # type: ignore[attr-defined]
    n.nvmlDeviceGetComputeMode = lambda h: modes[h]  # type: ignore[attr-defined]
    n.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS = EXCLUSIVE  # type: ignore[attr-defined]
    n.NVML_COMPUTEMODE_EXCLUSIVE_THREAD = 1  # type: ignore[attr-defined]
    return n


@pytest.mark.parametrize("modes,cvd,expected", [
    ([DEFAULT, DEFAULT], None, False),
    ([DEFAULT, EXCLUSIVE], None, True),
    ([DEFAULT, EXCLUSIVE], "0", False),          # the exclusive GPU is hidden from CUDA
    ([DEFAULT, EXCLUSIVE], "1", True),
    ([DEFAULT, EXCLUSIVE], "GPU-00000001", True),  # by UUID
    ([EXCLUSIVE], "-1", False),                    # CUDA sees nothing
])
def test_exclusive_process_reads_the_gpus_cuda_sees(monkeypatch: pytest.MonkeyPatch,
                                                    modes: list[int], cvd: str | None,
                                                    expected: bool) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(modes))
    if cvd is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", cvd)
    assert gpumode.exclusive_process() is expected


@pytest.mark.parametrize("cvd,expected", [
    ("GPU-aa11", True),               # a UUID prefix, as CUDA takes it: GPU 1
    ("GPU-bb22-0000", False),         # GPU 0 by its whole UUID
    ("MIG-5c7e0000-0001", True),      # a MIG instance of GPU 1 (EXCLUSIVE)
    ("MIG-5c7e0000-0000", False),     # a MIG instance of GPU 0
])
def test_exclusive_process_maps_uuids_to_their_gpus(monkeypatch: pytest.MonkeyPatch, cvd: str,
                                                    expected: bool) -> None:
    """UUIDs in CUDA_VISIBLE_DEVICES name GPUs by NVML's UUID: a prefix (which
    nvmlDeviceGetHandleByUUID rejects) or a MIG instance made the planning give up (False)
    on an EXCLUSIVE_PROCESS GPU."""
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(
        [DEFAULT, EXCLUSIVE], uuids=["GPU-bb22-0000", "GPU-aa11-0001"],
        migs={"MIG-5c7e0000-0000": 0, "MIG-5c7e0000-0001": 1}))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", cvd)
    assert gpumode.exclusive_process() is expected


def test_no_nvml_is_not_exclusive(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([EXCLUSIVE], init_error=True))
    assert gpumode.exclusive_process() is False


def test_one_exclusive_gpu_gets_one_rank_and_sharing_is_refused() -> None:
    assert choose_nproc(None, "auto", 1) == (2, True)  # default mode: two ranks share it
    assert choose_nproc(None, "auto", 1, exclusive=True) == (1, False)
    assert choose_nproc(None, "auto", 8, exclusive=True) == (8, False)
    with pytest.raises(ValueError, match="cannot share a GPU in compute mode EXCLUSIVE_PROCESS"):
        choose_nproc(2, "auto", 1, share=True, exclusive=True)


def test_dataparallel_skips_on_exclusive_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainer.config import TrainConfig
    from trainer.jobs import dp

    monkeypatch.setattr(dp, "cuda_devices", lambda: 8)
    monkeypatch.setattr(dp, "exclusive_process", lambda: True)
    env: Any = types.SimpleNamespace(rank=0, world_size=8)
    report = dp.run(env, TrainConfig(device="cuda"))
    assert report is not None and report.status == "SKIP"
    assert "EXCLUSIVE_PROCESS" in report.message and "rank 0 replicates" in report.message
    env.rank = 3
    assert dp.run(env, TrainConfig(device="cuda")) is None
