"""The one module that calls NVML (nvidia-ml-py). Initialised once per process, errors translated.

Units of the values returned (see base.GPU_FIELDS): bytes, watts, degrees C, MHz; booleans for
modes; `remapped_rows` a dict; `nvlink` a list of {"link", "active", "errors": {...}} for every
link the device has (an active one with "remote_type" and "remote_pci" where NVML gives them);
`ecc_by_location` {"sram"|"dram": {"volatile_uncorrected", ...}};
`fabric_info` {"state", "status", "cluster_uuid", "clique_id"}; `compute_mode` a name;
`minor_number` the N of /dev/nvidiaN.

Error translation (docs/hardware-layer.md has the table): NOT_SUPPORTED and FUNCTION_NOT_FOUND
(a driver older than the bindings) -> NotSupported; GPU_IS_LOST -> GpuLost; anything else ->
HardwareError with the NVML text. At init: LIBRARY_NOT_FOUND, DRIVER_NOT_LOADED, NO_PERMISSION
-> NvmlUnavailable(kind). Every call is bounded in time: a hung GPU can leave NVML stuck in the
kernel (D state, NVIDIA/gpu-monitoring-tools#46), so a call that does not return within
`CALL_TIMEOUT_S` is abandoned on its thread and reported; later calls on that GPU fail at once.
"""

from __future__ import annotations

import ctypes
import threading
import uuid
from collections.abc import Callable
from typing import Any

from checks.hw.base import (
    GpuHandle,
    GpuLost,
    HardwareError,
    NoPermission,
    NotSupported,
    Nvml,
    NvmlUnavailable,
)

# Seconds one NVML call may take before it is abandoned. Healthy calls take micro- to
# milliseconds; nvmlInit on a large node can take seconds, so the bound is generous.
CALL_TIMEOUT_S = 60.0

_lock = threading.Lock()
_instance: RealNvml | None = None
_init_error: NvmlUnavailable | None = None


class InvalidArgument(HardwareError):
    """NVML answered INVALID_ARGUMENT (e.g. a link index past the device's last link)."""


def _pynvml() -> Any:
    try:
        import pynvml
    except ImportError as exc:  # nvidia-ml-py not installed in this environment
        raise NvmlUnavailable("bindings_missing", f"nvidia-ml-py is not installed: {exc}") from exc
    return pynvml


def open_nvml() -> RealNvml:
    """Initialise NVML once; later calls return the same instance or the same error."""
    global _instance, _init_error
    with _lock:
        if _instance is not None:
            return _instance
        if _init_error is not None:
            raise _init_error
        pynvml = _pynvml()
        try:
            _bounded(pynvml.nvmlInit, (), CALL_TIMEOUT_S)
        except _Timeout:
            _init_error = NvmlUnavailable(
                "init_timeout", f"nvmlInit did not return within {CALL_TIMEOUT_S:g} s "
                                "(hung GPU or driver: is nvidia-smi hanging too?)")
            raise _init_error from None
        except pynvml.NVMLError as exc:
            _init_error = _translate_init(pynvml, exc)
            raise _init_error from exc
        _instance = RealNvml(pynvml)
        return _instance


def _translate_init(pynvml: Any, exc: Any) -> NvmlUnavailable:
    kinds = {
        pynvml.NVML_ERROR_LIBRARY_NOT_FOUND: "library_missing",
        pynvml.NVML_ERROR_DRIVER_NOT_LOADED: "driver_not_loaded",
        pynvml.NVML_ERROR_NO_PERMISSION: "no_permission",
        # The user-space library and the loaded kernel module differ (upgraded, not rebooted).
        pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH: "driver_library_mismatch",
    }
    return NvmlUnavailable(kinds.get(exc.value, "init_failed"), f"NVML init failed: {exc}")


class _Timeout(Exception):
    pass


