"""A stand-in for libnvidia-ml.so.1 behind the real pynvml, for tests on machines without a GPU.

pynvml resolves every C call through one lookup: `_nvmlGetFunctionPointer(name)` does
`getattr(pynvml.nvmlLib, name)` (and caches it), and `nvmlInit` loads the library only while
`pynvml.nvmlLib` is None. `install()` puts a `FakeNvmlLibrary` there: its attributes are ctypes
callbacks with the C signatures, so pynvml builds its real structs, passes real pointers, and the
callbacks fill them. Everything above the C boundary (pynvml's wrappers, error classes, struct
layouts, and checks/hw/nvml.py) runs for real.

The values of `FakeGpu` are test inputs describing what a driver would answer, not a record of
a machine. A symbol the library lacks (`missing`) answers FUNCTION_NOT_FOUND the way pynvml
reports it for an old driver; an error in `errors` makes that call return the given code.

The node suite runs its checks in a forked worker (checks/node/watchdog.py), so the calls and the
fake's own faults are kept in an unlinked append-only file both processes share, not in a list
only one of them would see.
"""

from __future__ import annotations

import ctypes
import json
import os
import tempfile
import threading
from collections.abc import Callable
from ctypes import c_int, c_uint, c_ulonglong, c_void_p
from dataclasses import dataclass, field
from typing import Any

import pynvml as n

HANG = "hang"  # an `errors` value: the call blocks until the test ends (a hung GPU)
HANDLE_BASE = 0x4E560000  # handles are HANDLE_BASE + index: never a valid pointer, never NULL
MIG_HANDLE_BASE = 0x4D490000  # a MIG instance's handle: MIG_HANDLE_BASE + its GPU's index

_ZERO_ECC = {(t, c): 0 for t in (n.NVML_MEMORY_ERROR_TYPE_CORRECTED,
                                 n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)
             for c in (n.NVML_VOLATILE_ECC, n.NVML_AGGREGATE_ECC)}


@dataclass
class FakeFabric:
    state: int = n.NVML_GPU_FABRIC_STATE_COMPLETED
    status: int = n.NVML_SUCCESS
    cluster_uuid: bytes = bytes(range(16))
    clique_id: int = 1


