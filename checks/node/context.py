"""What a check receives: the hardware backend, the profile, the options and earlier outcomes."""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass, field
from typing import Any

from checks.hw.base import Backend, GpuHandle, GpuLost, HardwareError, PciDevice
from checks.hw.visible import parse_visible
from checks.model import CheckOutcome, Device
from checks.profiles import Profile


@dataclass
class Options:
    level: str = "standard"
    expect_gpus: int | None = None
    expect_gpu_ids: tuple[str, ...] | None = None  # PCI vendor:device of the GPUs ("10de:2330")
    expect_driver: str | None = None  # branch ("550") or full version ("550.90.07")
    expect_cuda: str | None = None  # minimum CUDA version the driver must support ("12.4")
    expect_nvlink: int | None = None  # NVLink links that must be up per GPU (overrides inference)
    duration_s: float = 600.0  # burn-in duration
    nproc: int | None = None  # ranks for collective/acceptance stages (default: GPUs, or 2 on CPU)
    workdir: str | None = None  # scratch space for multi-process checks
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CudaVisible:
    """What CUDA_VISIBLE_DEVICES lets CUDA (and so torch) use on this host.

    CUDA reads the list up to the first entry it cannot resolve and ignores the rest; Slurm sets
    `NoDevFiles` for a job without GPUs, and an empty value or `-1` hides every GPU. MIG UUIDs
    select MIG instances, of which one process enumerates only the first."""

    raw: str | None
    indices: tuple[int, ...] | None  # NVML indices selected; None when the variable is unset
    mig: tuple[str, ...] = ()

    @property
    def hides_all(self) -> bool:
        return self.raw is not None and not self.indices and not self.mig

    def count(self, nvml_count: int) -> int:
        """GPUs torch should enumerate."""
        if self.indices is None:
            return nvml_count
        return len(self.indices) + (1 if self.mig else 0)

    def note(self) -> str:
        return "" if self.raw is None else f" (CUDA_VISIBLE_DEVICES={self.raw!r})"


@dataclass
class Gpu:
    """One NVML-visible GPU with its identity read once."""

    handle: GpuHandle
    device: Device
    # NVML answered GPU_IS_LOST for this index: every query raises GpuLost, and `device.pci`
    # is the sysfs address no answering GPU claimed.
    lost: bool = False


class LostGpuHandle(GpuHandle):
    """Stands for an index whose handle NVML refused with GPU_IS_LOST."""

    def __init__(self, index: int, reason: str) -> None:
        self.index = index
        self.reason = reason

    def query(self, field_name: str) -> Any:
        raise GpuLost(self.reason)


class Context:
    def __init__(self, hw: Backend, profile: Profile, options: Options) -> None:
        self.hw = hw
        self.profile = profile
        self.options = options
        self.outcomes: dict[str, CheckOutcome] = {}
        # Ids of the checks selected for this run (set by the CLI), so a check that serves
        # several (one launch for all acceptance jobs) does only the selected work.
        self.selected: set[str] = set()
        self._lock = threading.Lock()

    # Reads shared by several checks are done once per run.
    @functools.cached_property
    def pci(self) -> list[PciDevice]:
        return self.hw.pci_devices()

    @property
    def pci_gpus(self) -> list[PciDevice]:
        return [d for d in self.pci if d.is_nvidia_gpu]

    @property
    def nvswitches(self) -> list[PciDevice]:
        return [d for d in self.pci if d.is_nvswitch]

    @functools.cached_property
    def gpus(self) -> list[Gpu]:
        """NVML-visible GPUs. Raises NvmlUnavailable (checks needing it depend on driver-loaded)."""
        nvml = self.hw.nvml()
        gpus: list[Gpu] = []
        for index in range(nvml.device_count()):
            try:
                handle = nvml.gpu(index)
            except GpuLost as exc:
                gpus.append(Gpu(LostGpuHandle(index, str(exc)), Device(index=index), lost=True))
                continue
            gpus.append(Gpu(handle, Device(index=index, pci=_try(handle, "pci_bus_id"),
                                            uuid=_try(handle, "uuid"), name=_try(handle, "name"),
                                            serial=_try(handle, "serial"))))
        self._place_lost(gpus)
        return gpus

    def _place_lost(self, gpus: list[Gpu]) -> None:
        """Give each lost GPU the PCI address of a bus GPU that no answering GPU claimed.

        NVML numbers GPUs in PCI bus order, so the unclaimed addresses, in order, belong to the
        lost indices, in order."""
        lost = [g for g in gpus if g.lost]
        if not lost:
            return
        try:
            bus = [d.address for d in self.pci_gpus]
        except HardwareError:
            return
        claimed = {g.device.pci for g in gpus if not g.lost}
        unclaimed = [a for a in bus if a not in claimed]
        for gpu, address in zip(lost, unclaimed, strict=False):
            gpu.device = Device(index=gpu.device.index, pci=address)

    def cuda_visible(self) -> CudaVisible:
        raw = self.hw.environ().get("CUDA_VISIBLE_DEVICES")
        if raw is None:
            return CudaVisible(None, None)
        try:
            gpus = self.gpus
        except HardwareError:
            gpus = []
        visible = parse_visible(raw, [g.device.uuid for g in gpus])
        return CudaVisible(raw, visible.indices, visible.mig)

    def usable_gpu_count(self) -> int:
        """GPUs this process may train on: given to it (NVML in a container lists only those)
        and not hidden by CUDA_VISIBLE_DEVICES. Without a driver: the GPUs on the bus."""
        try:
            answering = [g for g in self.gpus if not g.lost]
        except HardwareError:
            return len(self.pci_gpus)
        return self.cuda_visible().count(len(answering))

    def pci_device(self, address: str | None) -> PciDevice | None:
        return next((d for d in self.pci if d.address == address), None)


def _try(handle: GpuHandle, field_name: str) -> Any:
    try:
        return handle.query(field_name)
    except HardwareError:
        return None
