"""Rank side: run the selected jobs one after the other inside one launch of the ranks.

Start-up (import torch, join the group) is paid once for every job. Each job's verdict is computed
on rank 0, broadcast, and written by every rank to `job-<name>-<rank>.json` in the launch's workdir
as soon as the job ends, so jobs that finished keep their results if a later one crashes or hangs.
A job that raises takes its rank down (its peers would block in a collective it never joins); the
supervisor names the rank and the job from the heartbeat phase ("ddp/step-3") and relaunches the
jobs that did not run.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from checks.supervise.rank import Rank, run_rank
from trainer import distenv, jobs, sizes
from trainer.config import TrainConfig


def job_file(workdir: Path, job: str, rank: int) -> Path:
    return workdir / f"job-{job}-{rank}.json"


def _write(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, default=str))
    tmp.replace(path)


def run_all(rank: Rank, names: list[str], cfg: TrainConfig,
            pg_timeout_s: float) -> dict[str, dict[str, Any]]:
    env = distenv.init(rank, cfg.device, pg_timeout_s)
    # auto = large only over NCCL: ranks sharing one GPU over gloo would copy 269 MB of
    # gradients through the host every step
    cfg = cfg.sized(env.is_cuda and env.backend == "nccl")
    results: dict[str, dict[str, Any]] = {}
    for name in names:
        env.beat(f"{name}/start")
        start = time.monotonic()
        before = distenv.live_groups()
        job_cfg = replace(cfg, hidden=sizes.MLP_SMALL_HIDDEN) if name in sizes.ALWAYS_SMALL \
            and cfg.hidden == sizes.MLP_LARGE_HIDDEN else cfg
        fn = jobs.get(name)  # imports the job's modules first: they are frozen with the rest
        # What this rank holds so far (torch, the jobs' modules) leaves the collector's scans:
        # the gc.collect() calls of the jobs scanned it all, 0.5 s each on a 2-core host.
        gc.freeze()
        report = fn(env, job_cfg)
        gc.collect()  # the job's DDP reducers go before its groups (gloo teardown hang)
        env.beat(f"{name}/end")
        groups = distenv.end_job(env, before)
        data = env.broadcast(report.to_dict() if report is not None else None)
        data["details"]["duration_s"] = round(time.monotonic() - start, 3)
        data["details"].setdefault("backend", env.backend)
        data["details"]["world_size"] = env.world_size
        data["details"]["size"] = {"name": cfg.size, "mlp_hidden": job_cfg.hidden}
        data["details"]["device"] = env.placement.describe() if env.placement else str(env.device)
        data["details"]["process_groups"] = groups
        # where NCCL's flight recorder would dump on a timeout (set by the supervisor)
        data["details"]["flight_recorder_prefix"] = os.environ.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
        results[name] = data
        if rank.workdir is not None:
            _write(job_file(rank.workdir, name, env.rank), data)
    env.beat("teardown")
    env.barrier()
    distenv.shutdown()
    return results


def main(names: list[str], cfg: TrainConfig, pg_timeout_s: float) -> tuple[int, dict[str, Any]]:
    """Run as one rank under torchrun. Returns (exit status, {job: report dict})."""
    out: dict[str, Any] = {}

    def body(rank: Rank) -> dict[str, Any]:
        out.update(run_all(rank, names, cfg, pg_timeout_s))
        return {"jobs": sorted(out)}

    code = run_rank(body)
    if code:
        # Peers may be gone: leave now rather than risk a teardown that waits on them.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code, out
