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

# CUDA_VISIBLE_DEVICES tokens name NVML indices (digits) or UUIDs (GPU-..., MIG-...).


def _visible(n: Any) -> list[Any]:
    """Handles of the GPUs CUDA_VISIBLE_DEVICES names (all when it is unset)."""
    count = int(n.nvmlDeviceGetCount())
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    if cvd is None:
        return [n.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    handles = []
    for token in filter(None, (t.strip() for t in cvd.split(","))):
        if token.isdigit() and int(token) < count:
            handles.append(n.nvmlDeviceGetHandleByIndex(int(token)))
        elif token.startswith("GPU-"):
            handles.append(n.nvmlDeviceGetHandleByUUID(token))
        else:
            break  # CUDA stops at the first entry it cannot use (a MIG slice is its own device)
    return handles


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
