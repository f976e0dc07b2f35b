"""`single`: every device trains alone in fp32 and must land where float64 on the CPU lands.

Each GPU (and the host's CPU) trains the same small MLP from the same initial weights on the same
batches for k steps in fp32; rank 0 trains the same in float64 on the CPU, and every device's
parameters must lie within `tolerance()` of that reference. A device outside it is named (index,
model, PCI address, UUID). On a one-GPU host this is the job that proves the GPU trains.

The tolerance is the fp32 rounding error a healthy device accumulates, from how the arithmetic
works, not from a guess:
    atol = SAFETY x u x S x sqrt(n x k)
u = 2^-24 (fp32 unit roundoff), S = max |parameter| of the reference (the scale of what is
compared), n = the longest sum one step computes (the largest of fan-in, fan-out and batch:
forward, input-gradient and weight-gradient dot products), k = steps. sqrt(n): a dot product of
length n carries an error ~ sqrt(n) u of its terms when rounding errors behave as independent
(Higham & Mary, "A new approach to probabilistic rounding error analysis", SIAM J. Sci. Comput.
2019); sqrt(k): the step errors add up as a random walk. On the CPU (docs/trainer.md) the
measured max |fp32 - float64| / (u S sqrt(n k)) stayed between 0.03 and 0.23 over hidden 16-256,
batch 8-128 and k = 1-80 (3 seeds each); SAFETY = 2.5 leaves 10x over the worst of them for
GPU kernels that sum in another order. TF32 in the matmuls (10-bit mantissa, the `tf32`
negative control) lands 14x outside, one flipped mantissa bit (NODECERT_INJECT corrupt) 1000x.

    python -m trainer single                       # in-process: each GPU in turn, then the CPU
    torchrun --standalone --nproc-per-node=8 -m trainer single
"""

from __future__ import annotations

import copy
import math
import socket
from typing import Any

import torch
from torch import nn

from trainer.config import TrainConfig
from trainer.data import TeacherDataset
from trainer.distenv import DistEnv, StepTimer, cuda_count
from trainer.models import D_IN, D_OUT, mlp, params_of
from trainer.report import FAIL, PASS, Comparison, JobReport, compare

NAME = "single"
U32 = 2.0 ** -24  # fp32 unit roundoff
SAFETY = 2.5  # 10x the worst ratio measured on the CPU (module docstring)
BATCH_FACTOR = 4  # samples per step: 4 x --batch-size, DDP's global batch on 4 ranks
CORRUPT_BIT = 16  # mantissa bit flipped by the injected fault: a ~1% change of one weight


def tolerance(n: int, steps: int, scale: float) -> float:
    """Largest |fp32 - float64| a healthy device may show after `steps` steps (docstring)."""
    return SAFETY * U32 * scale * math.sqrt(n * max(steps, 1))


def longest_sum(hidden: int, batch: int) -> int:
    return max(D_IN, hidden, D_OUT, batch)


def device_identity(device: torch.device) -> dict[str, Any]:
    """What names a device to an operator: index, model, PCI address, UUID (GPUs)."""
    ident: dict[str, Any] = {"device": str(device), "host": socket.gethostname()}
    if device.type != "cuda":
        ident["name"] = "host CPU"
        return ident
    props = torch.cuda.get_device_properties(device)
    ident["name"] = props.name
    uuid = getattr(props, "uuid", None)
    if uuid is not None:
        ident["uuid"] = f"GPU-{uuid}"
    if hasattr(props, "pci_bus_id"):
        ident["pci"] = (f"{getattr(props, 'pci_domain_id', 0):08x}:{props.pci_bus_id:02x}:"
                        f"{getattr(props, 'pci_device_id', 0):02x}.0")
    return ident


def describe(ident: dict[str, Any]) -> str:
    extra = ", ".join(f"{k} {ident[k]}" for k in ("pci", "uuid") if ident.get(k))
    return f"{ident['device']} on {ident['host']} ({ident['name']}{', ' + extra if extra else ''})"


def problem(cfg: TrainConfig) -> tuple[nn.Module, TeacherDataset, int]:
    """The float64 initial model, the dataset (float64) and the per-step batch."""
    batch = BATCH_FACTOR * cfg.batch_size
    data = TeacherDataset(batch * cfg.steps, (D_IN,), D_OUT, seed=cfg.seed, dtype=torch.float64)
    torch.manual_seed(cfg.seed)
    return mlp(cfg.hidden).double(), data, batch


def _tf32(t: torch.Tensor) -> torch.Tensor:
    """Round fp32 to TF32 (10-bit mantissa, nearest) with a straight-through gradient."""
    bits = t.detach().contiguous().view(torch.int32)
    rounded = ((bits + 0x1000) & ~0x1FFF).view(torch.float32)
    return t + (rounded - t).detach()


class _Tf32Linear(nn.Module):
    """Negative control on the CPU: a Linear whose matmul sees TF32-rounded operands, as a GPU
    with TF32 left on computes it."""

    def __init__(self, inner: nn.Linear) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(_tf32(x), _tf32(self.inner.weight), self.inner.bias)


def _with_tf32(model: nn.Module, device: torch.device) -> nn.Module:
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True  # the real thing; restored by train()
        return model
    for name, child in model.named_children():
        if isinstance(child, nn.Linear):
            setattr(model, name, _Tf32Linear(child))
        else:
            _with_tf32(child, device)
    return model


def flip_bit(t: torch.Tensor, bit: int = CORRUPT_BIT) -> None:
    """Silent data corruption, injected: flip one mantissa bit of the largest fp32 element."""
    with torch.no_grad():
        flat = t.view(-1)
        i = int(flat.abs().argmax())
        flat[i:i + 1] = (flat[i:i + 1].view(torch.int32) ^ (1 << bit)).view(torch.float32)


