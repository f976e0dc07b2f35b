"""`LinuxBackend.workload()`: the real measurements, by name.

Result shapes (the fixture backend returns the same, see scenario.py):
- collectives: collective.run()'s dict (launch outcome, per-op curves, errors, table, env)
- matmul: [{"index", "pci", "device", "tflops": {dtype: TFLOP/s}}], one row per GPU, or one
  row with index None on the CPU
- membw: [{"index", "pci", "device", "copy_gbs"}]
- p2p: {"count", "pci", "access": [[bool]], "bandwidth_gbs": [[GB/s | None]], "bytes"}
- burn_in: burn.burn()'s dict; devices carry "pci", samples come from NVML
- digest: [{"index", "pci", "device", "digest", "digests": [per repeat], "reference"}], one row
  per GPU, or one row with index None on the CPU (reference.py: the fixed computation)
- dataloader_workers / dataloader_scaling / dataloader_worker_death: dataloader.py's dicts

`exclude_pci` (matmul, membw, burn_in): PCI addresses of GPUs not to touch (compute mode
PROHIBITED). Everything that creates a CUDA context runs in a child process (isolate.py): the
supervising process never holds one, so GPUs in compute mode EXCLUSIVE_PROCESS stay free for
the next check's processes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from checks.hw.base import Backend, HardwareError, NotSupported
from checks.hw.measure import collective_run as collective

SAMPLE_FIELDS = ("sm_clock_mhz", "clock_event_reasons", "temperature_c", "power_w",
                 "pcie_gen_current", "pcie_width_current", "utilization_gpu")


# Hard deadline of a measurement's child process, a little inside its check's timeout (the
# runner abandons a check at its timeout but cannot kill what it started).
CHILD_TIMEOUT_S = {"digest": 290.0,
                   "matmul": 1750.0, "membw": 870.0, "p2p": 870.0, "dataloader_scaling": 870.0}
BURN_IN_MARGIN_S = 600.0


def needs_child(name: str, params: dict[str, Any]) -> bool:
    """True for measurements that create a CUDA context."""
    if name in ("matmul", "membw", "burn_in", "digest"):
        return params.get("device") == "cuda"
    if name == "dataloader_scaling":
        return bool(params.get("pin_memory"))
    return name == "p2p"


def child_timeout(name: str, params: dict[str, Any]) -> float:
    if name == "burn_in":
        return float(params.get("duration_s", 600)) + BURN_IN_MARGIN_S
    return CHILD_TIMEOUT_S.get(name, 870.0)


def run(hw: Backend, name: str, **params: Any) -> Any:
    handler = HANDLERS.get(name)
    if handler is None:
        raise NotSupported(f"unknown workload {name!r}")
    if needs_child(name, params):
        from checks.hw.measure import isolate

        return isolate.run_child(name, params, timeout_s=child_timeout(name, params))
    return handler(hw, **params)


def _devices(kind: str, exclude_pci: list[str] | tuple[str, ...] = ()) -> list[Any]:
    import torch

    if kind == "cuda":
        from checks.hw.measure.compute_run import pci_of

        if not torch.cuda.is_available():
            raise HardwareError("torch.cuda.is_available() is False on a GPU host")
        skip = {p.lower() for p in exclude_pci}
        return [torch.device("cuda", i) for i in range(torch.cuda.device_count())
                if (pci_of(i) or "").lower() not in skip]
    return [torch.device("cpu")]


def _collectives(hw: Backend, **params: Any) -> dict[str, Any]:
    result = collective.run(**params)
    result["env"] = collective.debug_env(hw.environ())
    return result


def _matmul(hw: Backend, *, device: str, dtypes: list[str], n: int,
            min_time_s: float = 0.1, exclude_pci: list[str] | None = None
            ) -> list[dict[str, Any]]:
    from checks.hw.measure import compute_run as compute

    if device == "cuda":
        return compute.per_gpu(lambda d: {"device": str(d), "tflops": compute.matmul(
            d, dtypes, n, min_time_s=min_time_s)}, exclude_pci=exclude_pci or ())
    cpu = _devices("cpu")[0]
    return [{"index": None, "pci": None, "device": "cpu",
             "tflops": compute.matmul(cpu, dtypes, n, warmup=1, min_time_s=min_time_s)}]


def _membw(hw: Backend, *, device: str, nbytes: int, min_time_s: float = 0.1,
           exclude_pci: list[str] | None = None) -> list[dict[str, Any]]:
    from checks.hw.measure import compute_run as compute

    if device == "cuda":
        return compute.per_gpu(lambda d: {"device": str(d), "copy_gbs": compute.copy_bandwidth(
            d, nbytes, min_time_s=min_time_s)}, exclude_pci=exclude_pci or ())
    cpu = _devices("cpu")[0]
    return [{"index": None, "pci": None, "device": "cpu",
             "copy_gbs": compute.copy_bandwidth(cpu, nbytes, warmup=1, min_time_s=min_time_s)}]


def _p2p(hw: Backend, *, nbytes: int) -> dict[str, Any]:
    from checks.hw.measure import compute_run as compute

    _devices("cuda")
    return compute.p2p(nbytes)


def _nvml_sampler(hw: Backend) -> Callable[[], list[dict[str, Any]]] | None:
    try:
        nvml = hw.nvml()
        handles = [nvml.gpu(i) for i in range(nvml.device_count())]
    except HardwareError:
        return None

    def sample() -> list[dict[str, Any]]:
        rows = []
        for h in handles:
            row: dict[str, Any] = {"gpu": h.index}
            for field in SAMPLE_FIELDS:
                try:
                    row[field] = h.query(field)
                except HardwareError:
                    row[field] = None
            rows.append(row)
        return rows

    return sample


def _burn_in(hw: Backend, *, device: str, duration_s: float, n: int, dtype: str,
             sample_interval_s: float = 2.0, exclude_pci: list[str] | None = None
             ) -> dict[str, Any]:
    from checks.hw.measure import burn
    from checks.hw.measure import compute_run as compute

    devices = _devices(device, exclude_pci or ())
    if not devices:
        raise HardwareError("no GPU left to burn in (every GPU excluded)")
    sampler = _nvml_sampler(hw) if device == "cuda" else None
    result = burn.burn(devices, duration_s=duration_s, n=n, dtype=dtype, sampler=sampler,
                       sample_interval_s=sample_interval_s)
    for row in result["devices"]:
        row["pci"] = compute.pci_of(row["index"]) if row["index"] is not None else None
    return result


def _digest(hw: Backend, *, device: str, repeats: int = 2,
            exclude_pci: list[str] | None = None) -> list[dict[str, Any]]:
    import os

    from checks.hw.measure import reference

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before the CUDA context exists
    if device == "cuda":
        from checks.hw.measure import compute_run as compute

        return compute.per_gpu(lambda d: reference.run([d], repeats)[0],
                               exclude_pci=exclude_pci or ())
    return [{**reference.run(_devices("cpu"), repeats)[0], "pci": None}]


def _dataloader_workers(hw: Backend, **params: Any) -> dict[str, Any]:
    from checks.hw.measure import dataloader_run as dataloader

    return dataloader.start_methods(**params)


def _dataloader_scaling(hw: Backend, **params: Any) -> dict[str, Any]:
    from checks.hw.measure import dataloader_run as dataloader

    return dataloader.scaling(**params)


def _dataloader_worker_death(hw: Backend, **params: Any) -> dict[str, Any]:
    from checks.hw.measure import dataloader_run as dataloader

    return dataloader.worker_death(**params)


def _ib_write_bw(hw: Backend, **params: Any) -> dict[str, Any]:
    from checks.hw import perftest

    return perftest.run_loopback(**params)


HANDLERS: dict[str, Callable[..., Any]] = {
    "ib_write_bw": _ib_write_bw,
    "collectives": _collectives,
    "matmul": _matmul,
    "membw": _membw,
    "p2p": _p2p,
    "burn_in": _burn_in,
    "digest": _digest,
    "dataloader_workers": _dataloader_workers,
    "dataloader_scaling": _dataloader_scaling,
    "dataloader_worker_death": _dataloader_worker_death,
}
