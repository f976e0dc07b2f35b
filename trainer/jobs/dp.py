"""`dp`: nn.DataParallel over every visible GPU equals the same steps on one GPU.

Without two CUDA devices DataParallel is a pass-through (device_ids=[]; forward just calls the
module), so a CPU run would prove nothing: the job reports SKIP, never PASS.

One node (single process; DataParallel needs no launcher):
    python -m trainer dp
Inside a supervised launch (`python -m trainer all`) rank 0 runs it while the others wait.

The job also observes the replicas DataParallel made: a forward hook on the module (replicas
share it) records the device of every forward; each of the GPUs must have run one, so a
DataParallel that quietly ran on one device FAILs even though its numbers equal one GPU's.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from trainer.config import TrainConfig
from trainer.data import TeacherDataset
from trainer.distenv import DistEnv, StepTimer
from trainer.gpumode import REASON, exclusive_process
from trainer.jobs.common import holds
from trainer.models import mlp, params_of, unwrap_names
from trainer.report import SKIP, Comparison, JobReport, compare

NAME = "dp"


class ReplicaProbe:
    """Devices on which the module (or a DataParallel replica of it) ran a forward."""

    def __init__(self, module: nn.Module) -> None:
        self.devices: set[str] = set()
        self._handle = module.register_forward_hook(self._hook)

    def _hook(self, module: nn.Module, inputs: object, output: torch.Tensor) -> None:
        del module, inputs
        self.devices.add(str(output.device))

    def remove(self) -> list[str]:
        self._handle.remove()
        return sorted(self.devices)


def replicas_ran(devices: list[str], count: int) -> Comparison:
    want = [f"cuda:{i}" for i in range(count)]
    return holds(f"DataParallel ran a replica on each of {count} GPUs", sorted(devices) == want,
                 f"forward ran on {', '.join(devices) or 'no device'}, not on each of "
                 f"{', '.join(want)}")


def cuda_devices() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def run(env: DistEnv, cfg: TrainConfig) -> JobReport | None:
    if cuda_devices() < 2 or cfg.device == "cpu":
        return skip_report() if env.rank == 0 else None
    if env.world_size > 1 and exclusive_process():
        # rank 0 would open a context on GPUs the other ranks hold: refused in this mode
        return JobReport(NAME, SKIP, f"DataParallel in rank 0 replicates onto GPUs the other ranks "
                         f"hold, and they are {REASON}: running it would fail for the mode, not "
                         "the hardware") if env.rank == 0 else None
    env.beat(f"{NAME}/single-process")
    report = run_local(cfg) if env.rank == 0 else None
    env.barrier()
    return report


def skip_report() -> JobReport:
    return JobReport(NAME, SKIP, f"needs >= 2 CUDA devices, have {cuda_devices()} "
                     "(DataParallel without them is a pass-through)")


def run_local(cfg: TrainConfig) -> JobReport:
    count = cuda_devices()
    if count < 2 or cfg.device == "cpu":
        return skip_report()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dtype = getattr(torch, cfg.dtype)
    batch = cfg.batch_size * count
    data = TeacherDataset(batch * cfg.steps, (16,), 4, seed=cfg.seed, dtype=dtype)
    torch.manual_seed(cfg.seed)
    dev0 = torch.device("cuda", 0)
    base = mlp(cfg.hidden).to(dev0, dtype)
    reference = copy.deepcopy(base)
    parallel = nn.DataParallel(base)  # scatters each batch over every visible GPU
    probe = ReplicaProbe(base)
    rates = []
    for model in (parallel, reference):
        opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
        timer = StepTimer(cfg.warmup, dev0)
        for step in range(cfg.steps):
            timer.tick()
            x = data.x[step * batch:(step + 1) * batch].to(dev0)
            y = data.y[step * batch:(step + 1) * batch].to(dev0)
            opt.zero_grad(set_to_none=True)
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        timer.stop()
        rates.append(timer.samples_per_s(batch))
        if model is parallel:
            devices = probe.remove()
    rtol, atol = cfg.tolerances()
    comparisons = [compare("parameters vs one GPU", unwrap_names(params_of(parallel)),
                           params_of(reference), rtol, atol), replicas_ran(devices, count)]
    figures = {"dp_samples_per_s": rates[0], "dp_reference_samples_per_s": rates[1],
               "dp_scaling_efficiency": rates[0] / (count * rates[1])}
    return JobReport.judge(NAME, comparisons, f"DataParallel over {count} GPUs equals one GPU",
                           figures=figures, details={"devices": count, "replica_devices": devices,
                                                     "global_batch": batch,
                                                     "tolerances": {"rtol": rtol, "atol": atol}})