def train(initial: nn.Module, data: TeacherDataset, cfg: TrainConfig, batch: int,
          device: torch.device, dtype: torch.dtype, corrupt: bool = False,
          ) -> tuple[dict[str, torch.Tensor], list[float], float]:
    """k steps of SGD+momentum on `device` in `dtype`: (parameters on the CPU, losses, samples/s)."""
    model = copy.deepcopy(initial).to(device, dtype)
    tf32_was = torch.backends.cuda.matmul.allow_tf32
    if cfg.control("tf32") and dtype == torch.float32:
        model = _with_tf32(model, device)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    timer = StepTimer(cfg.warmup, device)
    losses = []
    try:
        for step in range(cfg.steps):
            timer.tick()
            x = data.x[step * batch:(step + 1) * batch].to(device, dtype)
            y = data.y[step * batch:(step + 1) * batch].to(device, dtype)
            opt.zero_grad(set_to_none=True)
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.detach())
            if corrupt and step == cfg.steps // 2:
                flip_bit(next(model.parameters()).data)
        timer.stop()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32_was
    params = {k.replace(".inner.", "."): v for k, v in params_of(model).items()}
    return params, [float(v) for v in losses], timer.samples_per_s(batch)


def judge(runs: list[dict[str, Any]], expected: dict[str, torch.Tensor], cfg: TrainConfig,
          batch: int) -> JobReport:
    """Every device's run against the float64 reference; FAIL names each device outside."""
    n = longest_sum(cfg.hidden, batch)
    scale = max(float(v.abs().max()) for v in expected.values())
    atol = tolerance(n, cfg.steps, scale)
    comparisons: list[Comparison] = []
    bad: list[str] = []
    for run in runs:
        c = compare(f"{describe(run['identity'])} fp32 vs float64 reference", run["params"],
                    expected, 0.0, atol)
        comparisons.append(c)
        if not c.ok:
            bad.append(f"{describe(run['identity'])}: max abs diff {c.max_abs:.3g} > {atol:.3g}")
    figures = {f"single_{r['identity']['device']}_samples_per_s": r["samples_per_s"] for r in runs}
    figures["single_samples_per_s"] = min(r["samples_per_s"] for r in runs)
    details = {
        "devices": [r["identity"] for r in runs], "dtype": "float32", "reference": "float64 CPU",
        "steps": cfg.steps, "batch": batch,
        "tolerance": {"formula": f"{SAFETY} x 2^-24 x S x sqrt(n x k)", "n": n, "k": cfg.steps,
                      "S": scale, "atol": atol},
        "tolerances": {"rtol": 0.0, "atol": atol},
        "expected": f"every device within {atol:.3g} of float64 (2.5 u S sqrt(n k))",
        "losses": {r["identity"]["device"]: [r["losses"][0], r["losses"][-1]] for r in runs}}
    if bad:
        return JobReport(NAME, FAIL, f"{len(bad)} of {len(runs)} device(s) differ from the float64 "
                         "reference: " + "; ".join(bad), figures=figures, comparisons=comparisons,
                         details=details)
    worst = max(c.max_abs for c in comparisons)
    names = ", ".join(r["identity"]["device"] for r in runs)
    return JobReport(NAME, PASS, f"{names}: fp32 training equals float64 within {atol:.2g} "
                     f"(worst {worst:.2g}) after {cfg.steps} steps", figures=figures,
                     comparisons=comparisons, details=details)


def _devices_of(env: DistEnv) -> list[torch.device]:
    """This rank's share: its GPU when it is the first rank on it, and each node's CPU once."""
    mine = []
    if env.is_cuda and env.local_rank < cuda_count():
        mine.append(env.device)
    if env.local_rank == 0:
        mine.append(torch.device("cpu"))
    return mine


def _run_devices(devices: list[torch.device], cfg: TrainConfig,
                 corrupt: Any = None) -> list[dict[str, Any]]:
    initial, data, batch = problem(cfg)
    runs = []
    for device in devices:
        params, losses, rate = train(initial, data, cfg, batch, device, torch.float32,
                                     corrupt=bool(corrupt and corrupt(device)))
        runs.append({"identity": device_identity(device), "params": params, "losses": losses,
                     "samples_per_s": rate})
    return runs


def _reference(cfg: TrainConfig) -> tuple[dict[str, torch.Tensor], int]:
    initial, data, batch = problem(cfg)
    params, _, _ = train(initial, data, TrainConfig.from_dict({**cfg.to_dict(), "controls": []}),
                         batch, torch.device("cpu"), torch.float64)
    return params, batch


def run(env: DistEnv, cfg: TrainConfig) -> JobReport | None:
    env.beat(f"{NAME}/train")
    runs = _run_devices(_devices_of(env), cfg,
                        lambda d: env.reporter.should_corrupt(f"{NAME}/{d}"))
    env.beat(f"{NAME}/gather")
    gathered = env.gather(runs)
    if gathered is None:
        return None
    env.beat(f"{NAME}/reference")
    expected, batch = _reference(cfg)
    return judge([r for rank_runs in gathered for r in rank_runs], expected, cfg, batch)


def run_local(cfg: TrainConfig, corrupt: Any = None) -> JobReport:
    """In this process: each visible GPU in turn, then the CPU (unless --device cpu)."""
    devices = [] if cfg.device == "cpu" else [torch.device("cuda", i) for i in range(cuda_count())]
    if cfg.device == "cuda" and not devices:
        return JobReport(NAME, "ERROR", "--device cuda: torch sees no CUDA device")
    if devices:
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
    runs = _run_devices([*devices, torch.device("cpu")], cfg, corrupt)
    expected, batch = _reference(cfg)
    return judge(runs, expected, cfg, batch)
