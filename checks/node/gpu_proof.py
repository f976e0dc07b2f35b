"""`python -m checks.node.gpu_proof [DIR]` (`make gpu-proof`): run every GPU path of this node once
and write one bundle, DIR/ and DIR.tar.gz, that can become a shipped scenario (docs/gpu-proof.md).

Phases, each timed (wall seconds) and its exit code kept, all in this process (the checks and the
trainer start their own ranks): the recording (`record --redact`), the standard check run with its
JSON report (NVML reads, P2P matrix, collectives sweep, matmul per dtype, HBM bandwidth, occupancy,
the acceptance jobs), the collectives' peak sweep (all-reduce, all-gather, reduce-scatter,
all-to-all and broadcast from 1 MiB to 8 GiB, past where NVLS peaks: `collectives-peak.json`),
every trainer job at `small` and at `large`, and the throughput job. A host without an NVIDIA GPU
(NVML cannot start, or counts none) is one `error:` line and exit 2.
"""

from __future__ import annotations

import argparse
import json
import platform
import socket
import sys
import tarfile
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from checks import cliutil
from checks.hw.base import HardwareError

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
# The proof's goal: at most 8 minutes on any NVIDIA host. Each long phase is bounded by its own cap
# (the check run's planner budget, the launches' hard timeouts); the caps add up to PROOF_TARGET_S
# less a margin for the recording and the bundle, so a node where every phase runs out still ends
# inside the goal, each run-out phase reported as such.
PROOF_TARGET_S = 480
CHECKS_BUDGET_S = 210
PEAK_TIMEOUT_S = 90
TRAINER_TIMEOUT_S = {"trainer-small": 50, "trainer-large": 70, "throughput": 50}
# The peak sweep: the check's own sweep stops at 256 MiB (or the profile's floor_bytes), below
# where NCCL's NVLS all-reduce peaks on 8 NVSwitch GPUs (2-8 GiB; nccl-tests#212 in the shared
# notes: sizes must go past 256 MB); from 1 MiB, as the small sizes are in the report already.
PEAK_SWEEP = {"min_bytes": 1 << 20, "max_bytes": 8 << 30, "factor": 2, "warmup": 5, "iters": 20,
              "check_iters": 1, "check_elems": 1048579}
PEAK_OPS = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m checks.node.gpu_proof",
                                description="Run every GPU path of this node once and write a bundle "
                                            "(docs/gpu-proof.md).")
    p.add_argument("dir", nargs="?", default=None,
                   help="bundle directory (default gpu-proof-HOST-UTCTIME); DIR.tar.gz is written too")
    return p


def nvidia_gpus() -> tuple[int, dict[str, Any]]:
    """(GPU count, driver facts) from NVML; raises HardwareError when NVML cannot start."""
    from checks.hw.nvml import open_nvml

    nvml = open_nvml()
    return nvml.device_count(), {"driver": nvml.driver_version(),
                                 "cuda_driver": nvml.cuda_driver_version()}


