"""GPU time of what one device runs, through CUDA events on that device's own stream.

`torch.cuda.Event.record()` without a stream records on the current stream of the *current*
device (device 0 unless changed), while an op on tensors of `cuda:i` runs on device i's current
stream (PyTorch docs, torch.cuda.Event and CUDA semantics). Events recorded that way time an idle
stream: on a multi-GPU node every GPU but the current one reads near zero seconds (absurd TFLOP/s)
and the current one looks like the straggler. Every event timing in measure/ goes through
`span`, which records its events on the timed device's current stream.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

EventPair = tuple[Any, Any]  # (start, end) torch.cuda.Event


@contextmanager
def span(device: torch.device) -> Iterator[EventPair]:
    """Time what the block queues on `device` (ops on its tensors): a start and an end event
    recorded on the device's current stream, the device current while the block queues. The
    pair's end is recorded when the block exits; read it with elapsed_s once it has finished."""
    with torch.cuda.device(device):
        stream = torch.cuda.current_stream(device)
        pair = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        pair[0].record(stream)
        yield pair
        pair[1].record(stream)


def elapsed_s(pairs: Iterable[EventPair], device: torch.device) -> float:
    """Seconds of finished event pairs of `device` (after torch.cuda.synchronize(device), or
    the last end event's synchronize())."""
    with torch.cuda.device(device):
        return sum(float(start.elapsed_time(end)) for start, end in pairs) / 1e3
