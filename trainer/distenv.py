"""One rank's view of the process group: identity, device, a control group, heartbeats.

Jobs move their tensors over job-owned groups; results and verdicts travel over `ctl`, a
separate gloo group, so a job's collectives and the reporting never interleave.

Process-group hygiene: every group gets the launch's timeout (`new_group`), NCCL groups are bound
to the rank's device so communicators start eagerly (a bad GPU or fabric fails at creation, not in
the first collective), and the groups a job created are destroyed when it ends (`end_job`).
"""

from __future__ import annotations

import datetime as dt
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from checks.supervise.rank import Rank
from trainer.placement import Placement, place


@dataclass
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: torch.device
    ctl: Any  # ProcessGroup (gloo) for objects and barriers
    reporter: Rank
    timeout: dt.timedelta = dt.timedelta(seconds=120)
    placement: Placement | None = None

    @property
    def shared(self) -> bool:
        """Several ranks on one GPU (gloo on CUDA tensors)."""
        return self.placement is not None and self.placement.shared

    @property
    def p2p(self) -> bool:
        """Can this backend send/recv tensors on the rank's device (pipeline stages)?"""
        return self.placement is None or self.placement.p2p

    def new_group(self, ranks: list[int] | None = None, backend: str | None = None) -> Any:
        """A job's process group: the launch's timeout, bound to the device under NCCL."""
        backend = backend or self.backend
        bind = self.device if backend == "nccl" else None
        return dist.new_group(ranks, timeout=self.timeout, backend=backend, device_id=bind)

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


def cuda_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def local_world_size(reporter: Rank) -> int:
    """Ranks on this node (torchrun sets LOCAL_WORLD_SIZE; a bare launch is one rank)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", reporter.world_size))


def init(reporter: Rank, device_preference: str = "auto", timeout_s: float = 120.0) -> DistEnv:
    """Join the process group torchrun describes (env://): NCCL with one GPU per rank, gloo on
    the CPU or when ranks share a GPU (trainer.placement)."""
    placement = place(device_preference, reporter.local_rank, local_world_size(reporter),
                      cuda_count())
    device = torch.device(placement.device)
    timeout = dt.timedelta(seconds=timeout_s)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        # Comparisons assume IEEE fp32: no TF32 in matmuls or convolutions.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cudnn.deterministic = True
    reporter.beat("init_process_group")
    # device_id binds the default group to the GPU: NCCL communicators start now (eagerly).
    dist.init_process_group(placement.backend, timeout=timeout,
                            device_id=device if placement.backend == "nccl" else None)
    ctl = dist.new_group(backend="gloo", timeout=timeout)
    return DistEnv(rank=dist.get_rank(), world_size=dist.get_world_size(),
                   local_rank=reporter.local_rank, backend=placement.backend, device=device,
                   ctl=ctl, reporter=reporter, timeout=timeout, placement=placement)


def live_groups() -> dict[str, Any]:
    """Every process group that exists now, by name (the default group included)."""
    if not dist.is_initialized():
        return {}
    return {name: pg for pg, name in list(dist.distributed_c10d._world.pg_names.items())}


def group_timeout_s(group: Any, device: torch.device) -> float | None:
    """The timeout a group's backend runs with (None when the backend does not say)."""
    try:
        backend = group._get_backend(device if device.type == "cuda" else torch.device("cpu"))
        return float(backend.options._timeout.total_seconds())
    except (AttributeError, RuntimeError):
        return None


def end_job(env: DistEnv, before: dict[str, Any]) -> dict[str, Any]:
    """Destroy the groups created since `before` (a `live_groups()` snapshot) and say what they
    were: how many, and the timeout each ran with. Call after the job released its DDP modules
    and optimizers (gloo's teardown can hang on a reducer still alive, see docs/trainer.md)."""
    created = {n: g for n, g in live_groups().items() if n not in before}
    timeouts = [group_timeout_s(g, env.device) for g in created.values()]
    for group in created.values():
        dist.destroy_process_group(group)
    return {"created": len(created), "timeouts_s": sorted({t for t in timeouts if t is not None}),
            "unknown_timeouts": sum(t is None for t in timeouts),
            "job_timeout_s": env.timeout.total_seconds()}


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
