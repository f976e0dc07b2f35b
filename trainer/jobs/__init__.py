"""The acceptance jobs, in the order one launch runs them."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainer.config import TrainConfig
    from trainer.distenv import DistEnv
    from trainer.report import JobReport

# Jobs of what training runs today (FSDP2, tensor parallel, bf16, compile, ...): imported only when
# selected, each pulls in more of torch.distributed.
MODERN = ("fsdp", "tp", "bf16", "compile", "accum", "loader", "ckpt", "throughput")

JobFn = Callable[["DistEnv", "TrainConfig"], "JobReport | None"]

ORDER = ("single", "localize", "dp", "ddp", "pipeline", "hybrid", "syncbn",
         "fsdp", "tp", "bf16", "compile", "accum", "loader", "ckpt", "throughput")

# What a job imports only when it runs, too heavy to import again in every rank.
# Measured with torch 2.13: the compile job imports about 600 modules on its first compile.
_LAZY = {"compile": ("torch._dynamo", "torch._dynamo.backends.debugging",
                     "torch._dynamo.backends.distributed", "torch._functorch.aot_autograd"),
         "ckpt": ("torch.distributed.checkpoint._fsspec_filesystem",)}
# inductor's compiler (~1 s more of imports), only where the compile job uses it
INDUCTOR = "torch._inductor.compile_fx"


def modules(names: list[str], compile_backend: str = "inductor") -> list[str]:
    """The modules the ranks of a launch running `names` import: what the single-host launcher
    (checks.supervise.forkrun) imports once before it forks them."""
    out = ["trainer.trainer_cli", "trainer.worker"]
    for name in names:
        out += [f"{__name__}.{name}", *_LAZY.get(name, ())]
    if "compile" in names and compile_backend == "inductor":
        out.append(INDUCTOR)
    return out


def get(name: str) -> JobFn:
    """The job's `run(env, cfg)`: returns the verdict on rank 0, None on the other ranks."""
    from trainer.jobs import ddp, dp, hybrid, localize, pipeline, single, syncbn

    modules = {"dp": dp, "ddp": ddp, "pipeline": pipeline, "hybrid": hybrid, "syncbn": syncbn,
               "single": single, "localize": localize}
    if name in MODERN:
        import importlib

        return importlib.import_module(f".{name}", __name__).run  # type: ignore[no-any-return]
    return modules[name].run
