"""Job configuration: one dataclass with defaults, overridable from the command line."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

# Negative controls: deliberate mistakes a job must catch (FAIL its comparison). Used by the tests.
CONTROLS: dict[str, str] = {
    "sum-loss": "ddp: loss reduced with sum instead of mean (gradients off by the batch size)",
    "no-set-epoch": "ddp: DistributedSampler.set_epoch never called (every epoch repeats epoch 0)",
    "pad-indices": "ddp: DistributedSampler(drop_last=False) pads the ranks with repeated samples",
    "no-scale-grads": "pipeline: gradients summed over micro-batches with a mean-reduced loss",
    "static-graph": "hybrid: DDP(static_graph=True) with inferred stage shapes (silently stops syncing)",
    "local-bn": "syncbn: plain per-rank BatchNorm in place of the synchronized one",
    "tf32": "single: matmuls in TF32 (10-bit mantissa) instead of IEEE fp32 (emulated on the CPU)",
    "fsdp-early-optimizer": "fsdp: optimizer built before fully_shard (it keeps the replaced "
                            "parameters; nothing trains)",
    "tp-rank-data": "tp: each tensor-parallel rank reads its own batch instead of its group's",
    "bf16-weights": "bf16: model cast to bfloat16 (no fp32 master weights) instead of autocast",
    "compile-outer": "compile: torch.compile(DDP(model)) (torch 2.13 breaks the graph at DDP's "
                     "forward and runs eager)",
    "accum-no-divide": "accum: micro-batch losses not divided by the accumulation steps",
    "loader-no-sampler": "loader: DataLoader(shuffle=True) without DistributedSampler",
    "ckpt-no-optim": "ckpt: resumed without the optimizer state (momentum restarts at zero)",
    # The feature a job names left out: the numbers may still agree, so the job's own
    # observation of the feature (dtype seen, worker ids, graphs run) must catch it.
    "bf16-no-autocast": "bf16: the forward runs without autocast (plain fp32)",
    "fsdp-no-mp": "fsdp: the mixed-precision run is sharded without its MixedPrecisionPolicy",
    "loader-no-workers": "loader: num_workers=0 (batches built in the training process)",
    "compile-eager": "compile: the compiled model is bypassed and the eager module trains",
    "ddp-fp16-allreduce": "ddp: gradients all-reduced in fp16 (DDP's fp16_compress_hook)",
    "throughput-frozen": "throughput: learning rate 0 (the model cannot learn)",
}
CONTROL_JOB = {"sum-loss": "ddp", "no-set-epoch": "ddp", "pad-indices": "ddp",
               "no-scale-grads": "pipeline", "static-graph": "hybrid", "local-bn": "syncbn",
               "tf32": "single",
               "fsdp-early-optimizer": "fsdp", "tp-rank-data": "tp", "bf16-weights": "bf16",
               "compile-outer": "compile", "accum-no-divide": "accum",
               "loader-no-sampler": "loader", "ckpt-no-optim": "ckpt",
               "bf16-no-autocast": "bf16", "fsdp-no-mp": "fsdp", "loader-no-workers": "loader",
               "compile-eager": "compile", "ddp-fp16-allreduce": "ddp",
               "throughput-frozen": "throughput"}
COMPILE_BACKENDS = ("inductor", "aot_eager")

# Default tolerances per dtype (|actual - expected| <= atol + rtol * |expected|, elementwise).
# fp32: measured differences after 10-20 steps are ~1e-7 (measured on CPU with torch 2.13); float64 ~1e-16.
TOLERANCES = {"float32": (1e-5, 1e-6), "float64": (1e-9, 1e-12)}


@dataclass
class TrainConfig:
    # optimizer steps of the parallel mode and of the reference. 10 since 2026-12-02 (was 20):
    # every negative control still FAILs at 10 (docs/trainer.md) and each step is tens of
    # collectives per rank, which on a small CPU host cost milliseconds each
    steps: int = 10
    batch_size: int = 8             # samples per rank (ddp, syncbn) or per micro-batch (pipeline, hybrid)
    steps_per_epoch: int = 5        # ddp/hybrid: epochs are short so a missing set_epoch shows
    lr: float = 0.05
    momentum: float = 0.9
    hidden: int = 64                # MLP width
    seed: int = 1234
    dtype: str = "float32"          # float32 | float64
    rtol: float | None = None       # default: TOLERANCES[dtype]
    atol: float | None = None
    warmup: int = 3                 # steps left out of the throughput figures
    device: str = "auto"            # auto (cuda when available) | cpu | cuda
    beat_every: int = 10            # heartbeat every step during warm-up, then every Nth step
    controls: list[str] = field(default_factory=list)
    # compile job: inductor (what training runs; on CPU it builds C++, ~20 s per cold launch) or
    # aot_eager (dynamo + AOTAutograd + DDP graph splitting, no code generation)
    compile_backend: str = "inductor"
    # trainer.sizes: auto (large on a GPU, small elsewhere) | small | large
    size: str = "auto"

    def tolerances(self) -> tuple[float, float]:
        rtol, atol = TOLERANCES[self.dtype]
        return (self.rtol if self.rtol is not None else rtol,
                self.atol if self.atol is not None else atol)

    def beats_at(self, step: int) -> bool:
        """Heartbeat on this step? The same steps on every rank, so the supervisor's comparison of
        progress stays fair; a heartbeat costs a file write (~0.1-0.5 ms), too much per step for
        tiny CPU models (the benchmark compares against a loop without any)."""
        return step < self.warmup or step % self.beat_every == 0

    def control(self, name: str) -> bool:
        return name in self.controls

    def validate(self) -> None:
        if min(self.steps, self.batch_size, self.steps_per_epoch, self.beat_every) < 1:
            raise ValueError("steps, batch size, steps per epoch and beat_every must be >= 1")
        if self.dtype not in TOLERANCES:
            raise ValueError(f"dtype must be one of {', '.join(TOLERANCES)}, not {self.dtype!r}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device must be auto, cpu or cuda, not {self.device!r}")
        from trainer.sizes import SIZES

        if self.size not in SIZES:
            raise ValueError(f"size must be one of {', '.join(SIZES)}, not {self.size!r}")
        if self.compile_backend not in COMPILE_BACKENDS:
            raise ValueError(f"compile backend must be one of {', '.join(COMPILE_BACKENDS)}, "
                             f"not {self.compile_backend!r}")
        unknown = [c for c in self.controls if c not in CONTROLS]
        if unknown:
            raise ValueError(f"unknown negative control {', '.join(unknown)} "
                             "(`python -m trainer --help` lists them)")

    def sized(self, is_cuda: bool) -> TrainConfig:
        """This config with `size` resolved for the device, and the MLP width it implies (an
        explicit --hidden other than the small default is kept)."""
        from trainer.sizes import MLP_SMALL_HIDDEN, mlp_hidden, resolve

        size = resolve(self.size, is_cuda)
        hidden = mlp_hidden(size) if self.hidden == MLP_SMALL_HIDDEN else self.hidden
        return replace(self, size=size, hidden=hidden)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})
