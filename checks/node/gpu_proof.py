"""`python -m checks.node.gpu_proof [DIR]` (`make gpu-proof`): run every GPU path of this node once
and write one bundle, DIR/ and DIR.tar.gz, that can become a shipped scenario (docs/gpu-proof.md).

Every phase is a command of its own, started as a fresh interpreter in a session of its own and
killed as a group (with every process below it, ranks in sessions of their own included) when
its time is up: CUDA cannot be initialised again in a process forked from one that initialised
it, and the check run forks its worker, so this process never imports torch (a test holds it to
that) and no phase inherits another's CUDA state. Phases, in order:

- `record`: `python -m checks record recording.yaml --redact` (NVML, sysfs, kernel log, torch);
- `checks`: `python -m checks --level burn-in --duration 60s --deadline ...`, every check of the
  suite and no budget plan (NVML reads, occupancy, P2P matrix, collectives sweep to the profile's
  floor size, matmul per dtype, HBM bandwidth, DataLoader, every acceptance training job at the
  small size, one minute of burn-in on every GPU);
- `collectives-peak`: `python -m checks.node.proof_peak` (one rank per usable GPU, five ops from
  1 MiB up to 8 GiB or what the GPUs' free memory holds);
- `trainer-large`: `python -m trainer all --size large` (every trainer job at the size real
  training's messages have, the throughput job among them).

The total is a deadline (--deadline; by default the phases' estimates for this many GPUs with a
quarter more, printed first). Each phase's cap is its share of what is left: its estimate, plus
whatever the later phases' estimates leave over, but never less than its proportional share.
The check run and the trainer get their own deadline a margin inside the cap, so they stop what
overruns and still write their report; a phase still running at its cap is killed and reported
`timed_out`; a phase with no time left is reported `not_run`. A phase's exit code is judged by
what its command documents: the trainer's 77 (every job SKIP with its reason, e.g. one GPU)
is not a failure.

--simulate SCENARIO rehearses the whole proof on a host without a GPU: the GPUs come from the
scenario, the check run and the recording read it (`--simulate`), the peak sweep runs two CPU
ranks over gloo, and the trainer runs its CPU path at the small size; the bundle is the same.

A host without an NVIDIA GPU (NVML cannot start, or counts none) is one `error:` line and exit 2,
before anything is written. The bundle directory is created 0700 and never over an existing
path; the tarball is written through checks.safeio (a private temporary renamed into place: a
planted symlink is replaced, never followed) as 0600.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import secrets
import signal
import socket
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from checks import cliutil, profiles, safeio
from checks.hw.base import Backend, HardwareError
from checks.supervise import procs

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
TRAINER_ALL_SKIPPED = 77  # trainer/trainer_cli.py EXIT_SKIP: every job SKIP with its reason
DEADLINE_SLACK = 1.25  # the default deadline: the estimates, with a quarter more
BUNDLE_RESERVE_S = 10.0  # kept back for the bundle at the end
INNER_MARGIN_S = 20.0  # a phase CLI's own deadline sits this far inside its cap: time to report
MIN_PHASE_S = 30.0  # less than this left: the phase is not started
UNWIND_S = 5.0  # a phase asked to stop (SIGTERM) gets this long before the SIGKILL
BURN_IN_S = 60  # the burn-in's minimum worth running (its @check's budget, min_duration_s)
# Phase estimates on a GPU host, seconds (fixed part, per GPU). The check run's comes from the
# checks' declared budgets (checks.node.budget.table), the trainer's from trainer.sizes.estimate; these are
# for the rest, estimated like the table's GPU costs (torch import + CUDA context ~10 s, a
# torchrun launch ~20-30 s: shared/notes/torch-cpu.md), never measured on a GPU yet.
RECORD_S = 30.0
PEAK_S = (40.0, 6.0)  # launch, then 5 ops x 14 sizes, 25 iterations each, per rank
TRAINER_START_S = 60.0  # a launch per job group, torch.compile's first compile
TRAINER_PER_JOB_S = 8.0


@dataclass
class Phase:
    """One command of the proof: `argv(cap)` is what follows `python` (`-m MODULE ...`), given
    the seconds it may run; `output` the bundle file it writes; `ok` the exit codes that prove it."""
    name: str
    estimate_s: float
    argv: Callable[[float], list[str]]
    output: str | None = None
    ok: frozenset[int] = field(default_factory=lambda: frozenset({EXIT_OK}))


def build_parser() -> argparse.ArgumentParser:
    from checks.node.node_cli import parse_duration

    p = argparse.ArgumentParser(prog="python -m checks.node.gpu_proof",
                                description="Run every GPU path of this node once and write a bundle "
                                            "(docs/gpu-proof.md).")
    p.add_argument("dir", nargs="?", default=None,
                   help="bundle directory, which must not exist (default "
                        "gpu-proof-HOST-UTCTIME-RANDOM); DIR.tar.gz is written too")
    p.add_argument("--simulate", metavar="FILE|NAME",
                   help="rehearse the proof on a host without a GPU: the GPUs come from this "
                        "scenario (as python -m checks --simulate), the ranks run on the CPU")
    p.add_argument("--deadline", type=parse_duration, metavar="TIME",
                   help="the whole proof's time, e.g. 9m (default: the phases' estimates for "
                        "this many GPUs, with a quarter more); phases past it are stopped or not "
                        "run, and reported so")
    return p


def backend(simulate: str | None) -> Backend:
    if simulate:
        from checks.hw.fixture import FixtureBackend

        return FixtureBackend.from_file(simulate)
    from checks.hw.linux import LinuxBackend

    return LinuxBackend()


def nvidia_gpus(hw: Backend) -> tuple[int, dict[str, Any]]:
    """(GPU count, driver facts) from NVML; raises HardwareError when NVML cannot start."""
    nvml = hw.nvml()
    count = nvml.device_count()
    facts: dict[str, Any] = {}
    for key, read in (("driver", nvml.driver_version), ("cuda_driver", nvml.cuda_driver_version)):
        try:
            facts[key] = read()
        except HardwareError:
            facts[key] = None
    return count, facts


def environment(driver: dict[str, Any], simulate: str | None) -> dict[str, Any]:
    from checks.hw.torchview import read_torch_build  # the version file: no torch import

    torch_version, torch_cuda = read_torch_build()
    return {"host": socket.gethostname(), "python": platform.python_version(),
            "kernel": platform.release(), "torch": torch_version, "torch_cuda": torch_cuda,
            "nvidia_driver": driver.get("driver"), "cuda_driver_version": driver.get("cuda_driver"),
            "simulated_from": simulate,
            "recorded_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def checks_estimate(gpus: int) -> float:
    """The declared budgets' estimate of every check at burn-in level (burn-in at BURN_IN_S) on
    `gpus` GPUs, shared launches paid once: what a healthy node's check run costs."""
    from checks.node import budget, registry

    table, paid, total = budget.table(), set(), 0.0
    for chk in registry.select("burn-in"):
        entry = table[chk.id]
        total += entry.on(gpus) + (entry.min_duration_s or 0.0)
        if entry.shared and entry.shared not in paid:
            paid.add(entry.shared)
            total += table[budget.SHARED + entry.shared].cost.on(gpus)
    return total


