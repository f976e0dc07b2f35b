"""Supervisor side of the collective check: the rank program under torchrun, results gathered.

Every process of the launch carries NODECERT_WORKDIR=<its own directory>; after the launch any
process still holding it is an orphan, killed and reported (the launcher already kills the
whole group on a hang).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from checks.supervise import launch

RANK_MODULE = "checks.hw.measure.collective_rank"
# Knobs that change how NCCL/gloo behave: passed through to the ranks (the launcher forwards the
# whole environment) and recorded with the result so a report says what the run was under.
DEBUG_ENV_PREFIXES = ("NCCL_", "GLOO_", "TORCH_NCCL_", "TORCH_DISTRIBUTED_DEBUG",
                      "TORCH_CPP_LOG_LEVEL", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")
SWEEP_KEYS = ("min_bytes", "max_bytes", "factor", "warmup", "iters", "check_iters", "check_elems",
              "fsdp_elems", "floor_bytes", "free_bytes")
# The sweep is paced to end this long before the launch's hard timeout (a fraction of it, at
# least DEADLINE_MARGIN_MIN_S): the ranks still tear down NCCL and write their results after it.
DEADLINE_MARGIN_FRACTION = 0.1
DEADLINE_MARGIN_MIN_S = 10.0


def debug_env(environ: Mapping[str, str]) -> dict[str, str]:
    from checks.environment import env_value  # secret-looking names masked, as in the report

    return {k: env_value(k, v) for k, v in sorted(environ.items()) if k.startswith(DEBUG_ENV_PREFIXES)}


def rank_args(sweep: Mapping[str, Any], *, backend: str, pg_timeout_s: float,
              ops: list[str] | None = None, deadline: float | None = None,
              step_max_s: float | None = None) -> list[str]:
    args = [f"--{k.replace('_', '-')}={int(sweep[k])}" for k in SWEEP_KEYS
            if sweep.get(k) is not None]
    args += [f"--backend={backend}", f"--pg-timeout-s={pg_timeout_s:g}"]
    if deadline is not None:
        args.append(f"--deadline={deadline:.3f}")
    if step_max_s is not None:
        args.append(f"--step-max-s={step_max_s:g}")
    if ops:
        args.append(f"--ops={','.join(ops)}")
    return args


def _pythonpath() -> str:
    """The ranks import `checks` whether or not the project is pip-installed."""
    root = str(Path(__file__).resolve().parents[3])
    current = os.environ.get("PYTHONPATH")
    return f"{root}{os.pathsep}{current}" if current else root


def run(*, nproc: int, sweep: Mapping[str, Any], backend: str = "auto", timeout_s: float = 300.0,
        stall_s: float | None = 60.0, start_timeout_s: float = 120.0,
        ops: list[str] | None = None, env: Mapping[str, str] | None = None,
        workdir: str | Path | None = None, keep_workdir: bool = False,
        python: str = sys.executable, nnodes: int = 1, node_rank: int | None = None,
        rdzv_endpoint: str | None = None, rdzv_id: str | None = None,
        local_addr: str | None = None) -> dict[str, Any]:
    """Launch `nproc` ranks (per node), supervise them, and return the measurement (see docs).

    Across hosts: the same call on every node with nnodes, node_rank, the first node's
    rdzv_endpoint (HOST:PORT) and one rdzv_id (torchrun's c10d rendezvous)."""
    own_dir = workdir is None
    work = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="nodecert-collective-"))
    # The sweep stops for time before the launcher kills it: by a deadline inside timeout_s, and
    # before a size that would keep a rank silent for half the stall limit.
    margin = max(DEADLINE_MARGIN_MIN_S, DEADLINE_MARGIN_FRACTION * timeout_s)
    args = rank_args(sweep, backend=backend, pg_timeout_s=timeout_s, ops=ops,
                     deadline=time.time() + max(timeout_s - margin, 0.0),
                     step_max_s=stall_s / 2 if stall_s else None)
    try:
        outcome = launch.launch(RANK_MODULE, args, nproc=nproc, timeout_s=timeout_s,
                                stall_s=stall_s, start_timeout_s=start_timeout_s,
                                env={**(env or {}), "PYTHONPATH": _pythonpath()}, workdir=work,
                                python=python, nnodes=nnodes, node_rank=node_rank,
                                rdzv_endpoint=rdzv_endpoint, rdzv_id=rdzv_id,
                                local_addr=local_addr)
    except BaseException:  # SIGINT/SIGTERM (procs.Terminated): the ranks are dead, no evidence
        if own_dir:
            shutil.rmtree(work, ignore_errors=True)
        raise
    results = outcome.results
    # Rank 0, or on the other nodes of a multi-node launch their first local rank.
    rank0 = results.get(0) or (results[min(results)] if results else {})
    errors = [e for r in sorted(results) for e in results[r].get("errors", [])]
    measurement: dict[str, Any] = {
        "backend": rank0.get("backend", backend), "world_size": rank0.get("world_size", nproc),
        "ok": outcome.ok, "summary": outcome.summary, "culprits": outcome.culprits,
        "hung": outcome.hung, "duration_s": round(outcome.duration_s, 3),
        "returncode": outcome.returncode,
        "leftover_pids": outcome.leftover_pids,
        "orphans_killed": outcome.orphans_killed,
        "ranks": {str(r): {"state": s.state, "phase": s.phase, "exitcode": s.exitcode,
                           "error": s.error, "host": s.host, "seq": s.seq}
                  for r, s in sorted(outcome.ranks.items())},
        "errors": errors, "ops": rank0.get("ops", {}), "table": rank0.get("table", ""),
        "check_iters": rank0.get("check_iters"), "check_elems": rank0.get("check_elems"),
        "exact_ops": rank0.get("exact_ops", []), "exact_skipped": rank0.get("exact_skipped", {}),
        "fsdp_checked": rank0.get("fsdp_checked", {}),
        # how far the sweep went: the least free GPU memory of any rank, the top size asked per
        # op and, for an op that stopped short of it, why
        "free_bytes": rank0.get("free_bytes"), "asked_bytes": rank0.get("asked_bytes", {}),
        "cut": rank0.get("cut", {}),
        "phase_s": rank0.get("phase_s"),
        "command": " ".join(outcome.command), "workdir": str(work),
        "log_tail": "" if outcome.ok else outcome.log_tail,
    }
    if own_dir and outcome.ok and not errors and not keep_workdir:
        shutil.rmtree(work, ignore_errors=True)
        measurement["workdir"] = None
    return measurement
