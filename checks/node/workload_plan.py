"""What the workload checks run on (GPUs or the CPU) and with which settings from the profile."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from checks.hw.base import HardwareError
from checks.hw.visible import launch_gpus as launch_gpus  # re-exported: a launch's GPUs
from checks.hw.visible import launch_indices, parse_visible

if TYPE_CHECKING:
    from checks.node.context import Context, Gpu

BLOCKED = ("blocked: NVIDIA GPUs are on the PCI bus but torch cannot use them (see driver-loaded, "
           "cuda-compat and gpu-count)")


def visible_gpus(ctx: Context) -> list[Gpu]:
    """The NVML GPUs this host's launches use (launch_gpus over the context's reads): what
    compute-mode planning, the occupancy gate and rank-to-GPU mapping must look at, not every
    GPU NVML lists. [] when NVML cannot list GPUs."""
    try:
        gpus = ctx.gpus
    except HardwareError:
        return []
    raw = ctx.hw.environ().get("CUDA_VISIBLE_DEVICES")
    answering = [int(g.device.index) for g in gpus if not g.lost and g.device.index is not None]
    try:
        parent: Callable[[str], int | None] | None = ctx.hw.nvml().mig_parent
    except HardwareError:
        parent = None
    visible = parse_visible(raw, [g.device.uuid for g in gpus], parent)
    by_index = {g.device.index: g for g in gpus}
    return [by_index[i] for i in launch_indices(visible, answering) if i in by_index]


@dataclass(frozen=True)
class Platform:
    kind: str  # "cuda" | "cpu" | "blocked"
    devices: int  # CUDA devices torch sees (0 on the CPU)

    @property
    def cuda(self) -> bool:
        return self.kind == "cuda"


def platform(ctx: Context) -> Platform:
    """GPUs when torch can use them; the CPU on a host with no NVIDIA device; otherwise
    blocked (a GPU host whose CUDA stack is broken must not pass on the CPU path)."""
    if not ctx.pci_gpus:
        return Platform("cpu", 0)
    info = ctx.hw.torch()
    if info.error or not info.cuda_available or info.device_count == 0:
        return Platform("blocked", 0)
    return Platform("cuda", info.device_count)


def setting(ctx: Context, dotted: str, plat: Platform, default: Any = None) -> Any:
    """`dotted` from the profile, preferring its `_gpu` / `_cpu` variant for this platform."""
    variant = ctx.profile.get(f"{dotted}_{'gpu' if plat.cuda else 'cpu'}")
    return variant if variant is not None else ctx.profile.get(dotted, default)


def find_row(rows: list[dict[str, Any]], gpu: Gpu) -> dict[str, Any] | None:
    """The measurement row of one NVML GPU: matched by PCI address, else by index. None when
    torch did not measure it (hidden by CUDA_VISIBLE_DEVICES, or lost)."""
    pci = (gpu.device.pci or "").lower()
    for row in rows:
        if pci and row.get("pci") and str(row["pci"]).lower() == pci:
            return row
    if not any(row.get("pci") for row in rows):
        for row in rows:
            if row.get("index") == gpu.device.index:
                return row
    return None


NOT_MEASURED = ("torch did not measure this GPU (hidden by CUDA_VISIBLE_DEVICES, or lost: see "
                "gpu-count)")


def nvlinks_up(gpu: Gpu) -> int:
    return len(active_links(gpu))


def fabric_clique(gpu: Gpu) -> str | None:
    """"cluster-uuid/clique-id" of a GPU whose NVLink fabric registration completed with
    success (nvmlDeviceGetGpuFabricInfo), else None: GPUs of one clique share an NVLink domain."""
    try:
        info = gpu.handle.query("fabric_info") or {}
    except HardwareError:
        return None
    if not isinstance(info, dict) or info.get("state") != "completed" \
            or info.get("status") != "success" or info.get("clique_id") is None:
        return None
    return f"{info.get('cluster_uuid')}/{info.get('clique_id')}"


def active_links(gpu: Gpu) -> list[dict[str, Any]]:
    try:
        links = gpu.handle.query("nvlink") or []
    except HardwareError:
        return []
    return [link for link in links if isinstance(link, dict) and link.get("active")]


def nvswitch_system(ctx: Context, gpus: list[Gpu]) -> bool:
    """Whether the GPUs' NVLinks run through NVSwitches: switches on the PCI bus (HGX A100/H100
    8-GPU); a link whose far end NVML types as a switch; every GPU in one completed fabric
    clique; or the model's profile says so (HGX B200/B300 and GB200 keep their switches off the
    host's PCI bus) and no link's far end is a GPU. A link to a GPU is a direct board or bridge
    (HGX H100 4-GPU, NV6 to each peer: NVIDIA/nccl#1617; H100 NVL bridges), whatever the model's
    8-GPU baseboard has."""
    if ctx.nvswitches:
        return True
    links = [link for g in gpus for link in active_links(g)]
    if any(link.get("remote_type") == "switch" for link in links):
        return True
    cliques = {fabric_clique(g) for g in gpus}
    if len(gpus) > 1 and len(cliques) == 1 and None not in cliques:
        return True
    direct = any(link.get("remote_type") == "gpu" or link.get("remote_pci") for link in links)
    return bool(ctx.profile.get("nvswitch")) and not direct


def query_int(gpu: Gpu, field: str) -> int | None:
    try:
        value = gpu.handle.query(field)
    except HardwareError:
        return None
    return int(value) if value is not None else None


# nvmlDeviceGetComputeMode: "default" lets any number of processes use a GPU;
# "exclusive_process" one process (with any number of threads); "prohibited" none.
EXCLUSIVE, PROHIBITED = "exclusive_process", "prohibited"


def compute_mode(gpu: Gpu) -> str | None:
    """The GPU's compute mode, None when NVML cannot say (not supported, lost)."""
    try:
        value = gpu.handle.query("compute_mode")
    except HardwareError:
        return None
    return str(value).lower() if value is not None else None


def _names(gpus: list[Gpu]) -> str:
    return ", ".join(f"GPU{g.device.index}" + (f" ({g.device.pci})" if g.device.pci else "")
                     for g in gpus)


def prohibited(ctx: Context) -> dict[str, str]:
    """PCI address -> SKIP reason for every GPU whose compute mode is PROHIBITED."""
    gpus = visible_gpus(ctx)
    return {str(g.device.pci).lower(): prohibited_reason([g]) for g in gpus
            if g.device.pci and compute_mode(g) == PROHIBITED}


def prohibited_reason(gpus: list[Gpu]) -> str:
    return (f"compute mode PROHIBITED on {_names(gpus)}: no process may create a CUDA context "
            f"there, so nothing can be measured (the compute-mode check FAILs it)")


def compute_mode_gate(ctx: Context, *, processes_per_gpu: int) -> str | None:
    """Why a check that uses every GPU together (P2P, collectives) cannot run under the GPUs'
    compute modes, or None. The checks' own processes never share a GPU unless
    processes_per_gpu > 1: the supervising process creates no CUDA context (measurements run
    in a child, collectives under torchrun). Only the GPUs CUDA_VISIBLE_DEVICES gives the
    launch count (visible_gpus): a PROHIBITED GPU it hides blocks nothing."""
    gpus = visible_gpus(ctx)
    banned = [g for g in gpus if compute_mode(g) == PROHIBITED]
    if banned:
        return prohibited_reason(banned)
    if processes_per_gpu > 1:
        exclusive = [g for g in gpus if compute_mode(g) == EXCLUSIVE]
        if exclusive:
            return (f"needs {processes_per_gpu} processes on one GPU, but {_names(exclusive)} "
                    f"is in compute mode EXCLUSIVE_PROCESS (one process per GPU): running it "
                    f"would fail for the mode, not the hardware")
    return None


def exclusive_gpus(ctx: Context) -> str | None:
    """The GPUs the launches use (visible_gpus) in compute mode EXCLUSIVE_PROCESS, named, or
    None when there are none."""
    exclusive = [g for g in visible_gpus(ctx) if compute_mode(g) == EXCLUSIVE]
    return _names(exclusive) if exclusive else None
