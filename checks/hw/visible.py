"""Which GPUs a process may use: CUDA_VISIBLE_DEVICES resolved against NVML.

One place for the rule, used by the checks' planning (checks/node/workload_plan.py), the
launches that count GPUs, and the trainer's compute-mode planning (trainer/gpumode.py), which
reads NVML through its own bindings and hands the UUIDs in.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from checks.hw.base import HardwareError, Nvml


@dataclass(frozen=True)
class Visible:
    """CUDA_VISIBLE_DEVICES resolved against NVML (parse_visible)."""

    indices: tuple[int, ...] | None  # whole GPUs by NVML index, in CUDA's order; None: unset
    mig: tuple[str, ...] = ()  # MIG instance UUIDs listed (one process enumerates the first)
    mig_parent: int | None = None  # NVML index of the GPU holding the first MIG instance


def parse_visible(raw: str | None, uuids: Sequence[str | None],
                  mig_parent: Callable[[str], int | None] | None = None) -> Visible:
    """Which NVML GPUs CUDA_VISIBLE_DEVICES=`raw` gives a process, given each NVML index's UUID.

    Entries are NVML indices (digits) or UUIDs (GPU-..., matched as a prefix of the UUID NVML
    reports, MIG-... naming a MIG instance); CUDA reads the list up to the first entry it cannot
    resolve and ignores the rest, so an empty value, -1 or Slurm's NoDevFiles select nothing.
    `mig_parent` maps a MIG instance's UUID to its GPU's NVML index where NVML can say."""
    if raw is None:
        return Visible(None)
    picked: list[int] = []
    mig: list[str] = []
    for token in (t.strip() for t in raw.split(",")):
        if token.startswith("MIG-"):
            mig.append(token)
        elif token.startswith("GPU-"):
            match = [i for i, u in enumerate(uuids) if u and u.startswith(token)]
            if not match:
                break
            picked.append(match[0])
        elif token.isdigit() and int(token) < len(uuids):
            picked.append(int(token))
        else:
            break  # CUDA ignores everything from the first invalid entry on
    parent = mig_parent(mig[0]) if mig and mig_parent is not None else None
    return Visible(tuple(picked), tuple(mig), parent)


def launch_indices(visible: Visible, answering: Sequence[int]) -> tuple[int, ...]:
    """NVML indices a launch may put one rank each on: every answering GPU when the variable is
    unset, else the selected whole GPUs, then the GPU of the first MIG instance (a process
    enumerates only one MIG instance; it counts once even where its parent is unknown: -1)."""
    if visible.indices is None:
        return tuple(answering)
    out = [i for i in visible.indices if i in answering]
    if visible.mig:
        parent = visible.mig_parent if visible.mig_parent is not None else -1
        if parent not in out:
            out.append(parent)
    return tuple(out)


def launch_gpus(nvml: Nvml, cuda_visible_devices: str | None) -> tuple[int, ...]:
    """The NVML indices of the GPUs a launch on this host may use, one rank per GPU, in CUDA's
    device order (its len() is the rank count): all GPUs whose handle NVML gives when
    CUDA_VISIBLE_DEVICES is unset; the listed ones (indices, GPU- UUIDs) when it is set; () when
    it hides every GPU ("", -1, NoDevFiles). A MIG instance counts as one GPU, reported as its
    parent's index (-1 when NVML cannot name the parent). Raises HardwareError when NVML cannot
    count its GPUs."""
    uuids: list[str | None] = []
    answering: list[int] = []
    for index in range(nvml.device_count()):
        try:
            handle = nvml.gpu(index)
        except HardwareError:
            uuids.append(None)
            continue
        answering.append(index)
        try:
            uuids.append(str(handle.query("uuid")))
        except HardwareError:
            uuids.append(None)
    return launch_indices(parse_visible(cuda_visible_devices, uuids, nvml.mig_parent), answering)
