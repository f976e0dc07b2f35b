"""GPU firmware: the same VBIOS and InfoROM image on every GPU of one model in the node.

Boards of one node come from one integrator image; a GPU with another VBIOS was swapped (RMA)
or missed a firmware update, and behaves differently (clocks, power limits, fixes). The versions
of every GPU go into the report (each result's details) so the fleet can compare nodes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

from checks.hw.base import GpuLost, HardwareError, NotSupported
from checks.model import Result, Status, error, passed, skip
from checks.node.context import Context
from checks.node.perdevice import REMEDY_LOST
from checks.node.registry import Budget, Cost, check

FIELDS = {"vbios": "vbios_version", "inforom": "inforom_image_version"}
REMEDY = ("flash the odd GPU(s) to the node's firmware with the vendor's tool (nvflash or the "
          "server vendor's firmware bundle), or ask the vendor which version is current; an "
          "RMA replacement often ships with another VBIOS")


def _status(name: str) -> Status:
    value = str(name).upper()
    if value not in ("FAIL", "WARN"):
        raise ValueError(f"firmware mismatch status must be fail or warn, got {name!r}")
    return Status(value)


@check("gpu-firmware", code="GPU051", title="same VBIOS and InfoROM on every GPU of a model",
       needs=("driver-loaded",), scope="gpu", nvml=("vbios_version", "inforom_image_version"),
       budget=Budget(value=5, cost=Cost(cpu=1, gpu=1), source="estimated"))
def gpu_firmware(ctx: Context) -> Iterator[Result]:
    """Per GPU model, the VBIOS (nvmlDeviceGetVbiosVersion) and InfoROM image
    (nvmlDeviceGetInforomImageVersion) the most GPUs carry is the node's; a GPU with another
    one is WARN or FAIL (profile firmware.vbios_mismatch, firmware.inforom_mismatch). Every
    GPU's versions are in its result's details for fleet comparison."""
    statuses = {"vbios": _status(ctx.profile.require("firmware.vbios_mismatch")),
                "inforom": _status(ctx.profile.require("firmware.inforom_mismatch"))}
    gpus = ctx.gpus
    if not gpus:
        yield skip("NVML lists no GPU")
        return
    read: list[tuple[Any, dict[str, str | None]]] = []
    for gpu in gpus:
        if gpu.lost:
            yield error("not read: NVML answers GPU_IS_LOST for this GPU (see gpu-count)",
                        device=gpu.device, remedy=REMEDY_LOST)
            continue
        versions: dict[str, str | None] = {}
        problem = None
        for key, field_name in FIELDS.items():
            try:
                versions[key] = str(gpu.handle.query(field_name)).strip()
            except NotSupported:
                versions[key] = None
            except (GpuLost, HardwareError) as exc:
                problem = f"could not read the {key} version: {exc}"
        if problem:
            yield error(problem, device=gpu.device)
            continue
        read.append((gpu, versions))
    by_model: dict[str, list[tuple[Any, dict[str, str | None]]]] = {}
    for gpu, versions in read:
        by_model.setdefault(gpu.device.name or "unknown model", []).append((gpu, versions))
    for model, members in by_model.items():
        usual = {}
        for key in FIELDS:
            counts = Counter(v[key] for _, v in members if v[key] is not None)
            top = counts.most_common(2)
            # A tie has no "usual" version: every GPU of the model is flagged.
            usual[key] = top[0][0] if top and (len(top) == 1 or top[0][1] > top[1][1]) else None
        for gpu, versions in members:
            details = {"model": model, **versions,
                       "node_usual": {k: usual[k] for k in FIELDS}}
            odd = [k for k in FIELDS if versions[k] is not None and versions[k] != usual[k]]
            shown = ", ".join(f"{k.upper() if k == 'vbios' else 'InfoROM'} {versions[k] or 'n/a'}"
                              for k in FIELDS)
            if all(versions[k] is None for k in FIELDS):
                yield skip("NVML reports neither the VBIOS nor the InfoROM version",
                           device=gpu.device, details=details)
                continue
            if not odd:
                unread = [k for k in FIELDS if versions[k] is None]
                note = f" ({', '.join(unread)} not reported by NVML)" if unread else ""
                yield passed(f"{shown}{note}", value=versions["vbios"], device=gpu.device,
                             details=details)
                continue
            status = max((statuses[k] for k in odd), key=lambda s: s.severity)
            differs = "; ".join(
                f"{'VBIOS' if k == 'vbios' else 'InfoROM'} {versions[k]} where the other "
                f"{model} GPUs have {usual[k]}" if usual[k] else
                f"{'VBIOS' if k == 'vbios' else 'InfoROM'} {versions[k]}: no version is "
                f"shared by most {model} GPUs of this node" for k in odd)
            yield Result(status, differs, value=versions["vbios"], device=gpu.device,
                         expected=", ".join(f"{k} {usual[k]}" for k in odd if usual[k]) or
                         "one version per model", details=details, remedy=REMEDY)
