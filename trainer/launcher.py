"""Supervisor side: launch the ranks once for all selected jobs, collect one verdict per job.

Built on checks.supervise.launch (torchrun in its own session, heartbeats, hard timeout, whole-group
SIGKILL, the failing rank named). A crash or hang inside a job fails that job, naming the rank and
the job; the jobs it kept from running are relaunched so one broken job does not hide the others.

NCCL's flight recorder is on for every launch (TORCH_NCCL_TRACE_BUFFER_SIZE, dump on timeout,
dump files and trigger pipes in the launch's workdir). On a hang the supervisor pokes every
rank's pipe before killing the ranks, and the job's FAIL message names the dump files (or the
path they would have had: gloo and CPU-only torch have no NCCL recorder).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from checks.supervise.launch import LaunchOutcome, Prepared, launch, prepare
from trainer.config import TrainConfig
from trainer.gpumode import exclusive_process
from trainer.jobs import ORDER, modules
from trainer.placement import RankPlan, plan_ranks
from trainer.report import FAIL, SKIP, JobReport
from trainer.worker import job_file

TRACE_BUFFER = 2000  # collectives each rank's flight recorder keeps
DUMP_PREFIX = "nccl-trace-rank-"  # + global rank: one dump file per rank
PIPE_PREFIX = "nccl-dump-pipe-"  # + rank + ".pipe": writing to it asks that rank for a dump
DUMP_WAIT_S = 5.0  # how long a hung launch waits for the dumps it asked for


@dataclass
class PreparedSuite:
    """The first launch of run_jobs started ahead (`prepare_jobs`): its launcher imports torch and
    the jobs' modules while the caller runs other checks."""
    jobs: list[str]
    nproc: int
    base: Path
    own: bool  # the base directory was made here: removed at the end
    launch: Prepared

    def close(self) -> None:
        """End it unused: its launcher, and the base directory when it made it."""
        self.launch.close()
        if self.own:
            shutil.rmtree(self.base, ignore_errors=True)


@dataclass
class SuiteOutcome:
    reports: dict[str, JobReport]
    nproc: int
    duration_s: float
    launches: list[LaunchOutcome] = field(default_factory=list)

    @property
    def prepared(self) -> bool:
        """The first launch used a launcher prepared ahead (prepare_jobs)."""
        return bool(self.launches) and self.launches[0].prepared


def cuda_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def skip_reports(plan: RankPlan, cuda_devices: int) -> dict[str, JobReport]:
    """The SKIP verdicts plan_ranks decided without a launch (a one-GPU host)."""
    return {j: JobReport(j, SKIP, why, details={"cuda_devices": cuda_devices})
            for j, why in plan.skips.items()}


def flight_recorder_env(workdir: Path) -> dict[str, str]:
    """NCCL flight recorder settings for one launch (the TORCH_FR_* spellings are newer
    aliases of the same settings)."""
    dump, pipe = str(workdir / DUMP_PREFIX), str(workdir / PIPE_PREFIX)
    return {"TORCH_NCCL_TRACE_BUFFER_SIZE": str(TRACE_BUFFER),
            "TORCH_FR_BUFFER_SIZE": str(TRACE_BUFFER),
            "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
            "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": dump, "TORCH_FR_DUMP_TEMP_FILE": dump,
            "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": pipe}


def dump_files(workdir: str | Path) -> list[Path]:
    return sorted(Path(workdir).glob(f"{DUMP_PREFIX}*"))


def request_dumps(workdir: Path) -> list[Path]:
    """Ask every NCCL rank of a hung launch for its flight-recorder dump (write to its pipe),
    then give them DUMP_WAIT_S to write it. No pipes (gloo, CPU torch): returns at once."""
    pipes = [p for p in workdir.glob(f"{PIPE_PREFIX}*.pipe")
             if stat.S_ISFIFO(p.lstat().st_mode)]
    for pipe in pipes:
        try:
            fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            continue  # no reader: that rank's monitor is gone
        try:
            os.write(fd, b"1")
        finally:
            os.close(fd)
    deadline = time.monotonic() + (DUMP_WAIT_S if pipes else 0)
    while time.monotonic() < deadline and len(dump_files(workdir)) < len(pipes):
        time.sleep(0.2)
    return dump_files(workdir)


def flight_recorder_note(workdir: str | Path) -> str:
    """One clause for a hang message: where the NCCL flight recorder dumps are."""
    found = dump_files(workdir)
    where = str(Path(workdir) / f"{DUMP_PREFIX}<rank>")
    if found:
        return (f"NCCL flight recorder dump: {where} ({len(found)} file(s); read them with "
                "`python -m torch.distributed.flight_recorder.fr_trace`)")
    return f"NCCL flight recorder dump: none written at {where} (no NCCL communicator)"