def _bounded(fn: Callable[..., Any], args: tuple[Any, ...], timeout_s: float) -> Any:
    """Run fn(*args) on a daemon thread and wait at most timeout_s (<= 0: call directly).

    NVML is thread-safe (NVML API reference, "Thread safety"), and a daemon thread stuck in
    the kernel cannot keep the process alive at exit."""
    if timeout_s <= 0:
        return fn(*args)
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn(*args)
        except BaseException as exc:  # handed to the caller's thread below
            box["error"] = exc

    thread = threading.Thread(target=target, name="nvml-call", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise _Timeout
    if "error" in box:
        raise box["error"]
    return box["value"]


def _error_name(pynvml: Any, code: int) -> str:
    """NVML_ERROR_NOT_READY -> "not_ready"; NVML_SUCCESS -> "success"."""
    if code == pynvml.NVML_SUCCESS:
        return "success"
    for name in dir(pynvml):
        if name.startswith("NVML_ERROR_") and getattr(pynvml, name) == code:
            return name[len("NVML_ERROR_"):].lower()
    return f"error_{code}"


class RealNvml(Nvml):
    def __init__(self, pynvml: Any, timeout_s: float | None = None) -> None:
        self._n = pynvml
        self.timeout_s = CALL_TIMEOUT_S if timeout_s is None else timeout_s
        # Scope (GPU index, or None for system calls) -> the call that never returned.
        self._hung: dict[int | None, str] = {}

    def _call(self, fn: Callable[..., Any], *args: Any, scope: int | None = None,
              what: str | None = None) -> Any:
        """Call one pynvml function, bounded in time, with its errors translated."""
        n = self._n
        label = what or str(getattr(fn, "__name__", "NVML call"))
        if scope in self._hung:
            raise HardwareError(f"{label}: not attempted, an earlier call "
                                f"({self._hung[scope]}) never returned (hung GPU or driver)")
        try:
            return _bounded(fn, args, self.timeout_s)
        except _Timeout:
            self._hung[scope] = label
            raise HardwareError(f"{label}: no answer within {self.timeout_s:g} s (hung GPU or "
                                "driver; is nvidia-smi hanging too?)") from None
        except n.NVMLError as exc:
            raise _translate(n, exc, label) from exc

    def driver_version(self) -> str:
        return _text(self._call(self._n.nvmlSystemGetDriverVersion))

    def cuda_driver_version(self) -> int:
        return int(self._call(self._n.nvmlSystemGetCudaDriverVersion))

    def device_count(self) -> int:
        return int(self._call(self._n.nvmlDeviceGetCount))

    def gpu(self, index: int) -> GpuHandle:
        label = f"nvmlDeviceGetHandleByIndex({index})"
        try:
            handle = self._call(self._n.nvmlDeviceGetHandleByIndex, index, scope=index, what=label)
        except GpuLost:
            raise
        except HardwareError as exc:
            if index in self._hung:  # a GPU that cannot even be looked up is as good as lost
                raise GpuLost(str(exc)) from exc
            raise
        return RealGpu(self, index, handle)


    def mig_parent(self, mig_uuid: str) -> int | None:
        """nvmlDeviceGetHandleByUUID answers a MIG device handle for a MIG UUID;
        nvmlDeviceGetDeviceHandleFromMigDeviceHandle gives its GPU, nvmlDeviceGetIndex that
        GPU's index (NVML API reference, MIG management). None where any step is refused."""
        n = self._n
        try:
            mig = self._call(n.nvmlDeviceGetHandleByUUID, mig_uuid.encode(),
                             what=f"nvmlDeviceGetHandleByUUID({mig_uuid})")
            parent = self._call(n.nvmlDeviceGetDeviceHandleFromMigDeviceHandle, mig,
                                what="nvmlDeviceGetDeviceHandleFromMigDeviceHandle")
            return int(self._call(n.nvmlDeviceGetIndex, parent, what="nvmlDeviceGetIndex"))
        except (HardwareError, AttributeError, TypeError, ValueError):
            return None


def _translate(n: Any, exc: Any, label: str) -> HardwareError:
    code = exc.value
    err: HardwareError
    if code == n.NVML_ERROR_NOT_SUPPORTED:
        err = NotSupported(f"{label}: {exc}")
    elif code == n.NVML_ERROR_FUNCTION_NOT_FOUND:
        err = NotSupported(f"{label}: the driver's NVML library has no such function (driver "
                           "older than the nvidia-ml-py bindings)")
    elif code == n.NVML_ERROR_GPU_IS_LOST:
        err = GpuLost(f"{label}: {exc}")
    elif code == n.NVML_ERROR_INVALID_ARGUMENT:
        err = InvalidArgument(f"{label}: {exc}")
    elif code == n.NVML_ERROR_NO_PERMISSION:
        err = NoPermission(f"{label}: {exc}")
    else:
        err = HardwareError(f"{label}: {exc}")
    err.nvml_code = code  # type: ignore[attr-defined]
    return err


def nvml_code(exc: BaseException) -> int | None:
    """The NVML return code behind a translated error (None for one NVML did not answer)."""
    return getattr(exc, "nvml_code", None)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RealGpu(GpuHandle):
    def __init__(self, nvml: RealNvml, index: int, handle: Any) -> None:
        self.index = index
        self._nvml = nvml
        self._h = handle
        n = nvml._n
        ecc = n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_MEMORY_ERROR_TYPE_CORRECTED
        self._fields: dict[str, Callable[[], Any]] = {
            "name": lambda: _text(self._c(n.nvmlDeviceGetName)),
            "uuid": lambda: _text(self._c(n.nvmlDeviceGetUUID)),
            "pci_bus_id": lambda: _pci(_text(self._c(n.nvmlDeviceGetPciInfo).busId)),
            "serial": lambda: _text(self._c(n.nvmlDeviceGetSerial)),
            "memory_total_bytes": lambda: int(self._c(n.nvmlDeviceGetMemoryInfo).total),
            "compute_capability": lambda: tuple(self._c(n.nvmlDeviceGetCudaComputeCapability)),
            "persistence_mode": lambda: bool(self._c(n.nvmlDeviceGetPersistenceMode)),
            "ecc_mode": lambda: bool(self._c(n.nvmlDeviceGetEccMode)[0]),
            "ecc_volatile_uncorrected": lambda: self._ecc(ecc[0], n.NVML_VOLATILE_ECC),
            "ecc_volatile_corrected": lambda: self._ecc(ecc[1], n.NVML_VOLATILE_ECC),
            "ecc_aggregate_uncorrected": lambda: self._ecc(ecc[0], n.NVML_AGGREGATE_ECC),
            "ecc_aggregate_corrected": lambda: self._ecc(ecc[1], n.NVML_AGGREGATE_ECC),
            "retired_pages_sbe": lambda: self._retired(
                n.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS),
            "retired_pages_dbe": lambda: self._retired(
                n.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR),
            "retired_pages_pending": lambda: bool(self._c(n.nvmlDeviceGetRetiredPagesPendingStatus)),
            "remapped_rows": self._remapped_rows,
            "pcie_gen_current": lambda: int(self._c(n.nvmlDeviceGetCurrPcieLinkGeneration)),
            "pcie_gen_max": lambda: int(self._c(n.nvmlDeviceGetMaxPcieLinkGeneration)),
            "pcie_width_current": lambda: int(self._c(n.nvmlDeviceGetCurrPcieLinkWidth)),
            "pcie_width_max": lambda: int(self._c(n.nvmlDeviceGetMaxPcieLinkWidth)),
            "pcie_replay_counter": lambda: int(self._c(n.nvmlDeviceGetPcieReplayCounter)),
            "clock_event_reasons": self._clock_reasons,
            "temperature_c": self._temperature,
            "temperature_slowdown_c": lambda: int(self._c(
                n.nvmlDeviceGetTemperatureThreshold, n.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)),
            "temperature_shutdown_c": lambda: int(self._c(
                n.nvmlDeviceGetTemperatureThreshold, n.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN)),
            "power_w": lambda: self._c(n.nvmlDeviceGetPowerUsage) / 1000.0,
            "power_limit_w": lambda: self._c(n.nvmlDeviceGetEnforcedPowerLimit) / 1000.0,
            "power_default_limit_w": lambda: self._c(n.nvmlDeviceGetPowerManagementDefaultLimit) / 1000.0,
            "nvlink": self._nvlink,
            "mig_mode": lambda: bool(self._c(n.nvmlDeviceGetMigMode)[0]),
            "sm_clock_mhz": lambda: int(self._c(n.nvmlDeviceGetClockInfo, n.NVML_CLOCK_SM)),
            "sm_clock_max_mhz": lambda: int(self._c(n.nvmlDeviceGetMaxClockInfo, n.NVML_CLOCK_SM)),
            "utilization_gpu": lambda: int(self._c(n.nvmlDeviceGetUtilizationRates).gpu),
            "ecc_by_location": self._ecc_by_location,
            "fabric_info": self._fabric_info,
            "compute_mode": self._compute_mode,
            "minor_number": lambda: int(self._c(n.nvmlDeviceGetMinorNumber)),
            "memory_used_bytes": self._memory_used,
            "compute_processes": self._compute_processes,
            "vbios_version": lambda: _text(self._c(n.nvmlDeviceGetVbiosVersion)),
            "inforom_image_version": lambda: _text(self._c(n.nvmlDeviceGetInforomImageVersion)),
            "recovery_action": self._recovery_action,
            "nvlink_p2p_peers": self._nvlink_p2p_peers,
        }

    def _c(self, fn: Callable[..., Any], *args: Any, what: str | None = None) -> Any:
        return self._nvml._call(fn, self._h, *args, scope=self.index, what=what)

    def _older(self, new: str, old: str, *args: Any) -> Any:
        """Call pynvml's `new` function; on a driver that lacks its symbol, call `old`."""
        n = self._nvml._n
        fn = getattr(n, new, None)
        if fn is not None:
            try:
                return self._c(fn, *args)
            except NotSupported as exc:
                if nvml_code(exc) != n.NVML_ERROR_FUNCTION_NOT_FOUND:
                    raise
        return self._c(getattr(n, old), *args)

    def _ecc(self, kind: int, counter: int) -> int:
        return int(self._c(self._nvml._n.nvmlDeviceGetTotalEccErrors, kind, counter))

    def _retired(self, cause: int) -> int:
        """Count of retired pages. pynvml asks the size first, then reads with a larger buffer;
        a page retired between those two calls makes the second answer INSUFFICIENT_SIZE (NVML
        API reference, nvmlDeviceGetRetiredPages), so the whole query is asked again."""
        n = self._nvml._n
        attempts = 3
        for _ in range(attempts - 1):
            try:
                return len(self._c(n.nvmlDeviceGetRetiredPages, cause))
            except HardwareError as exc:
                if nvml_code(exc) != n.NVML_ERROR_INSUFFICIENT_SIZE:
                    raise
        try:
            return len(self._c(n.nvmlDeviceGetRetiredPages, cause))
        except HardwareError as exc:
            if nvml_code(exc) == n.NVML_ERROR_INSUFFICIENT_SIZE:
                raise HardwareError(f"{exc} (the retired page count changed during each of "
                                    f"{attempts} reads)") from exc
            raise

    def _remapped_rows(self) -> dict[str, Any]:
        corr, unc, pending, failed = self._c(self._nvml._n.nvmlDeviceGetRemappedRows)
        return {"correctable": int(corr), "uncorrectable": int(unc),
                "pending": bool(pending), "failed": bool(failed)}

    def _clock_reasons(self) -> int:
        # "Throttle" was renamed "event" in driver 535; older drivers have only the old symbol.
        return int(self._older("nvmlDeviceGetCurrentClocksEventReasons",
                               "nvmlDeviceGetCurrentClocksThrottleReasons"))

    def _temperature(self) -> int:
        n = self._nvml._n
        try:
            return int(self._c(n.nvmlDeviceGetTemperature, n.NVML_TEMPERATURE_GPU))
        except NotSupported as exc:
            # nvmlDeviceGetTemperature is deprecated for removal (pynvml: "CUDA 14.0"); a driver
            # without it has nvmlDeviceGetTemperatureV.
            fn = getattr(n, "nvmlDeviceGetTemperatureV", None)
            if fn is None or nvml_code(exc) != n.NVML_ERROR_FUNCTION_NOT_FOUND:
                raise
            return int(self._c(fn, n.NVML_TEMPERATURE_GPU))

    def _nvlink(self) -> list[dict[str, Any]]:
        """Every NVLink the device has, with its state and DL error counters.

        nvmlDeviceGetNvLinkState answers INVALID_ARGUMENT for "device or link is invalid" and
        NOT_SUPPORTED when "the device doesn't support this feature" (nvml.h / NVML API
        reference, NvLink methods). NVML_NVLINK_MAX_LINKS is a bound over all architectures
        (36 in nvidia-ml-py 13): a GB200 has 18 links and the driver rejects 18..35 with
        INVALID_ARGUMENT (NVIDIA/TensorRT-LLM#17060). So INVALID_ARGUMENT is the end of the
        list; a NOT_SUPPORTED index is not a link of this device and is passed over; any other
        answer (UNKNOWN, GPU_IS_LOST, NO_PERMISSION, ...) is this GPU's error, never the end.
        """
        n = self._nvml._n
        counters = {
            "replay": n.NVML_NVLINK_ERROR_DL_REPLAY,
            "recovery": n.NVML_NVLINK_ERROR_DL_RECOVERY,
            "crc_flit": n.NVML_NVLINK_ERROR_DL_CRC_FLIT,
        }
        links: list[dict[str, Any]] = []
        first_refusal: HardwareError | None = None
        for link in range(n.NVML_NVLINK_MAX_LINKS):
            what = f"nvmlDeviceGetNvLinkState(link {link})"
            try:
                active = bool(self._c(n.nvmlDeviceGetNvLinkState, link, what=what))
            except (InvalidArgument, NotSupported) as exc:
                first_refusal = first_refusal or exc
                if isinstance(exc, InvalidArgument):
                    break
                continue
            errors = {}
            for key, counter in counters.items():
                try:
                    errors[key] = int(self._c(n.nvmlDeviceGetNvLinkErrorCounter, link, counter,
                                              what=f"nvmlDeviceGetNvLinkErrorCounter(link {link}, "
                                                   f"{key})"))
                except NotSupported:  # e.g. DL counters on Blackwell; the state still counts
                    continue
            entry: dict[str, Any] = {"link": link, "active": active, "errors": errors}
            if active:
                entry.update(self._nvlink_remote(link))
            links.append(entry)
        if not links:
            raise NotSupported(f"no NVLink on this GPU ({first_refusal})")
        return links

    def _memory_used(self) -> int:
        """Memory processes allocated, without what the driver reserves for itself.

        nvmlDeviceGetMemoryInfo (v1) reports `used` as reserved + allocated (nvml.h, nvmlMemory_t),
        and the driver's reservation is hundreds of MB to about 1 GB on an idle B200/B300, which
        an occupancy check would read as someone's memory; nvmlDeviceGetMemoryInfo_v2 reports
        `reserved` apart and `used` as allocated only (nvmlMemory_v2_t). v1 only on a driver
        without v2."""
        n = self._nvml._n
        version = getattr(n, "nvmlMemory_v2", None)
        if version is not None:
            try:
                return int(self._c(n.nvmlDeviceGetMemoryInfo, version,
                                   what="nvmlDeviceGetMemoryInfo_v2").used)
            except NotSupported as exc:
                if nvml_code(exc) != n.NVML_ERROR_FUNCTION_NOT_FOUND:
                    raise
        return int(self._c(n.nvmlDeviceGetMemoryInfo).used)

    def _recovery_action(self) -> str:
        """NVML_FI_DEV_GET_GPU_RECOVERY_ACTION through nvmlDeviceGetFieldValues: the action the
        driver says this GPU needs (nvml.h, nvmlGpuRecoveryAction_t). The field's own return
        code is translated like a call's. A driver without it may still have the two fields it
        replaced (NVML_FI_DEV_RESET_STATUS 226, NVML_FI_DEV_DRAIN_AND_RESET_STATUS 227, which
        nvidia-ml-py marks "Deprecated use NVML_FI_DEV_GET_GPU_RECOVERY_ACTION instead"): a
        non-zero drain-and-reset reads as drain_and_reset, a non-zero reset as gpu_reset, both
        zero as none. A driver with none of the three answers NOT_SUPPORTED."""
        n = self._nvml._n
        field = getattr(n, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", None)
        label = "nvmlDeviceGetFieldValues(NVML_FI_DEV_GET_GPU_RECOVERY_ACTION)"
        try:
            if field is None:
                raise NotSupported("nvidia-ml-py has no NVML_FI_DEV_GET_GPU_RECOVERY_ACTION")
            code = self._field_uint(field, label)
        except NotSupported as exc:
            status = self._reset_status()
            if status is None:
                raise exc from None
            return status
        return RECOVERY_ACTIONS.get(code, f"unknown({code})")

    def _field_uint(self, field: int, label: str) -> int:
        n = self._nvml._n
        (value,) = self._c(n.nvmlDeviceGetFieldValues, [field], what=label)
        if value.nvmlReturn != n.NVML_SUCCESS:
            raise _translate(n, n.NVMLError(value.nvmlReturn), label)
        return int(value.value.uiVal)

    def _reset_status(self) -> str | None:
        """The deprecated reset fields as a recovery action; None when neither is supported."""
        n = self._nvml._n
        read: dict[str, int] = {}
        for key, name in (("drain_and_reset", "NVML_FI_DEV_DRAIN_AND_RESET_STATUS"),
                          ("gpu_reset", "NVML_FI_DEV_RESET_STATUS")):
            field = getattr(n, name, None)
            if field is None:
                continue
            try:
                read[key] = self._field_uint(field, f"nvmlDeviceGetFieldValues({name})")
            except NotSupported:
                continue
        if not read:
            return None
        return next((key for key, value in read.items() if value), "none")

    def _nvlink_remote(self, link: int) -> dict[str, str]:
        """What the far end of an active link is: "remote_type" (gpu, switch, ibmnpu, unknown)
        from nvmlDeviceGetNvLinkRemoteDeviceType and "remote_pci" (its bus id) from
        nvmlDeviceGetNvLinkRemotePciInfo (NVML API reference, NvLink methods). On HGX B200/B300
        and GB200 the NVSwitches are not on the host's PCI bus, so the remote type is what says
        a link runs to a switch; a bridged pair (H100 NVL) names its peer's bus id. A driver or
        device that answers neither leaves the keys out: the topology then falls back to the
        PCI bus and the profile."""
        n = self._nvml._n
        out: dict[str, str] = {}
        kinds = {getattr(n, "NVML_NVLINK_DEVICE_TYPE_GPU", 0): "gpu",
                 getattr(n, "NVML_NVLINK_DEVICE_TYPE_IBMNPU", 1): "ibmnpu",
                 getattr(n, "NVML_NVLINK_DEVICE_TYPE_SWITCH", 2): "switch"}
        fn = getattr(n, "nvmlDeviceGetNvLinkRemoteDeviceType", None)
        if fn is not None:
            try:
                kind = self._c(fn, link, what=f"nvmlDeviceGetNvLinkRemoteDeviceType(link {link})")
                out["remote_type"] = kinds.get(int(kind), "unknown")
            except (HardwareError, TypeError, ValueError):
                pass
        fn = getattr(n, "nvmlDeviceGetNvLinkRemotePciInfo", None)
        if fn is not None and out.get("remote_type") != "switch":
            try:
                info = self._c(fn, link, what=f"nvmlDeviceGetNvLinkRemotePciInfo(link {link})")
                bus = _text(getattr(info, "busId", b"") or b"")
                if bus:
                    out["remote_pci"] = _pci(bus)
            except (HardwareError, ValueError):
                pass
        return out

    def _nvlink_p2p_peers(self) -> list[str]:
        """The other GPUs for which nvmlDeviceGetP2PStatus with NVML_P2P_CAPS_INDEX_NVLINK
        answers NVML_P2P_STATUS_OK, by bus id. A pair the driver refuses to answer for is left
        out; a driver without the function, or one that answers for no pair, -> NotSupported."""
        n = self._nvml._n
        fn = getattr(n, "nvmlDeviceGetP2PStatus", None)
        if fn is None:
            raise NotSupported("nvmlDeviceGetP2PStatus: not in these NVML bindings")
        nvlink = getattr(n, "NVML_P2P_CAPS_INDEX_NVLINK", 2)
        ok = getattr(n, "NVML_P2P_STATUS_OK", 0)
        peers, answered = [], 0
        for other in range(self._nvml.device_count()):
            if other == self.index:
                continue
            try:  # the other GPU: one that cannot be looked up is no peer of anything
                handle = self._nvml._call(n.nvmlDeviceGetHandleByIndex, other, scope=other,
                                          what=f"nvmlDeviceGetHandleByIndex({other})")
                bus = _pci(_text(self._nvml._call(n.nvmlDeviceGetPciInfo, handle, scope=other,
                                                  what=f"nvmlDeviceGetPciInfo({other})").busId))
            except HardwareError:
                continue
            try:  # this GPU's answer: lost or hung is this GPU's error
                status = self._c(fn, handle, nvlink,
                                 what=f"nvmlDeviceGetP2PStatus({self.index}, {other}, NVLINK)")
            except NotSupported as exc:
                if nvml_code(exc) == n.NVML_ERROR_FUNCTION_NOT_FOUND:
                    raise
                continue
            except InvalidArgument:
                continue
            answered += 1
            if int(status) == ok:
                peers.append(bus)
        if not answered:
            raise NotSupported("nvmlDeviceGetP2PStatus(NVLINK) answered for no pair")
        return peers

    def _ecc_by_location(self) -> dict[str, dict[str, int]]:
        """nvmlDeviceGetMemoryErrorCounter per location (SRAM, DRAM). A counter the device does
        not support is left out, and a location with none at all; nothing -> NotSupported."""
        n = self._nvml._n
        kinds = {"uncorrected": n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                 "corrected": n.NVML_MEMORY_ERROR_TYPE_CORRECTED}
        scopes = {"volatile": n.NVML_VOLATILE_ECC, "aggregate": n.NVML_AGGREGATE_ECC}
        locations = {"sram": n.NVML_MEMORY_LOCATION_SRAM, "dram": n.NVML_MEMORY_LOCATION_DRAM}
        out: dict[str, dict[str, int]] = {}
        refusal: NotSupported | None = None
        for loc_name, loc in locations.items():
            counts: dict[str, int] = {}
            for scope_name, scope in scopes.items():
                for kind_name, kind in kinds.items():
                    try:
                        counts[f"{scope_name}_{kind_name}"] = int(self._c(
                            n.nvmlDeviceGetMemoryErrorCounter, kind, scope, loc,
                            what=f"nvmlDeviceGetMemoryErrorCounter({loc_name}, {scope_name}, "
                                 f"{kind_name})"))
                    except NotSupported as exc:
                        refusal = exc
            if counts:
                out[loc_name] = counts
        if not out:
            raise NotSupported(f"no ECC counts by location ({refusal})")
        return out

    def _fabric_info(self) -> dict[str, Any]:
        """GPU fabric registration (NVSwitch/NVLink domain): nvmlDeviceGetGpuFabricInfoV with a
        versioned struct where pynvml and the driver have it, else the older
        nvmlDeviceGetGpuFabricInfo (the struct without a version field)."""
        n = self._nvml._n
        info: Any = None
        v_fn = getattr(n, "nvmlDeviceGetGpuFabricInfoV", None)
        v_struct = getattr(n, "c_nvmlGpuFabricInfoV_t", None)
        if v_fn is not None and v_struct is not None:
            info = v_struct()  # its constructor sets .version
            try:
                self._c(v_fn, ctypes.byref(info))
            except HardwareError as exc:
                old_driver = (n.NVML_ERROR_FUNCTION_NOT_FOUND,
                              getattr(n, "NVML_ERROR_ARGUMENT_VERSION_MISMATCH", None))
                if nvml_code(exc) not in old_driver:
                    raise
                info = None
        if info is None:
            info = n.c_nvmlGpuFabricInfo_t()
            self._c(n.nvmlDeviceGetGpuFabricInfo, ctypes.byref(info))
        states = {
            n.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED: "not_supported",
            n.NVML_GPU_FABRIC_STATE_NOT_STARTED: "not_started",
            n.NVML_GPU_FABRIC_STATE_IN_PROGRESS: "in_progress",
            n.NVML_GPU_FABRIC_STATE_COMPLETED: "completed",
        }
        state = int(info.state)
        if state not in states:
            raise HardwareError(f"GPU fabric state {state} is not one NVML documents")
        return {"state": states[state], "status": _error_name(n, int(info.status)),
                "cluster_uuid": str(uuid.UUID(bytes=bytes(info.clusterUuid))),
                "clique_id": int(info.cliqueId)}

    def _compute_mode(self) -> str:
        n = self._nvml._n
        modes = {
            n.NVML_COMPUTEMODE_DEFAULT: "default",
            # EXCLUSIVE_THREAD was removed (CUDA 8); a driver reporting it means one process.
            n.NVML_COMPUTEMODE_EXCLUSIVE_THREAD: "exclusive_process",
            n.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS: "exclusive_process",
            n.NVML_COMPUTEMODE_PROHIBITED: "prohibited",
        }
        mode = int(self._c(n.nvmlDeviceGetComputeMode))
        if mode not in modes:
            raise HardwareError(f"compute mode {mode} is not one NVML documents")
        return modes[mode]

    def _compute_processes(self) -> list[dict[str, Any]]:
        """Processes with a compute context on this GPU. The _v3 entry point where the driver
        has it, else _v2 (drivers before 510 lack _v3). The name comes from
        nvmlSystemGetProcessName, None when NVML cannot name it (a PID of another PID namespace
        answers NOT_FOUND)."""
        n = self._nvml._n
        procs = self._older("nvmlDeviceGetComputeRunningProcesses_v3",
                            "nvmlDeviceGetComputeRunningProcesses_v2")
        out = []
        for proc in procs:
            pid = int(proc.pid)
            try:
                name: str | None = _text(self._nvml._call(
                    n.nvmlSystemGetProcessName, pid, what=f"nvmlSystemGetProcessName({pid})"))
            except HardwareError:
                name = None
            used = proc.usedGpuMemory
            out.append({"pid": pid, "name": name or None,
                        "used_memory_bytes": None if used is None else int(used)})
        return out

    def query(self, field_name: str) -> Any:
        try:
            getter = self._fields[field_name]
        except KeyError:
            raise KeyError(f"unknown GPU field {field_name!r}") from None
        return getter()


# nvmlGpuRecoveryAction_t (nvml.h; the values of nvidia-ml-py's NVML_GPU_RECOVERY_ACTION_*).
RECOVERY_ACTIONS = {0: "none", 1: "gpu_reset", 2: "node_reboot", 3: "drain_p2p",
                    4: "drain_and_reset", 5: "recover_imex_domain", 6: "bus_reset",
                    7: "system_reboot"}


def _pci(bus_id: str) -> str:
    """NVML prints 00000000:3B:00.0; sysfs uses 0000:3b:00.0."""
    domain, rest = bus_id.split(":", 1)
    return f"{int(domain, 16):04x}:{rest.lower()}"
