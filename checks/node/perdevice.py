"""Helpers for checks that produce one result per GPU."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from checks.hw.base import GpuLost, HardwareError, NotSupported
from checks.model import Result, error, fail, skip
from checks.node.context import Context, Gpu
from checks.node.remedies import GPU_LOST

REMEDY_LOST = GPU_LOST  # one remedy for a lost GPU, whichever check sees it


def each_gpu(ctx: Context, measure: Callable[[Gpu], Result | list[Result]]) -> Iterator[Result]:
    """Run `measure` on every NVML-visible GPU; a failing query degrades only that GPU's row."""
    gpus = ctx.gpus
    if not gpus:
        yield skip("NVML lists no GPU")
        return
    for gpu in gpus:
        if gpu.lost:
            # NVML refused this GPU's handle: gpu-count fails it by name; every other check
            # could not measure it (ERROR), and never passes it.
            yield error("not measured: NVML answers GPU_IS_LOST for this GPU (see gpu-count)",
                        device=gpu.device, remedy=REMEDY_LOST)
            continue
        try:
            produced = measure(gpu)
        except NotSupported as exc:
            produced = skip(f"not supported on this GPU/driver: {exc}")
        except GpuLost as exc:
            produced = fail(f"GPU lost: {exc}", remedy=REMEDY_LOST)
        except HardwareError as exc:
            produced = error(f"could not measure: {exc}")
        for result in produced if isinstance(produced, list) else [produced]:
            if result.device is None:
                result.device = gpu.device
            yield result