def _collect(workdir: Path, jobs: list[str]) -> dict[str, JobReport]:
    """Every rank writes the same (broadcast) verdict; on a node of a multi-node launch only the
    local ranks' files are here, so take whichever exists."""
    found: dict[str, JobReport] = {}
    for job in jobs:
        for path in sorted(workdir.glob(job_file(Path(), job, 0).name.replace("-0.json", "-*.json"))):
            try:
                found[job] = JobReport.from_dict(json.loads(path.read_text()))
                break
            except (OSError, ValueError, KeyError):
                continue
    return found


def _failure(job: str, outcome: LaunchOutcome) -> JobReport:
    what = "hung" if outcome.hung else "crashed"
    message = f"job {job} {what}: {outcome.summary}"
    dumps = [str(p) for p in dump_files(outcome.workdir)] if outcome.workdir else []
    if outcome.hung or dumps:
        message += "; " + flight_recorder_note(outcome.workdir)
    return JobReport(job, FAIL, message, details={
        "culprit_ranks": outcome.culprits, "hung": outcome.hung,
        "phases": {r: s.phase for r, s in outcome.ranks.items()},
        "log_tail": outcome.log_tail[-3000:], "workdir": outcome.workdir,
        "flight_recorder": dumps})


def _launch_args(jobs: list[str], cfg: TrainConfig, stall_s: float,
                 pg_timeout_s: float | None) -> list[str]:
    return [*jobs, "--config-json", json.dumps(cfg.to_dict()),
            "--pg-timeout", str(pg_timeout_s or max(stall_s * 2, 60.0))]


def prepare_jobs(jobs: list[str], cfg: TrainConfig, *, nproc: int, stall_s: float = 60.0,
                 pg_timeout_s: float | None = None, workdir: str | Path | None = None,
                 env: dict[str, str] | None = None) -> PreparedSuite:
    """Start the launcher of `run_jobs(jobs, cfg, ..., prepared=<this>)` now (one host): its
    imports overlap whatever the caller does next. Call run_jobs with the same arguments, or
    close() it."""
    cfg.validate()
    order = [j for j in ORDER if j in jobs]
    own = workdir is None
    base = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="nodecert-train-"))
    wd = base / "launch-0"
    try:
        held = prepare("trainer", _launch_args(order, cfg, stall_s, pg_timeout_s), nproc=nproc,
                       env={**flight_recorder_env(wd), **(env or {})}, workdir=wd,
                       preload=modules(order, cfg.compile_backend))
    except BaseException:
        if own:
            shutil.rmtree(base, ignore_errors=True)
        raise
    return PreparedSuite(order, nproc, base, own, held)


def run_jobs(jobs: list[str], cfg: TrainConfig, *, nproc: int | None = None,
             timeout_s: float = 600.0, stall_s: float = 60.0, start_timeout_s: float = 120.0,
             pg_timeout_s: float | None = None, workdir: str | Path | None = None,
             env: dict[str, str] | None = None, nnodes: int = 1, node_rank: int | None = None,
             rdzv_endpoint: str | None = None, rdzv_id: str | None = None,
             local_addr: str | None = None, share_gpu: bool = False,
             prepared: PreparedSuite | None = None) -> SuiteOutcome:
    """Run `jobs` (names from trainer.jobs.ORDER) on `nproc` ranks per node; one report per job.

    `nproc` defaults to trainer.placement.plan_ranks (one rank per GPU, 4 on the CPU; one rank on
    a host with one visible GPU, where the jobs that need 2 GPUs come back SKIP without a launch);
    more ranks than GPUs needs `share_gpu` (ValueError otherwise). Multi-node: give nnodes,
    rdzv_endpoint (HOST:PORT on the first node) and the
    same rdzv_id on every node; each node's call supervises its local ranks (no relaunch
    across nodes). `prepared` (prepare_jobs with the same arguments) is the first launch's
    launcher, started earlier.
    """
    cfg.validate()
    count = cuda_count()
    plan = plan_ranks(list(jobs), nproc, cfg.device, count, share=share_gpu,
                      exclusive=cfg.device != "cpu" and count > 0 and exclusive_process(),
                      nnodes=nnodes)
    nproc = plan.nproc
    skipped = skip_reports(plan, count)
    order = [j for j in ORDER if j in jobs and j not in skipped]
    if not order:  # nothing to launch: every job was decided here
        if prepared is not None:
            prepared.close()
        return SuiteOutcome(reports={j: skipped[j] for j in ORDER if j in skipped}, nproc=nproc,
                            duration_s=0.0)
    if prepared is not None and (prepared.jobs != order or prepared.nproc != nproc
                                 or (workdir is not None and Path(workdir) != prepared.base)):
        prepared.close()
        prepared = None
    if prepared is not None:
        own, base = prepared.own, prepared.base
    else:
        own = workdir is None
        base = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="nodecert-train-"))
    start = time.monotonic()
    reports: dict[str, JobReport] = {}
    launches: list[LaunchOutcome] = []
    try:
        _launch_all(order, cfg, base, reports, launches, nproc=nproc, timeout_s=timeout_s,
                    stall_s=stall_s, start_timeout_s=start_timeout_s, pg_timeout_s=pg_timeout_s,
                    env=env, nnodes=nnodes, node_rank=node_rank, rdzv_endpoint=rdzv_endpoint,
                    rdzv_id=rdzv_id, local_addr=local_addr,
                    prepared=prepared.launch if prepared else None)
    except BaseException:  # SIGINT/SIGTERM (procs.Terminated) or a bug: launch() killed the ranks
        if own:
            shutil.rmtree(base, ignore_errors=True)
        raise
    if own:
        _remove_workdir(base, reports)
    reports.update(skipped)
    return SuiteOutcome(reports={j: reports[j] for j in ORDER if j in reports}, nproc=nproc,
                        duration_s=time.monotonic() - start, launches=launches)


