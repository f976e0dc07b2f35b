"""The acceptance jobs, in the order one launch runs them."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..config import TrainConfig
    from ..distenv import DistEnv
    from ..report import JobReport

JobFn = Callable[["DistEnv", "TrainConfig"], "JobReport | None"]

ORDER = ("single", "localize", "dp", "ddp", "pipeline", "hybrid", "syncbn")


def get(name: str) -> JobFn:
    """The job's `run(env, cfg)`: returns the verdict on rank 0, None on the other ranks."""
    from . import ddp, dp, hybrid, localize, pipeline, single, syncbn

    modules = {"dp": dp, "ddp": ddp, "pipeline": pipeline, "hybrid": hybrid, "syncbn": syncbn,
               "single": single, "localize": localize}
    return modules[name].run