@dataclass
class FakeGpu:
    """What one GPU answers. Codes and enums are pynvml's constants."""

    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    bus_id: str = "00000000:18:00.0"  # as NVML prints it
    pci_device_id: int = 0x233010DE
    serial: str = "0000000000000"
    memory_total: int = 85520809984
    compute_capability: tuple[int, int] = (9, 0)
    persistence: int = n.NVML_FEATURE_ENABLED
    ecc_mode: tuple[int, int] = (n.NVML_FEATURE_ENABLED, n.NVML_FEATURE_ENABLED)
    # (error type, counter type) -> count, for nvmlDeviceGetTotalEccErrors
    ecc_total: dict[tuple[int, int], int] = field(default_factory=lambda: dict(_ZERO_ECC))
    # location -> {(error type, counter type) -> count}; a location or key absent: NOT_SUPPORTED
    ecc_locations: dict[int, dict[tuple[int, int], int]] = field(default_factory=lambda: {
        n.NVML_MEMORY_LOCATION_SRAM: dict(_ZERO_ECC), n.NVML_MEMORY_LOCATION_DRAM: dict(_ZERO_ECC)})
    # cause -> page addresses; None: NOT_SUPPORTED (Ampere and later remap rows instead)
    retired_pages: dict[int, list[int]] | None = None
    # pages retired just before each successive nvmlDeviceGetRetiredPages call (a race)
    retired_growth: list[int] = field(default_factory=list)
    retired_pending: int = n.NVML_FEATURE_DISABLED
    remapped_rows: tuple[int, int, int, int] = (0, 0, 0, 0)  # corr, unc, pending, failed
    pcie: tuple[int, int, int, int] = (5, 5, 16, 16)  # gen cur, gen max, width cur, width max
    pcie_replay: int = 0
    clock_reasons: int = 0
    temperature: int = 35
    temperature_slowdown: int = 87
    temperature_shutdown: int = 92
    power_mw: int = 70_000
    power_limit_mw: int = 700_000
    power_default_limit_mw: int = 700_000
    # state per link (True: active); the device has len(nvlinks) links; None: no NVLink at all
    nvlinks: list[bool] | None = field(default_factory=lambda: [True] * 18)
    nvlink_errors: dict[tuple[int, int], int] = field(default_factory=dict)  # (link, counter)
    nvlink_counters_supported: bool = True
    # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION's value (NVML_GPU_RECOVERY_ACTION_*); None: the
    # field answers NOT_SUPPORTED (a driver before the field)
    recovery_action: int | None = None
    # the fields it replaced: NVML_FI_DEV_RESET_STATUS / NVML_FI_DEV_DRAIN_AND_RESET_STATUS
    # (non-zero: needed); None: NOT_SUPPORTED
    reset_status: int | None = None
    drain_and_reset_status: int | None = None
    # far end of every link: an NVML_NVLINK_DEVICE_TYPE_* and a bus id; None: NOT_SUPPORTED
    nvlink_remote_type: int | None = None
    nvlink_remote_bus: str | None = None
    # nvmlDeviceGetP2PStatus(this, other, NVML_P2P_CAPS_INDEX_NVLINK): the indices of the GPUs
    # answered NVML_P2P_STATUS_OK (others get NVML_P2P_STATUS_NOT_SUPPORTED); None: the call
    # answers NOT_SUPPORTED for every pair
    nvlink_p2p: tuple[int, ...] | None = None
    mig: tuple[int, int] = (0, 0)
    # UUIDs of this GPU's MIG instances: nvmlDeviceGetHandleByUUID answers a MIG handle for one
    mig_instances: tuple[str, ...] = ()
    sm_clock: int = 1980
    sm_clock_max: int = 1980
    utilization: int = 0
    compute_mode: int = n.NVML_COMPUTEMODE_DEFAULT
    minor_number: int = 0
    fabric: FakeFabric | None = None  # None: NOT_SUPPORTED
    lost: bool = False  # nvmlDeviceGetHandleByIndex answers GPU_IS_LOST
    memory_used: int = 1 << 20  # allocated by processes: nvmlDeviceGetMemoryInfo_v2 .used
    # reserved by the driver: v2 .reserved; v1's .used is memory_used + memory_reserved
    memory_reserved: int = 0
    memory_v2: bool = True  # False: a driver without nvmlDeviceGetMemoryInfo_v2
    # (pid, used GPU memory bytes) per compute process; names: FakeNvmlLibrary.process_names
    processes: list[tuple[int, int]] = field(default_factory=list)
    vbios: str = "96.00.89.00.01"
    inforom_image: str = "G520.0200.00.05"
    # "nvmlDeviceGetNvLinkState" (every call) or "nvmlDeviceGetNvLinkState:3" (first argument
    # after the handle is 3) -> an NVML return code, or HANG
    errors: dict[str, int | str] = field(default_factory=dict)


def _put(address: int, ctype: Any, value: Any) -> None:
    ctype.from_address(address).value = value


def _put_text(address: int, size: int, text: str) -> int:
    data = text.encode() + b"\0"
    if len(data) > size:
        return n.NVML_ERROR_INSUFFICIENT_SIZE
    ctypes.memmove(address, data, len(data))
    return n.NVML_SUCCESS


# name -> (restype, argtypes, implementation, takes a device handle first)
_FUNCTIONS: dict[str, tuple[Any, tuple[Any, ...], Callable[..., int], bool]] = {}


def _c(name: str, *argtypes: Any, device: bool = False, restype: Any = c_int
       ) -> Callable[[Callable[..., int]], Callable[..., int]]:
    """Declare the C signature of one NVML function implemented by the decorated method."""
    def register(method: Callable[..., int]) -> Callable[..., int]:
        _FUNCTIONS[name] = (restype, ((c_void_p,) if device else ()) + argtypes, method, device)
        return method
    return register


P, U = c_void_p, c_uint  # pointer arguments arrive as addresses (int, or None for NULL)