def environment(driver: dict[str, Any]) -> dict[str, Any]:
    from checks.hw.torchview import read_torch_build

    torch_version, torch_cuda = read_torch_build()
    return {"host": socket.gethostname(), "python": platform.python_version(),
            "kernel": platform.release(), "torch": torch_version, "torch_cuda": torch_cuda,
            "nvidia_driver": driver.get("driver"), "cuda_driver_version": driver.get("cuda_driver"),
            "recorded_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def collectives_peak(out: Path, gpus: int) -> int:
    """One NCCL rank per GPU through the check's own launcher, every op swept to PEAK_SWEEP's
    top; writes the curves and, per op, the peak busbw and the size it was reached at."""
    from checks.hw.measure import busbw, collective_run

    if gpus < 2:
        (out / "collectives-peak.json").write_text(json.dumps(
            {"skipped": f"{gpus} GPU: a collective needs two ranks"}, indent=2) + "\n")
        return EXIT_OK
    m = collective_run.run(nproc=gpus, sweep=PEAK_SWEEP, backend="nccl", ops=PEAK_OPS,
                           timeout_s=PEAK_TIMEOUT_S)
    ops = m.get("ops") or {}
    peaks = {}
    for op, rows in ops.items():
        best = max(rows, key=lambda r: float(r["busbw_gbs"]), default=None)
        if best is not None:
            peaks[op] = {"busbw_gbs": round(busbw.peak_busbw(rows), 3), "at_bytes": int(best["bytes"])}
    (out / "collectives-peak.json").write_text(json.dumps(
        {"sweep": PEAK_SWEEP, "ops": PEAK_OPS, "world_size": gpus, "ok": bool(m.get("ok")),
         "summary": m.get("summary"), "errors": m.get("errors") or [], "peaks": peaks,
         "curves": ops, "table": m.get("table", "")}, indent=2) + "\n")
    wrong = m.get("errors") or any(int(r.get("wrong", 0)) for rows in ops.values() for r in rows)
    return EXIT_OK if m.get("ok") and not wrong and set(peaks) == set(PEAK_OPS) else EXIT_FAILED


def phases(out: Path, gpus: int = 0) -> list[tuple[str, Callable[[], int]]]:
    """(name, run) of every phase, in order; each run returns its CLI's exit code."""
    from checks.node import node_cli, record
    from trainer import trainer_cli

    def trainer(name: str, argv: list[str]) -> tuple[str, Callable[[], int]]:
        return name, lambda: trainer_cli.main([*argv, "--timeout", str(TRAINER_TIMEOUT_S[name]),
                                               "--json", str(out / f"{name}.json")])

    return [
        ("record", lambda: record.main([str(out / "recording.yaml"), "--redact", "--force"])),
        ("checks", lambda: node_cli.main(["--level", "standard", "--budget", f"{CHECKS_BUDGET_S}s",
                                          "--json", str(out / "report.json")])),
        ("collectives-peak", lambda: collectives_peak(out, gpus)),
        trainer("trainer-small", ["all", "--size", "small"]),
        trainer("trainer-large", ["all", "--size", "large"]),
        trainer("throughput", ["throughput", "--size", "large"]),
    ]


def run_phases(out: Path, todo: list[tuple[str, Callable[[], int]]]) -> list[dict[str, Any]]:
    rows = []
    for name, run in todo:
        t0 = time.monotonic()
        try:
            rc: int | None = run()
            error = None
        except Exception as exc:  # one broken phase is recorded; the others still run
            rc, error = None, f"{type(exc).__name__}: {exc}"
        rows.append({"phase": name, "exit_code": rc, "wall_s": round(time.monotonic() - t0, 2),
                     **({"error": error} if error else {})})
        print(f"gpu-proof: {name}: exit {rc} in {rows[-1]['wall_s']:.1f} s", file=sys.stderr)
    return rows


def write_bundle(out: Path, env: dict[str, Any], rows: list[dict[str, Any]]) -> Path:
    (out / "environment.json").write_text(json.dumps(env, indent=2) + "\n")
    total = round(sum(r["wall_s"] for r in rows), 2)
    (out / "phases.json").write_text(json.dumps({"phases": rows, "total_wall_s": total}, indent=2) + "\n")
    tarball = out.with_name(out.name + ".tar.gz")
    with tarfile.open(tarball, "w:gz") as tar:
        tar.add(out, arcname=out.name)
    return tarball


def main(argv: Sequence[str] | None = None,
         todo: Callable[[Path, int], list[tuple[str, Callable[[], int]]]] = phases) -> int:
    args = cliutil.parse(build_parser(), argv)
    if isinstance(args, int):
        return args
    try:
        count, driver = nvidia_gpus()
    except HardwareError as exc:
        print(f"error: no NVIDIA GPU on this host: {' '.join(str(exc).split())}", file=sys.stderr)
        return EXIT_USAGE
    if count < 1:
        print("error: no NVIDIA GPU on this host: NVML counts 0 devices", file=sys.stderr)
        return EXIT_USAGE
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = Path(args.dir or f"gpu-proof-{socket.gethostname()}-{stamp}")
    try:
        out.mkdir(parents=True, exist_ok=False)
    except OSError as exc:
        print(f"error: cannot create {out}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE
    rows = run_phases(out, todo(out, count))
    tarball = write_bundle(out, environment(driver), rows)
    print(f"gpu-proof: {count} GPU(s), bundle {out} and {tarball}", file=sys.stderr)
    return EXIT_OK if all(r["exit_code"] == 0 for r in rows) else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
