"""The compute mode of the GPUs this process's CUDA sees, from NVML (nvidia-ml-py).

A GPU in compute mode EXCLUSIVE_PROCESS admits one process's context (`nvidia-smi -c
EXCLUSIVE_PROCESS`; NVML's nvmlDeviceGetComputeMode): two ranks sharing it, DataParallel
replicating from rank 0 onto GPUs other ranks hold, and the pipeline job's single-process
cuda:0/cuda:1 split all fail there for the mode, not the hardware. The trainer plans around it
as the checks do (checks/node/workload_plan.py).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from checks.hw.visible import launch_indices, parse_visible


def _visible(n: Any) -> list[Any]:
    """Handles of the GPUs CUDA_VISIBLE_DEVICES names (all when it is unset), resolved by the
    checks' rule (checks/hw/visible.py): NVML indices, GPU- UUIDs (a prefix, as CUDA takes it),
    a MIG- UUID as the GPU that holds the instance."""
    handles = [n.nvmlDeviceGetHandleByIndex(i) for i in range(int(n.nvmlDeviceGetCount()))]
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    if cvd is None:
        return handles
    uuids = [_text(n.nvmlDeviceGetUUID(h)) for h in handles]
    visible = parse_visible(cvd, uuids, lambda mig: _mig_parent(n, mig))
    return [handles[i] for i in launch_indices(visible, range(len(handles)))
            if 0 <= i < len(handles)]


def _mig_parent(n: Any, mig_uuid: str) -> int | None:
    """The NVML index of the GPU holding a MIG instance: its MIG handle by UUID, the parent
    handle, the parent's index (NVML API reference, MIG management); None when NVML refuses."""
    try:
        mig = n.nvmlDeviceGetHandleByUUID(mig_uuid.encode())
        return int(n.nvmlDeviceGetIndex(n.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)))
    except Exception:  # an old driver or binding, a stale UUID: the parent is unknown
        return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def exclusive_process() -> bool:
    """True when a GPU CUDA sees is in compute mode EXCLUSIVE_PROCESS. False when none is, and
    when NVML cannot tell (no library, no GPU): the launch then goes on as before and a refused
    context is said by the job that hits it."""
    try:
        import pynvml as n

        n.nvmlInit()
    except Exception:  # no NVML library or driver: nothing to plan around
        return False
    try:
        modes = {int(n.nvmlDeviceGetComputeMode(h)) for h in _visible(n)}
    except Exception:  # an NVML error on one GPU: unknown, not exclusive
        return False
    finally:
        with contextlib.suppress(Exception):
            n.nvmlShutdown()
    exclusive = {getattr(n, "NVML_COMPUTEMODE_EXCLUSIVE_PROCESS", 3),
                 getattr(n, "NVML_COMPUTEMODE_EXCLUSIVE_THREAD", 1)}
    return bool(modes & exclusive)


REASON = "in compute mode EXCLUSIVE_PROCESS (one process per GPU)"