def trainer_estimate(hw: Backend, gpus: int) -> float:
    """Launches and jobs, plus the throughput job's weak-scaling runs at `large` as
    trainer.sizes.estimate prices them from the profile's memory and bf16 peak."""
    from trainer import jobs, sizes

    base = TRAINER_START_S + TRAINER_PER_JOB_S * len(jobs.ORDER)
    try:
        from checks.node.node_cli import choose_profile

        profile = choose_profile(hw, None)
        memory = profile.get("memory_gib")
        peak = profile.get("peaks.bf16_tflops") or profile.get("peaks.fp16_tflops")
        if memory and peak:
            cost = sizes.estimate(float(memory), float(peak), gpus, sizes.LARGE_STEPS_PER_RUN)
            return base + float(cost["job_s"] or 0.0)
    except (HardwareError, profiles.ProfileError, TypeError, ValueError):  # no profile: fixed part only
        pass
    return base


def phases(out: Path, gpus: int, hw: Backend, simulate: str | None) -> list[Phase]:
    sim = ["--simulate", simulate] if simulate else []

    def inner(cap: float) -> str:
        return f"{max(cap - INNER_MARGIN_S, 10.0):.0f}"

    return [
        Phase("record", RECORD_S,
              lambda cap: ["-m", "checks", "record", str(out / "recording.yaml"), "--redact", "--force",
                           *sim], "recording.yaml"),
        Phase("checks", checks_estimate(gpus) + 20.0,
              lambda cap: ["-m", "checks", "--level", "burn-in", "--duration", f"{BURN_IN_S}s",
                           "--deadline", f"{inner(cap)}s", "--json", str(out / "report.json"),
                           *sim], "report.json"),
        Phase("collectives-peak", PEAK_S[0] + PEAK_S[1] * gpus,
              lambda cap: ["-m", "checks.node.proof_peak", str(out / "collectives-peak.json"),
                           "--timeout", inner(cap), *sim], "collectives-peak.json"),
        # A scenario has no trainer of its own: on the CPU the trainer runs its gloo path at the
        # size every tolerance was calibrated at.
        Phase("trainer-large", trainer_estimate(hw, gpus),
              lambda cap: ["-m", "trainer", "all", "--size", "small" if simulate else "large",
                           "--timeout", inner(cap), "--json", str(out / "trainer-large.json")],
              "trainer-large.json", frozenset({EXIT_OK, TRAINER_ALL_SKIPPED})),
    ]


