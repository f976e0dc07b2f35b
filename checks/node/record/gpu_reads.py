"""What the recorder reads from NVML and the PCI bus: the driver, each GPU's fields (GPU_FIELDS)
in NVML order, the NVSwitches, and the join of NVML's GPUs with the bus (a lost GPU placed at an
unclaimed address, a bus GPU NVML does not list written `nvml_visible: false`). Once an NVML call
hangs, no later NVML call is made (checks/node/record/recorder.py assembles the recording)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from checks.hw.base import (
    GPU_FIELDS,
    GpuHandle,
    GpuLost,
    NoPermission,
    NotSupported,
    NvmlUnavailable,
    PciDevice,
)
from checks.hw.fixture import NVML_KINDS, _expand_nvlink
from checks.node.record.reads import HexInt, Hung, Reads, drop_missing, one_line, plain


def _compact_nvlink(links: list[dict[str, Any]]) -> Any:
    """The short scenario form {links, inactive, errors} when it expands back to exactly these
    links, else the list itself."""
    compact: dict[str, Any] = {"links": len(links)}
    inactive = [lk.get("link") for lk in links if not lk.get("active")]
    errors = {lk.get("link"): {k: v for k, v in (lk.get("errors") or {}).items() if v}
              for lk in links}
    if inactive:
        compact["inactive"] = inactive
    if any(errors.values()):
        compact["errors"] = {i: e for i, e in errors.items() if e}
    try:
        same = _expand_nvlink(compact) == links
    except (TypeError, ValueError):
        same = False
    return compact if same else links


def _pci_facts(device: PciDevice) -> dict[str, Any]:
    facts: dict[str, Any] = {"pci_device_id": HexInt(device.device)}
    if device.numa_node is not None:
        facts["numa_node"] = device.numa_node
    link = {"speed": device.current_link_speed, "max_speed": device.max_link_speed,
            "width": device.current_link_width, "max_width": device.max_link_width}
    if any(v is not None for v in link.values()):
        facts["link"] = {k: v for k, v in link.items() if v is not None}
    if device.pci_path:
        facts["pci_path"] = list(device.pci_path)
    return facts


class GpuReads(Reads):
    """The driver, the GPUs and the NVSwitches, read through `Reads.read`."""

    _nvml_hung: str | None = None  # set by the first NVML call that hangs

    def driver_and_gpus(self) -> tuple[dict[str, Any], list[Any], list[dict[str, Any]]]:
        hw = self.hw
        driver: dict[str, Any] = {}
        try:
            pci = self.read(hw.pci_devices)
        except Exception as exc:  # no way to say "PCI bus unreadable" in a scenario
            self.gaps.append(f"pci_devices: {one_line(exc)}")
            pci = []
        bus_gpus = sorted((d for d in pci if d.is_nvidia_gpu), key=lambda d: d.address)
        switches = [{"address": d.address, **_pci_facts(d)}
                    for d in sorted(pci, key=lambda d: d.address) if d.is_nvswitch]
        try:
            nvml = self.read(hw.nvml)
            driver["nvml"] = "ok"
        except NvmlUnavailable as exc:
            nvml = None
            driver["nvml"] = exc.kind
            if exc.kind not in NVML_KINDS:
                self.gaps.append(f"NVML init failure kind {exc.kind!r} is not a scenario kind: "
                                 "written as init_failed")
                driver["nvml"] = "init_failed"
        except Exception as exc:
            nvml = None
            driver["nvml"] = "init_failed"
            self.gaps.append(f"NVML init: {one_line(exc)} (written as init_failed)")
        if nvml is not None:
            driver["version"] = self._nvml_value(nvml.driver_version)
            driver["cuda_version"] = self._nvml_value(nvml.cuda_driver_version)
        driver["proc_version"] = self.fact("proc_driver_version", hw.proc_driver_version)
        driver = drop_missing(driver)
        answered = self._nvml_gpus(nvml) if nvml is not None else []
        return driver, switches, self._place(answered, bus_gpus, nvml is not None)

    def _nvml_value(self, fn: Callable[[], Any]) -> Any:
        if self._nvml_hung:
            return {"error": f"not read: an earlier NVML call hung ({self._nvml_hung})"}
        try:
            return plain(self.read(fn))
        except NotSupported:
            return "not_supported"
        except Hung as exc:
            self._nvml_hung = str(exc)
            return {"error": str(exc)}
        except Exception as exc:
            return {"error": one_line(exc)}

    def _nvml_gpus(self, nvml: Any) -> list[dict[str, Any]]:
        count = self._nvml_value(nvml.device_count)
        if not isinstance(count, int):
            self.gaps.append(f"NVML device count: {count} (written as no GPUs)")
            return []
        gpus = []
        for index in range(count):
            try:
                handle = self.read(functools.partial(nvml.gpu, index))
            except GpuLost:
                gpus.append({"lost": True})
                continue
            except Exception as exc:  # only GPU_IS_LOST has a scenario spelling
                self.gaps.append(f"NVML GPU {index} handle: {one_line(exc)} (left out)")
                continue
            gpus.append(self._gpu_fields(handle))
        return gpus

    def _gpu_fields(self, handle: GpuHandle) -> dict[str, Any]:
        fields: dict[str, Any] = {}
        for name in GPU_FIELDS:
            if self._nvml_hung:
                fields[name] = {"error": f"not read: an earlier NVML call hung "
                                         f"({self._nvml_hung})"}
                continue
            try:
                value = self.read(functools.partial(handle.query, name))
            except GpuLost:
                # Lost while being read: what the checks see from now on is a lost GPU.
                return {"lost": True, **({"pci_bus_id": fields["pci_bus_id"]}
                                         if isinstance(fields.get("pci_bus_id"), str) else {})}
            except NotSupported:
                fields[name] = "not_supported"
                continue
            except NoPermission:
                fields[name] = "no_permission"  # replays as NVML's NO_PERMISSION
                continue
            except Hung as exc:
                self._nvml_hung = str(exc)
                fields[name] = {"error": str(exc)}
                continue
            except KeyError:
                fields[name] = {"error": f"{name} is not implemented by the {self.hw.name} "
                                         "backend"}
                continue
            except Exception as exc:
                fields[name] = {"error": one_line(exc)}
                continue
            if name == "compute_capability" and isinstance(value, tuple | list):
                value = ".".join(str(v) for v in value)
            elif name == "nvlink" and isinstance(value, list):
                value = _compact_nvlink(plain(value))
            fields[name] = plain(value)
            if name == "clock_event_reasons" and type(fields[name]) is int:
                fields[name] = HexInt(fields[name])
        return fields

    def _place(self, answered: list[dict[str, Any]], bus: list[PciDevice], nvml_ok: bool
               ) -> list[dict[str, Any]]:
        """Join NVML's GPUs (in NVML order) with the bus: each gets its PCI facts; a lost GPU
        takes a bus address no answering GPU claimed, in order (as the checks place it); the
        bus GPUs left over are `nvml_visible: false` (only when NVML answered at all)."""
        by_address = {d.address: d for d in bus}
        claimed = {g["pci_bus_id"] for g in answered if isinstance(g.get("pci_bus_id"), str)}
        unclaimed = [d.address for d in bus if d.address not in claimed]
        entries = []
        for position, gpu in enumerate(answered):
            address = gpu.get("pci_bus_id")
            if not isinstance(address, str):
                if not unclaimed:
                    what = "lost GPU" if gpu.get("lost") else "GPU without a PCI address"
                    self.gaps.append(f"NVML index {position}: {what} with no unclaimed bus "
                                     "address (left out)")
                    continue
                address = unclaimed.pop(0)
                if not gpu.get("lost"):
                    self.gaps.append(f"NVML index {position}: PCI address unreadable "
                                     f"({gpu.get('pci_bus_id')}); placed at {address}")
            elif address not in by_address and bus:
                self.gaps.append(f"NVML GPU {address} is not on the PCI bus listing: the "
                                 "simulation will show it there")
            facts = _pci_facts(by_address[address]) if address in by_address else {}
            entries.append({"pci_bus_id": address, **facts,
                            **{k: v for k, v in gpu.items() if k != "pci_bus_id"}})
        hidden = [{"pci_bus_id": a, **_pci_facts(by_address[a]),
                   **({"nvml_visible": False} if nvml_ok else {})} for a in unclaimed]
        # Keep NVML's order; slot each bus-only GPU in before the first higher address.
        placed: list[dict[str, Any]] = []
        for entry in entries:
            while hidden and hidden[0]["pci_bus_id"] < entry["pci_bus_id"]:
                placed.append(hidden.pop(0))
            placed.append(entry)
        return placed + hidden