class FakeNvmlLibrary:
    """The library object pynvml keeps in `nvmlLib`. Records calls and its own faults."""

    def __init__(self, gpus: list[FakeGpu], driver: str = "580.65.06", cuda: int = 13000,
                 init_error: int | None = None, missing: tuple[str, ...] = (),
                 system_errors: dict[str, int | str] | None = None,
                 process_names: dict[int, str] | None = None) -> None:
        self.gpus = gpus
        # pid -> name for nvmlSystemGetProcessName; a pid not listed answers NOT_FOUND (what a
        # PID of another PID namespace gets)
        self.process_names = process_names or {}
        self.driver = driver
        self.cuda = cuda
        self.init_error = init_error
        self.missing = set(missing)
        self.system_errors = system_errors or {}
        # One O_APPEND write per entry: whole lines from the worker and this process alike.
        self._journal = tempfile.TemporaryFile(mode="a+b", buffering=0)  # noqa: SIM115 - lives with the fake
        self.release = threading.Event()  # set at teardown: hung calls return
        self._callbacks: dict[str, Any] = {}
        self._strings: dict[int, Any] = {}

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name in self.missing:
            raise AttributeError(name)
        if name not in _FUNCTIONS:
            self._note("problem", f"pynvml looked up {name}, which the fake does not implement")
            raise AttributeError(name)
        if name not in self._callbacks:
            restype, argtypes, method, device = _FUNCTIONS[name]
            self._callbacks[name] = ctypes.CFUNCTYPE(restype, *argtypes)(
                self._wrap(name, method, device))
        return self._callbacks[name]

    def _note(self, kind: str, *entry: Any) -> None:
        os.write(self._journal.fileno(), json.dumps([kind, *entry], default=repr).encode() + b"\n")

    def _entries(self, kind: str) -> list[list[Any]]:
        fd = self._journal.fileno()
        text = os.pread(fd, os.fstat(fd).st_size, 0).decode()
        return [e[1:] for e in map(json.loads, text.splitlines()) if e[0] == kind]

    @property
    def calls(self) -> list[tuple[str, tuple[Any, ...]]]:
        """Every C call pynvml made, in this process and in the checks' worker, in order."""
        return [(name, tuple(args)) for name, args in self._entries("call")]

    @property
    def problems(self) -> list[str]:
        """Faults of the fake itself or lookups it cannot answer."""
        return [text for (text,) in self._entries("problem")]

    def calls_to(self, name: str) -> list[tuple[Any, ...]]:
        return [args for called, args in self.calls if called == name]

    def _wrap(self, name: str, method: Callable[..., int], device: bool) -> Callable[..., int]:
        def callback(*args: Any) -> int:
            try:
                self._note("call", name, args)
                if device:
                    gpu = self._gpu(args[0])
                    if gpu is None:
                        return n.NVML_ERROR_INVALID_ARGUMENT
                    rest = args[1:]
                    code = gpu.errors.get(f"{name}:{rest[0]}" if rest else name,
                                          gpu.errors.get(name))
                    if code is not None:
                        return self._fail(code)
                    return method(self, gpu, *rest)
                code = self.system_errors.get(name)
                if code is not None:
                    return self._fail(code)
                return method(self, *args)
            except Exception as exc:  # ctypes would print it and return 0 (success): record it
                self._note("problem", f"{name}{args}: {type(exc).__name__}: {exc}")
                return n.NVML_ERROR_UNKNOWN
        return callback

    def _fail(self, code: int | str) -> int:
        if code == HANG:
            self.release.wait(60)
            return n.NVML_ERROR_TIMEOUT
        return int(code)

    def _gpu(self, handle: int | None) -> FakeGpu | None:
        index = (handle or 0) - HANDLE_BASE
        return self.gpus[index] if 0 <= index < len(self.gpus) else None

    # --- library and system ------------------------------------------------------------------

    @_c("nvmlInitWithFlags", U)
    def _init_with_flags(self, flags: int) -> int:
        return self.init_error if self.init_error is not None else n.NVML_SUCCESS

    @_c("nvmlInit_v2")
    def _init_v2(self) -> int:
        return self.init_error if self.init_error is not None else n.NVML_SUCCESS

    @_c("nvmlShutdown")
    def _shutdown(self) -> int:
        return n.NVML_SUCCESS

    @_c("nvmlErrorString", c_int, restype=c_void_p)
    def _error_string(self, code: int) -> int:
        # pynvml sets restype = c_char_p on this pointer; hand back a buffer that stays alive.
        if code not in self._strings:
            self._strings[code] = ctypes.create_string_buffer(f"fake NVML error {code}".encode())
        return ctypes.addressof(self._strings[code])

    @_c("nvmlSystemGetDriverVersion", P, U)
    def _driver_version(self, buf: int, size: int) -> int:
        return _put_text(buf, size, self.driver)

    @_c("nvmlSystemGetCudaDriverVersion", P)
    def _cuda_version(self, out: int) -> int:
        _put(out, c_int, self.cuda)
        return n.NVML_SUCCESS

    @_c("nvmlSystemGetCudaDriverVersion_v2", P)
    def _cuda_version_v2(self, out: int) -> int:
        return self._cuda_version(out)

    @_c("nvmlDeviceGetCount_v2", P)
    def _count(self, out: int) -> int:
        _put(out, c_uint, len(self.gpus))
        return n.NVML_SUCCESS

    @_c("nvmlDeviceGetHandleByIndex_v2", U, P)
    def _handle(self, index: int, out: int) -> int:
        if index >= len(self.gpus):
            return n.NVML_ERROR_INVALID_ARGUMENT
        gpu = self.gpus[index]
        code = gpu.errors.get("nvmlDeviceGetHandleByIndex_v2")
        if gpu.lost:
            return n.NVML_ERROR_GPU_IS_LOST
        if code is not None:
            return self._fail(code)
        _put(out, c_void_p, HANDLE_BASE + index)
        return n.NVML_SUCCESS

    # --- MIG instances by UUID (a MIG handle is MIG_HANDLE_BASE + the parent's index) ---------

    @_c("nvmlDeviceGetHandleByUUID", c_void_p, P)
    def _handle_by_uuid(self, uuid: int, out: int) -> int:
        text = ctypes.string_at(uuid).decode()
        for index, gpu in enumerate(self.gpus):
            if text == gpu.uuid:
                _put(out, c_void_p, HANDLE_BASE + index)
                return n.NVML_SUCCESS
            if text in gpu.mig_instances:
                _put(out, c_void_p, MIG_HANDLE_BASE + index)
                return n.NVML_SUCCESS
        return n.NVML_ERROR_NOT_FOUND

    @_c("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", c_void_p, P)
    def _mig_parent(self, mig: int | None, out: int) -> int:
        index = (mig or 0) - MIG_HANDLE_BASE
        if not 0 <= index < len(self.gpus):
            return n.NVML_ERROR_INVALID_ARGUMENT
        _put(out, c_void_p, HANDLE_BASE + index)
        return n.NVML_SUCCESS

    @_c("nvmlDeviceGetIndex", P, device=True)
    def _index(self, gpu: FakeGpu, out: int) -> int:
        _put(out, c_uint, self.gpus.index(gpu))
        return n.NVML_SUCCESS

    # --- identity ----------------------------------------------------------------------------

    @_c("nvmlDeviceGetName", P, U, device=True)
    def _name(self, gpu: FakeGpu, buf: int, size: int) -> int:
        return _put_text(buf, size, gpu.name)

    @_c("nvmlDeviceGetUUID", P, U, device=True)
    def _uuid(self, gpu: FakeGpu, buf: int, size: int) -> int:
        return _put_text(buf, size, gpu.uuid)

    @_c("nvmlDeviceGetSerial", P, U, device=True)
    def _serial(self, gpu: FakeGpu, buf: int, size: int) -> int:
        return _put_text(buf, size, gpu.serial)

    @_c("nvmlDeviceGetPciInfo_v3", P, device=True)
    def _pci_info(self, gpu: FakeGpu, out: int) -> int:
        info = n.nvmlPciInfo_t.from_address(out)
        domain, bus, rest = gpu.bus_id.split(":")
        dev = rest.split(".")[0]
        info.domain, info.bus, info.device = int(domain, 16), int(bus, 16), int(dev, 16)
        info.pciDeviceId = gpu.pci_device_id
        info.pciSubSystemId = 0x16C110DE
        info.busId = gpu.bus_id.encode()
        info.busIdLegacy = f"{int(domain, 16):04X}:{bus}:{rest}".encode()
        return n.NVML_SUCCESS

    @_c("nvmlDeviceGetMinorNumber", P, device=True)
    def _minor(self, gpu: FakeGpu, out: int) -> int:
        _put(out, c_uint, gpu.minor_number)
        return n.NVML_SUCCESS

    @_c("nvmlDeviceGetCudaComputeCapability", P, P, device=True)
    def _cc(self, gpu: FakeGpu, major: int, minor: int) -> int:
        _put(major, c_int, gpu.compute_capability[0])
        _put(minor, c_int, gpu.compute_capability[1])
        return n.NVML_SUCCESS

    @_c("nvmlDeviceGetMemoryInfo", P, device=True)
    def _memory(self, gpu: FakeGpu, out: int) -> int:
        mem = n.c_nvmlMemory_t.from_address(out)
        mem.total, mem.used = gpu.memory_total, gpu.memory_used + gpu.memory_reserved
        mem.free = gpu.memory_total - mem.used
        return n.NVML_SUCCESS

    @_c("nvmlDeviceGetMemoryInfo_v2", P, device=True)
    def _memory_v2(self, gpu: FakeGpu, out: int) -> int:
        if not gpu.memory_v2:
            return n.NVML_ERROR_FUNCTION_NOT_FOUND
        mem = n.c_nvmlMemory_v2_t.from_address(out)
        if mem.version != n.nvmlMemory_v2:
            return n.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        mem.total, mem.reserved, mem.used = (gpu.memory_total, gpu.memory_reserved,
                                             gpu.memory_used)
        mem.free = gpu.memory_total - gpu.memory_reserved - gpu.memory_used
        return n.NVML_SUCCESS

    # --- occupancy and firmware ---------------------------------------------------------------

    def _processes(self, gpu: FakeGpu, count: int, infos: int | None) -> int:
        """Both calls of pynvml's two-step read: the count first (NULL array), then the array."""
        have = c_uint.from_address(count)
        if not gpu.processes:
            have.value = 0
            return n.NVML_SUCCESS
        if infos is None or have.value < len(gpu.processes):
            have.value = len(gpu.processes)
            return n.NVML_ERROR_INSUFFICIENT_SIZE
        array = (n.c_nvmlProcessInfo_v2_t * len(gpu.processes)).from_address(infos)
        for slot, (pid, used) in zip(array, gpu.processes, strict=True):
            slot.pid, slot.usedGpuMemory = pid, used
            slot.gpuInstanceId = slot.computeInstanceId = 0xFFFFFFFF
        have.value = len(gpu.processes)
        return n.NVML_SUCCESS

    @_c("nvmlDeviceGetComputeRunningProcesses_v3", P, P, device=True)
    def _processes_v3(self, gpu: FakeGpu, count: int, infos: int | None) -> int:
        return self._processes(gpu, count, infos)

    @_c("nvmlDeviceGetComputeRunningProcesses_v2", P, P, device=True)
    def _processes_v2(self, gpu: FakeGpu, count: int, infos: int | None) -> int:
        return self._processes(gpu, count, infos)

    @_c("nvmlSystemGetProcessName", U, P, U)
    def _process_name(self, pid: int, buf: int, size: int) -> int:
        if pid not in self.process_names:
            return n.NVML_ERROR_NOT_FOUND
        return _put_text(buf, size, self.process_names[pid])

    @_c("nvmlDeviceGetVbiosVersion", P, U, device=True)
    def _vbios(self, gpu: FakeGpu, buf: int, size: int) -> int:
        return _put_text(buf, size, gpu.vbios)

    @_c("nvmlDeviceGetInforomImageVersion", P, U, device=True)
    def _inforom_image(self, gpu: FakeGpu, buf: int, size: int) -> int:
        return _put_text(buf, size, gpu.inforom_image)

    # --- modes -------------------------------------------------------------------------------

    @_c("nvmlDeviceGetPersistenceMode", P, device=True)
    def _persistence(self, gpu: FakeGpu, out: int) -> int:
        _put(out, c_uint, gpu.persistence)
        return n.NVML_SUCCESS

    @_c("nvmlDeviceGetEccMode", P, P, device=True)
    def _ecc_mode(self, gpu: FakeGpu, current: int, pending: int) -> int:
        _put(current, c_uint, gpu.ecc_mode[0])
        _put(pending, c_uint, gpu.ecc_mode[1])
        return n.NVML_SUCCESS

    @_c("nvmlDeviceGetMigMode", P, P, device=True)
    def _mig(self, gpu: FakeGpu, current: int, pending: int) -> int:
        _put(current, c_uint, gpu.mig[0])
        _put(pending, c_uint, gpu.mig[1])
        return n.NVML_SUCCESS

    @_c("nvmlDeviceGetComputeMode", P, device=True)
    def _compute_mode(self, gpu: FakeGpu, out: int) -> int:
        _put(out, c_uint, gpu.compute_mode)
        return n.NVML_SUCCESS

    # --- memory errors -----------------------------------------------------------------------

    @_c("nvmlDeviceGetTotalEccErrors", U, U, P, device=True)
    def _ecc_total(self, gpu: FakeGpu, kind: int, counter: int, out: int) -> int:
        if (kind, counter) not in gpu.ecc_total:
            return n.NVML_ERROR_NOT_SUPPORTED
        _put(out, c_ulonglong, gpu.ecc_total[kind, counter])
        return n.NVML_SUCCESS

    @_c("nvmlDeviceGetMemoryErrorCounter", U, U, U, P, device=True)
    def _ecc_location(self, gpu: FakeGpu, kind: int, counter: int, location: int, out: int) -> int:
        counts = gpu.ecc_locations.get(location, {})
        if (kind, counter) not in counts:
            return n.NVML_ERROR_NOT_SUPPORTED
        _put(out, c_ulonglong, counts[kind, counter])
        return n.NVML_SUCCESS

    @_c("nvmlDeviceGetRetiredPages", U, P, P, device=True)
    def _retired(self, gpu: FakeGpu, cause: int, count: int, addresses: int | None) -> int:
        # NVML: pageCount in = room in the buffer (0 to ask the size); out = pages that match.
        # INSUFFICIENT_SIZE when they do not fit (NVML API reference, nvmlDeviceGetRetiredPages).
        if gpu.retired_pages is None:
            return n.NVML_ERROR_NOT_SUPPORTED
        pages = gpu.retired_pages.setdefault(cause, [])
        if gpu.retired_growth:
            grow = gpu.retired_growth.pop(0)
            pages.extend(range(len(pages) * 4096, (len(pages) + grow) * 4096, 4096))
        room = c_uint.from_address(count).value
        _put(count, c_uint, len(pages))
        if len(pages) > room or (pages and not addresses):
            return n.NVML_ERROR_INSUFFICIENT_SIZE
        for i, page in enumerate(pages):
            c_ulonglong.from_address(addresses + 8 * i).value = page  # type: ignore[operator]
        return n.NVML_SUCCESS

    @_c("nvmlDeviceGetRetiredPagesPendingStatus", P, device=True)
    def _retired_pending(self, gpu: FakeGpu, out: int) -> int:
        if gpu.retired_pages is None:
            return n.NVML_ERROR_NOT_SUPPORTED
        _put(out, c_uint, gpu.retired_pending)
        return n.NVML_SUCCESS

    @_c("nvmlDeviceGetRemappedRows", P, P, P, P, device=True)
    def _remapped(self, gpu: FakeGpu, corr: int, unc: int, pending: int, failed: int) -> int:
        for address, value in zip((corr, unc, pending, failed), gpu.remapped_rows, strict=True):
            _put(address, c_uint, value)
        return n.NVML_SUCCESS

    # --- PCIe, clocks, thermals, power -------------------------------------------------------

    @_c("nvmlDeviceGetCurrPcieLinkGeneration", P, device=True)
    def _gen_cur(self, gpu: FakeGpu, out: int) -> int:
        _put(out, c_uint, gpu.pcie[0])
        return n.NVML_SUCCESS

    @_c("nvmlDeviceGetMaxPcieLinkGeneration", P, device=True)
    def _gen_max(self, gpu: FakeGpu, out: int) -> int:
        _put(out, c_uint, gpu.pcie[1])
        return n.NVML_SUCCESS

    @_c("nvmlDeviceGetCurrPcieLinkWidth", P, device=True)
    def _width_cur(self, gpu: FakeGpu, out: int) -> int:
        _put(out, c_uint, gpu.pcie[2])
        return n.NVML_SUCCESS

    @_c("nvmlDeviceGetMaxPcieLinkWidth", P, device=True)
    def _width_max(self, gpu: FakeGpu, out: int) -> int:
        _put(out, c_uint, gpu.pcie[3])
        return n.NVML_SUCCESS

    @_c("nvmlDeviceGetPcieReplayCounter", P, device=True)
    def _replay(self, gpu: FakeGpu, out: int) -> int:
        _put(out, c_uint, gpu.pcie_replay)
        return n.NVML_SUCCESS

    @_c("nvmlDeviceGetCurrentClocksEventReasons", P, device=True)
    def _event_reasons(self, gpu: FakeGpu, out: int) -> int:
        _put(out, c_ulonglong, gpu.clock_reasons)
        return n.NVML_SUCCESS

    @_c("nvmlDeviceGetCurrentClocksThrottleReasons", P, device=True)
    def _throttle_reasons(self, gpu: FakeGpu, out: int) -> int:
        return self._event_reasons(gpu, out)

    @_c("nvmlDeviceGetClockInfo", U, P, device=True)
    def _clock(self, gpu: FakeGpu, kind: int, out: int) -> int:
        if kind != n.NVML_CLOCK_SM:
            return n.NVML_ERROR_NOT_SUPPORTED
        _put(out, c_uint, gpu.sm_clock)
        return n.NVML_SUCCESS

    @_c("nvmlDeviceGetMaxClockInfo", U, P, device=True)
    def _clock_max(self, gpu: FakeGpu, kind: int, out: int) -> int:
        if kind != n.NVML_CLOCK_SM:
            return n.NVML_ERROR_NOT_SUPPORTED
        _put(out, c_uint, gpu.sm_clock_max)
        return n.NVML_SUCCESS

    @_c("nvmlDeviceGetUtilizationRates", P, device=True)
    def _utilization(self, gpu: FakeGpu, out: int) -> int:
        util = n.c_nvmlUtilization_t.from_address(out)
        util.gpu, util.memory = gpu.utilization, 0
        return n.NVML_SUCCESS

    @_c("nvmlDeviceGetTemperature", U, P, device=True)
    def _temperature(self, gpu: FakeGpu, sensor: int, out: int) -> int:
        if sensor != n.NVML_TEMPERATURE_GPU:
            return n.NVML_ERROR_INVALID_ARGUMENT
        _put(out, c_uint, gpu.temperature)
        return n.NVML_SUCCESS

    @_c("nvmlDeviceGetTemperatureV", P, device=True)
    def _temperature_v(self, gpu: FakeGpu, out: int) -> int:
        info = n.c_nvmlTemperature_v1_t.from_address(out)
        if info.version != n.nvmlTemperature_v1:
            return n.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        if info.sensorType != n.NVML_TEMPERATURE_GPU:
            return n.NVML_ERROR_INVALID_ARGUMENT
        info.temperature = gpu.temperature
        return n.NVML_SUCCESS

    @_c("nvmlDeviceGetTemperatureThreshold", U, P, device=True)
    def _temperature_threshold(self, gpu: FakeGpu, kind: int, out: int) -> int:
        values = {n.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: gpu.temperature_slowdown,
                  n.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: gpu.temperature_shutdown}
        if kind not in values:
            return n.NVML_ERROR_NOT_SUPPORTED
        _put(out, c_uint, values[kind])
        return n.NVML_SUCCESS

    @_c("nvmlDeviceGetPowerUsage", P, device=True)
    def _power(self, gpu: FakeGpu, out: int) -> int:
        _put(out, c_uint, gpu.power_mw)
        return n.NVML_SUCCESS

    @_c("nvmlDeviceGetEnforcedPowerLimit", P, device=True)
    def _power_limit(self, gpu: FakeGpu, out: int) -> int:
        _put(out, c_uint, gpu.power_limit_mw)
        return n.NVML_SUCCESS

    @_c("nvmlDeviceGetPowerManagementDefaultLimit", P, device=True)
    def _power_default(self, gpu: FakeGpu, out: int) -> int:
        _put(out, c_uint, gpu.power_default_limit_mw)
        return n.NVML_SUCCESS

    # --- NVLink and fabric -------------------------------------------------------------------

    @_c("nvmlDeviceGetNvLinkState", U, P, device=True)
    def _nvlink_state(self, gpu: FakeGpu, link: int, out: int) -> int:
        # nvml.h: INVALID_ARGUMENT "if device or link is invalid", NOT_SUPPORTED "if the device
        # doesn't support this feature".
        if gpu.nvlinks is None:
            return n.NVML_ERROR_NOT_SUPPORTED
        if link >= len(gpu.nvlinks):
            return n.NVML_ERROR_INVALID_ARGUMENT
        _put(out, c_uint, n.NVML_FEATURE_ENABLED if gpu.nvlinks[link] else n.NVML_FEATURE_DISABLED)
        return n.NVML_SUCCESS

    @_c("nvmlDeviceGetFieldValues", ctypes.c_int32, P, device=True)
    def _field_values(self, gpu: FakeGpu, count: int, out: int) -> int:
        # Each field carries its own return code; the call itself succeeds.
        values = (n.c_nvmlFieldValue_t * count).from_address(out)
        for value in values:
            answer = {n.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: gpu.recovery_action,
                      n.NVML_FI_DEV_RESET_STATUS: gpu.reset_status,
                      n.NVML_FI_DEV_DRAIN_AND_RESET_STATUS: gpu.drain_and_reset_status,
                      }.get(value.fieldId)
            if answer is not None:
                value.nvmlReturn = n.NVML_SUCCESS
                value.valueType = n.NVML_VALUE_TYPE_UNSIGNED_INT
                value.value.uiVal = answer
            else:
                value.nvmlReturn = n.NVML_ERROR_NOT_SUPPORTED
        return n.NVML_SUCCESS

    @_c("nvmlDeviceGetNvLinkRemoteDeviceType", U, P, device=True)
    def _nvlink_remote_type(self, gpu: FakeGpu, link: int, out: int) -> int:
        if gpu.nvlinks is None or gpu.nvlink_remote_type is None:
            return n.NVML_ERROR_NOT_SUPPORTED
        if link >= len(gpu.nvlinks):
            return n.NVML_ERROR_INVALID_ARGUMENT
        _put(out, c_uint, gpu.nvlink_remote_type)
        return n.NVML_SUCCESS

    @_c("nvmlDeviceGetNvLinkRemotePciInfo_v2", U, P, device=True)
    def _nvlink_remote_pci(self, gpu: FakeGpu, link: int, out: int) -> int:
        if gpu.nvlinks is None or gpu.nvlink_remote_bus is None:
            return n.NVML_ERROR_NOT_SUPPORTED
        if link >= len(gpu.nvlinks):
            return n.NVML_ERROR_INVALID_ARGUMENT
        info = n.nvmlPciInfo_t.from_address(out)
        info.busId = gpu.nvlink_remote_bus.encode()
        return n.NVML_SUCCESS

    @_c("nvmlDeviceGetP2PStatus", P, U, P, device=True)
    def _p2p_status(self, gpu: FakeGpu, other: int, index: int, out: int) -> int:
        peer = self._gpu(other)
        if peer is None:
            return n.NVML_ERROR_INVALID_ARGUMENT
        if index != n.NVML_P2P_CAPS_INDEX_NVLINK:
            self._note("problem", f"nvmlDeviceGetP2PStatus asked for caps index {index}")
            return n.NVML_ERROR_NOT_SUPPORTED
        if gpu.nvlink_p2p is None:
            return n.NVML_ERROR_NOT_SUPPORTED
        ok = self.gpus.index(peer) in gpu.nvlink_p2p
        _put(out, c_uint, n.NVML_P2P_STATUS_OK if ok else n.NVML_P2P_STATUS_NOT_SUPPORTED)
        return n.NVML_SUCCESS

    @_c("nvmlDeviceGetNvLinkErrorCounter", U, U, P, device=True)
    def _nvlink_counter(self, gpu: FakeGpu, link: int, counter: int, out: int) -> int:
        if gpu.nvlinks is None or not gpu.nvlink_counters_supported:
            return n.NVML_ERROR_NOT_SUPPORTED
        if link >= len(gpu.nvlinks):
            return n.NVML_ERROR_INVALID_ARGUMENT
        _put(out, c_ulonglong, gpu.nvlink_errors.get((link, counter), 0))
        return n.NVML_SUCCESS

    @_c("nvmlDeviceGetGpuFabricInfo", P, device=True)
    def _fabric(self, gpu: FakeGpu, out: int) -> int:
        if gpu.fabric is None:
            return n.NVML_ERROR_NOT_SUPPORTED
        self._fill_fabric(n.c_nvmlGpuFabricInfo_t.from_address(out), gpu.fabric)
        return n.NVML_SUCCESS

    @_c("nvmlDeviceGetGpuFabricInfoV", P, device=True)
    def _fabric_v(self, gpu: FakeGpu, out: int) -> int:
        if gpu.fabric is None:
            return n.NVML_ERROR_NOT_SUPPORTED
        structs = {n.nvmlGpuFabricInfo_v2: n.c_nvmlGpuFabricInfo_v2_t,
                   n.nvmlGpuFabricInfo_v3: n.c_nvmlGpuFabricInfo_v3_t}
        version = c_uint.from_address(out).value
        if version not in structs:
            return n.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        self._fill_fabric(structs[version].from_address(out), gpu.fabric)
        return n.NVML_SUCCESS

    @staticmethod
    def _fill_fabric(info: Any, fabric: FakeFabric) -> None:
        ctypes.memmove(ctypes.addressof(info.clusterUuid), fabric.cluster_uuid, 16)
        info.status, info.cliqueId, info.state = fabric.status, fabric.clique_id, fabric.state


def install(monkeypatch: Any, library: FakeNvmlLibrary | None) -> FakeNvmlLibrary | None:
    """Make pynvml use `library` (None: no library at all, as on a host without the driver) and
    forget any NVML state checks/hw/nvml.py kept from an earlier test."""
    from checks.hw import nvml as nvml_module

    monkeypatch.setattr(n, "nvmlLib", library)
    monkeypatch.setattr(n, "_nvmlGetFunctionPointer_cache", {})
    monkeypatch.setattr(nvml_module, "_instance", None)
    monkeypatch.setattr(nvml_module, "_init_error", None)
    if library is None:
        def no_library(name: str, *args: Any, **kwargs: Any) -> Any:
            raise OSError(f"{name}: cannot open shared object file: No such file or directory")
        monkeypatch.setattr(n, "CDLL", no_library)
    return library