def _remove_workdir(base: Path, reports: dict[str, JobReport]) -> None:
    """A workdir this run made goes at the end; only NCCL flight-recorder dumps, which a FAIL
    names and the log tail cannot replace, keep it (the FAIL message says where)."""
    if any(r.details.get("flight_recorder") for r in reports.values()):
        return
    shutil.rmtree(base, ignore_errors=True)
    for r in reports.values():
        if r.details.get("workdir"):
            r.details["workdir"] = None  # removed; the log tail is in the report


def _launch_all(order: list[str], cfg: TrainConfig, base: Path, reports: dict[str, JobReport],
                launches: list[LaunchOutcome], *, nproc: int, timeout_s: float, stall_s: float,
                start_timeout_s: float, pg_timeout_s: float | None,
                env: dict[str, str] | None, nnodes: int, node_rank: int | None,
                rdzv_endpoint: str | None, rdzv_id: str | None, local_addr: str | None,
                prepared: Prepared | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    remaining = list(order)
    while remaining:
        wd = base / f"launch-{len(launches)}"
        args = _launch_args(remaining, cfg, stall_s, pg_timeout_s)
        outcome = launch("trainer", args, nproc=nproc, timeout_s=max(deadline - time.monotonic(), 1),
                         stall_s=stall_s, start_timeout_s=start_timeout_s,
                         env={**flight_recorder_env(wd), **(env or {})}, workdir=wd,
                         nnodes=nnodes, rdzv_endpoint=rdzv_endpoint, rdzv_id=rdzv_id,
                         node_rank=node_rank, local_addr=local_addr, on_hang=request_dumps,
                         preload=modules(remaining, cfg.compile_backend),
                         prepared=prepared if not launches else None)
        launches.append(outcome)
        reports.update(_collect(wd, remaining))
        remaining = [j for j in remaining if j not in reports]
        if not remaining:
            break
        if outcome.ok:
            for job in remaining:
                reports[job] = JobReport(job, "ERROR", "the ranks finished without reporting "
                                         f"this job ({outcome.summary})")
            break
        # Jobs run in order: the first one without a report is the one that broke, provided a
        # rank got into it (phases are "<job>/<what>"); otherwise the launch itself failed.
        in_job = any("/" in (s.phase or "") for s in outcome.ranks.values())
        if not in_job or nnodes > 1 or time.monotonic() >= deadline:
            for job in remaining:
                reports[job] = _failure(job, outcome)
            break
        reports[remaining[0]] = _failure(remaining[0], outcome)
        remaining = remaining[1:]


def run_ddp_multinode(rdzv_endpoint: str, nnodes: int, node_rank: int, *, nproc: int | None = None,
                      rdzv_id: str = "nodecert-ddp", cfg: TrainConfig | None = None,
                      local_addr: str | None = None, timeout_s: float = 600.0,
                      stall_s: float = 60.0, start_timeout_s: float = 300.0,
                      env: dict[str, str] | None = None) -> JobReport:
    """The `ddp` job across hosts through torchrun's c10d rendezvous. Call it on every node with
    the same endpoint (the first node's cluster address, e.g. "10.0.0.1:29400") and rdzv_id, and
    node_rank 0..nnodes-1; set NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME through `env` if needed."""
    suite = run_jobs(["ddp"], cfg or TrainConfig(), nproc=nproc, timeout_s=timeout_s,
                     stall_s=stall_s, start_timeout_s=start_timeout_s, nnodes=nnodes,
                     node_rank=node_rank, rdzv_endpoint=rdzv_endpoint, rdzv_id=rdzv_id,
                     local_addr=local_addr, env=env)
    return suite.reports["ddp"]