def _stop(proc: subprocess.Popen[Any]) -> str:
    """SIGTERM first (the CLIs unwind: the check run kills its worker, the trainer its ranks),
    then SIGKILL for the group and every process below it."""
    below = procs.descendants(proc.pid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=UNWIND_S)
    left = procs.kill_tree(proc, extra=below)
    return f"still alive after SIGKILL: {left}" if left else "stopped"


def run_phase(phase: Phase, cap_s: float, logs: Path) -> dict[str, Any]:
    """Run one phase under its cap; its output (stdout and stderr) goes to logs/NAME.log."""
    argv = [sys.executable, *phase.argv(cap_s)]
    row: dict[str, Any] = {"phase": phase.name, "command": argv[1:], "estimate_s": round(phase.estimate_s, 1),
                           "cap_s": round(cap_s, 1), "log": f"logs/{phase.name}.log"}
    t0 = time.monotonic()
    with open(logs / f"{phase.name}.log", "xb") as log:
        proc = procs.start(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            rc: int | None = proc.wait(timeout=cap_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            rc, timed_out = None, True
            row["stopped"] = _stop(proc)
        except BaseException:  # SIGINT/SIGTERM to the proof: the phase goes too
            row["stopped"] = _stop(proc)
            raise
        finally:
            procs.kill_tree(proc)  # whatever it left behind
    row.update({"exit_code": rc, "timed_out": timed_out, "wall_s": round(time.monotonic() - t0, 2),
                "ok": rc in phase.ok})
    return row


def cap_for(todo: Sequence[Phase], i: int, left_s: float) -> float:
    """Phase i's seconds out of `left_s`: its estimate plus what the later phases' estimates
    leave over, never less than its proportional share of what is left, and a short phase (the
    recording) at least its estimate up to MIN_PHASE_S, so a tight deadline cuts the long phases
    rather than starving the short ones."""
    later = sum(p.estimate_s for p in todo[i + 1:])
    share = left_s * todo[i].estimate_s / max(sum(p.estimate_s for p in todo[i:]), 1e-9)
    return min(left_s, max(share, left_s - later, min(todo[i].estimate_s, MIN_PHASE_S)))


def run_phases(todo: Sequence[Phase], out: Path, deadline_s: float,
               started: float) -> list[dict[str, Any]]:
    """Each phase in turn under its cap, until `started` + `deadline_s` less the bundle's time."""
    logs = out / "logs"
    logs.mkdir(mode=0o700)
    end = started + deadline_s - BUNDLE_RESERVE_S
    rows: list[dict[str, Any]] = []
    for i, phase in enumerate(todo):
        cap = cap_for(todo, i, end - time.monotonic())
        if cap < MIN_PHASE_S:
            rows.append({"phase": phase.name, "estimate_s": round(phase.estimate_s, 1),
                         "exit_code": None, "ok": False, "wall_s": 0.0,
                         "not_run": f"the proof's deadline ({deadline_s:g} s) left {max(cap, 0):.1f} s"})
            print(f"gpu-proof: {phase.name}: not run, deadline", file=sys.stderr)
            continue
        rows.append(run_phase(phase, cap, logs))
        r = rows[-1]
        how = "timed out" if r["timed_out"] else f"exit {r['exit_code']}"
        print(f"gpu-proof: {phase.name}: {how} in {r['wall_s']:.1f} s (cap {cap:.0f} s)",
              file=sys.stderr)
    return rows


def write_bundle(out: Path, env: dict[str, Any], rows: list[dict[str, Any]], deadline_s: float,
                 wall_s: float) -> Path:
    safeio.write_text(out / "environment.json", json.dumps(env, indent=2) + "\n")
    safeio.write_text(out / "phases.json", json.dumps(
        {"phases": rows, "deadline_s": round(deadline_s, 1), "total_wall_s": round(wall_s, 2)},
        indent=2) + "\n")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(out, arcname=out.name)
    return safeio.write_bytes(out.with_name(out.name + ".tar.gz"), buf.getvalue(), mode=0o600)


def _default_dir() -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return Path(f"gpu-proof-{socket.gethostname()}-{stamp}-{secrets.token_hex(3)}")


def _open_hardware(simulate: str | None) -> tuple[Backend, int, dict[str, Any]] | str:
    """(backend, GPU count, driver facts), or the one-line error."""
    from checks.hw.fixture import ScenarioError

    try:
        hw = backend(simulate)
        count, driver = nvidia_gpus(hw)
    except ScenarioError as exc:
        return f"error: {' '.join(str(exc).split())}"
    except HardwareError as exc:
        return f"error: no NVIDIA GPU on this host: {' '.join(str(exc).split())}"
    if count < 1:
        return "error: no NVIDIA GPU on this host: NVML counts 0 devices"
    return hw, count, driver


def main(argv: Sequence[str] | None = None,
         todo: Callable[[Path, int, Backend, str | None], list[Phase]] = phases) -> int:
    t0 = time.monotonic()
    args = cliutil.parse(build_parser(), argv)
    if isinstance(args, int):
        return args
    opened = _open_hardware(args.simulate)
    if isinstance(opened, str):
        print(opened, file=sys.stderr)
        return EXIT_USAGE
    hw, count, driver = opened
    out = Path(args.dir) if args.dir else _default_dir()
    try:
        out.mkdir(mode=0o700, parents=False, exist_ok=False)  # never over a path, link or not
    except OSError as exc:
        print(f"error: cannot create {out}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE
    plan = todo(out, count, hw, args.simulate)
    deadline = args.deadline or DEADLINE_SLACK * (sum(p.estimate_s for p in plan) + BUNDLE_RESERVE_S)
    print(f"gpu-proof: {count} GPU(s){' (simulated)' if args.simulate else ''}, {len(plan)} "
          f"phases estimated at {sum(p.estimate_s for p in plan):.0f} s, deadline {deadline:.0f} s",
          file=sys.stderr)
    try:
        rows = run_phases(plan, out, deadline, t0)
    except procs.Terminated as exc:
        print(f"gpu-proof: stopped by {exc.name}: the running phase was killed, no bundle written",
              file=sys.stderr)
        return exc.exit_code
    tarball = write_bundle(out, environment(driver, args.simulate), rows, deadline,
                           time.monotonic() - t0)
    proven = all(r["ok"] for r in rows)
    print(f"gpu-proof: {'every phase proved' if proven else 'NOT proven'}: bundle {out} and "
          f"{tarball}", file=sys.stderr)
    return EXIT_OK if proven else EXIT_FAILED


if __name__ == "__main__":
    procs.exit_on_signals()
    sys.exit(main())
