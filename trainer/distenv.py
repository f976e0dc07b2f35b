"""One rank's view of the process group: identity, device, a control group, heartbeats.

Jobs move their tensors over job-owned groups; results and verdicts travel over `ctl`, a
separate gloo group, so a job's collectives and the reporting never interleave.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from checks.dist.rank import Rank


@dataclass
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: torch.device
    ctl: Any  # ProcessGroup (gloo) for objects and barriers
    reporter: Rank

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    def beat(self, phase: str) -> None:
        """Heartbeat before anything that can block; the phase names the job ("ddp/step-3")."""
        self.reporter.beat(phase)

    def sync(self) -> None:
        if self.is_cuda:
            torch.cuda.synchronize(self.device)

    def gather(self, obj: Any) -> list[Any] | None:
        """Every rank's `obj` on rank 0 (None elsewhere). Tensors must be on the CPU."""
        out: list[Any] | None = [None] * self.world_size if self.rank == 0 else None
        dist.gather_object(obj, out, dst=0, group=self.ctl)
        return out

    def broadcast(self, obj: Any) -> Any:
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.ctl)
        return box[0]

    def barrier(self) -> None:
        dist.barrier(group=self.ctl)


def choose_device(preference: str, local_rank: int) -> torch.device:
    if preference == "cuda" or (preference == "auto" and torch.cuda.is_available()):
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def init(reporter: Rank, device_preference: str = "auto", timeout_s: float = 120.0) -> DistEnv:
    """Join the process group torchrun describes (env://): NCCL on GPUs, gloo on CPU."""
    device = choose_device(device_preference, reporter.local_rank)
    backend = "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
        backend = "nccl"
        # Comparisons assume IEEE fp32: no TF32 in matmuls or convolutions.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cudnn.deterministic = True
    reporter.beat("init_process_group")
    dist.init_process_group(backend, timeout=dt.timedelta(seconds=timeout_s))
    ctl = dist.new_group(backend="gloo", timeout=dt.timedelta(seconds=timeout_s))
    return DistEnv(rank=dist.get_rank(), world_size=dist.get_world_size(),
                   local_rank=reporter.local_rank, backend=backend, device=device, ctl=ctl,
                   reporter=reporter)


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


class StepTimer:
    """Steady-state wall time: from the start of step `warmup` to `stop()`, data loading included,
    device-synchronised at both ends."""

    def __init__(self, warmup: int, device: torch.device) -> None:
        self.warmup, self.device = warmup, device
        self.steps = 0
        self._start: float | None = None
        self.elapsed = 0.0

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def tick(self) -> None:
        """Call at the start of every step."""
        if self.steps == self.warmup:
            self._sync()
            self._start = time.perf_counter()
        self.steps += 1

    def stop(self) -> None:
        if self._start is not None:
            self._sync()
            self.elapsed = time.perf_counter() - self._start

    def samples_per_s(self, batch: int) -> float:
        timed = self.steps - self.warmup
        return batch * timed / self.elapsed if timed > 0 and self.elapsed > 0 else float("nan")


def training_steps(env: DistEnv, loader: Iterable[Any], sampler: Any, timer: StepTimer,
                   steps: int, beats_at: Any, name: str, set_epoch: bool = True) -> Iterator[Any]:
    """Batches for `steps` steps across epochs: `sampler.set_epoch` each epoch (unless a negative
    control turns it off), the timer ticked and a heartbeat sent (when `beats_at(step)`) before
    each step, the timer stopped after the last."""
    step, epoch = 0, 0
    while step < steps:
        if set_epoch:
            sampler.set_epoch(epoch)
        for batch in loader:
            if step == steps:
                break
            timer.tick()
            if beats_at(step):
                env.beat(f"{name}/step-{step}")
            yield batch
            step += 1
        epoch += 1
    timer.stop()
