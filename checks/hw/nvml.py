"""The one module that calls NVML (nvidia-ml-py). Initialised once per process, errors translated.

Units of the values returned (see base.GPU_FIELDS): bytes, watts, degrees C, MHz; booleans for
modes; `remapped_rows` a dict; `nvlink` a list of {"link", "active", "errors": {...}} for every
link the device has.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from .base import GpuHandle, GpuLost, HardwareError, NotSupported, Nvml, NvmlUnavailable

_lock = threading.Lock()
_instance: RealNvml | None = None
_init_error: NvmlUnavailable | None = None


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
            pynvml.nvmlInit()
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
    }
    return NvmlUnavailable(kinds.get(exc.value, "init_failed"), f"NVML init failed: {exc}")


class RealNvml(Nvml):
    def __init__(self, pynvml: Any) -> None:
        self._n = pynvml

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        n = self._n
        try:
            return fn(*args)
        except n.NVMLError as exc:
            if exc.value == n.NVML_ERROR_NOT_SUPPORTED:
                raise NotSupported(str(exc)) from exc
            if exc.value == n.NVML_ERROR_GPU_IS_LOST:
                raise GpuLost(str(exc)) from exc
            raise HardwareError(str(exc)) from exc

    def driver_version(self) -> str:
        return _text(self._call(self._n.nvmlSystemGetDriverVersion))

    def cuda_driver_version(self) -> int:
        return int(self._call(self._n.nvmlSystemGetCudaDriverVersion))

    def device_count(self) -> int:
        return int(self._call(self._n.nvmlDeviceGetCount))

    def gpu(self, index: int) -> GpuHandle:
        return RealGpu(self, index, self._call(self._n.nvmlDeviceGetHandleByIndex, index))


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
            "retired_pages_sbe": lambda: len(self._c(
                n.nvmlDeviceGetRetiredPages, n.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)),
            "retired_pages_dbe": lambda: len(self._c(
                n.nvmlDeviceGetRetiredPages, n.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)),
            "retired_pages_pending": lambda: bool(self._c(n.nvmlDeviceGetRetiredPagesPendingStatus)),
            "remapped_rows": self._remapped_rows,
            "pcie_gen_current": lambda: int(self._c(n.nvmlDeviceGetCurrPcieLinkGeneration)),
            "pcie_gen_max": lambda: int(self._c(n.nvmlDeviceGetMaxPcieLinkGeneration)),
            "pcie_width_current": lambda: int(self._c(n.nvmlDeviceGetCurrPcieLinkWidth)),
            "pcie_width_max": lambda: int(self._c(n.nvmlDeviceGetMaxPcieLinkWidth)),
            "pcie_replay_counter": lambda: int(self._c(n.nvmlDeviceGetPcieReplayCounter)),
            "clock_event_reasons": self._clock_reasons,
            "temperature_c": lambda: int(self._c(n.nvmlDeviceGetTemperature, n.NVML_TEMPERATURE_GPU)),
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
        }

    def _c(self, fn: Callable[..., Any], *args: Any) -> Any:
        return self._nvml._call(fn, self._h, *args)

    def _ecc(self, kind: int, counter: int) -> int:
        return int(self._c(self._nvml._n.nvmlDeviceGetTotalEccErrors, kind, counter))

    def _remapped_rows(self) -> dict[str, Any]:
        corr, unc, pending, failed = self._c(self._nvml._n.nvmlDeviceGetRemappedRows)
        return {"correctable": int(corr), "uncorrectable": int(unc),
                "pending": bool(pending), "failed": bool(failed)}

    def _clock_reasons(self) -> int:
        n = self._nvml._n
        fn = getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            n.nvmlDeviceGetCurrentClocksThrottleReasons
        return int(self._c(fn))

    def _nvlink(self) -> list[dict[str, Any]]:
        n = self._nvml._n
        counters = {
            "replay": n.NVML_NVLINK_ERROR_DL_REPLAY,
            "recovery": n.NVML_NVLINK_ERROR_DL_RECOVERY,
            "crc_flit": n.NVML_NVLINK_ERROR_DL_CRC_FLIT,
        }
        links = []
        for link in range(n.NVML_NVLINK_MAX_LINKS):
            try:
                active = bool(self._c(n.nvmlDeviceGetNvLinkState, link))
            except NotSupported:
                if link == 0:
                    raise
                break
            except HardwareError:  # invalid argument past the last link of this device
                break
            errors = {}
            for key, counter in counters.items():
                try:
                    errors[key] = int(self._c(n.nvmlDeviceGetNvLinkErrorCounter, link, counter))
                except NotSupported:
                    continue
            links.append({"link": link, "active": active, "errors": errors})
        return links

    def query(self, field_name: str) -> Any:
        try:
            getter = self._fields[field_name]
        except KeyError:
            raise KeyError(f"unknown GPU field {field_name!r}") from None
        return getter()


def _pci(bus_id: str) -> str:
    """NVML prints 00000000:3B:00.0; sysfs uses 0000:3b:00.0."""
    domain, rest = bus_id.split(":", 1)
    return f"{int(domain, 16):04x}:{rest.lower()}"
