"""`python -m checks.node.proof_peak OUT.json`: the collectives' peak sweep of `make gpu-proof`.

One rank per usable GPU (NVML's GPUs, narrowed by CUDA_VISIBLE_DEVICES), all-reduce, all-gather,
reduce-scatter, all-to-all and broadcast, from 1 MiB up past where NCCL's NVLS all-reduce peaks
on 8 NVSwitch GPUs (2-8 GiB; nccl-tests#212 in the shared notes): the check's own sweep stops at
the size a profile's floor is published at. The top size is sized from the GPUs' *free* memory,
never their total, by the rule the ranks cut sizes with (busbw.max_verified_bytes: the buffers a
verified op holds plus NCCL's and the allocator's headroom), and the JSON says so (`sized`).

With --simulate SCENARIO (the proof's CPU rehearsal, docs/gpu-proof.md) the GPUs and their free
memory come from the scenario, the ranks are two CPU processes over gloo (the project's CPU
stand-in for NCCL) and the top size is capped at SIMULATED_MAX_BYTES: the same launcher, rank
program and output as on the GPUs, at a size two CPU ranks finish in seconds.

Exit status: 0 every op measured with every element right, 1 a wrong element, a crash, a hang or
an op missing, 2 bad usage. A host where fewer than two GPUs are usable writes `{"skipped": ...}`
and exits 0 (nothing to measure is not a failure of the node; the proof says why).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from checks import cliutil, safeio
from checks.hw.base import Backend, HardwareError, NotSupported

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
MIN_BYTES = 1 << 20
MAX_BYTES = 8 << 30
SIMULATED_MAX_BYTES = 4 << 20
SIMULATED_RANKS = 2
OPS = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"]
SWEEP = {"min_bytes": MIN_BYTES, "factor": 2, "warmup": 5, "iters": 20, "check_iters": 1,
         "check_elems": 1048579}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m checks.node.proof_peak",
                                description="The collectives' peak sweep of make gpu-proof.")
    p.add_argument("out", type=cliutil.output_file, help="JSON file to write")
    p.add_argument("--simulate", metavar="FILE|NAME",
                   help="GPUs from a scenario; two CPU ranks over gloo (the proof's rehearsal)")
    p.add_argument("--timeout", type=cliutil.number(float, above=0), default=90.0, metavar="S",
                   help="hard timeout of the launch in seconds (default 90)")
    return p


def largest_message(free_bytes: Sequence[int], cap: int = MAX_BYTES) -> int:
    """The largest power-of-two message (at most `cap`) every op of the sweep can run and verify
    on the least free GPU (busbw.max_verified_bytes: the buffers each op holds, plus NCCL's and
    the allocator's headroom; the ranks cut by the same rule). 0 when not even MIN_BYTES fits."""
    from checks.hw.measure import busbw

    least = min(free_bytes) if free_bytes else 0
    top = min(busbw.max_verified_bytes(least, op) for op in OPS)
    size = cap
    while size >= MIN_BYTES:
        if size <= top:
            return size
        size //= 2
    return 0


def usable_gpus(hw: Backend) -> list[int]:
    """NVML indices of the GPUs a launch may use here (CUDA_VISIBLE_DEVICES honoured)."""
    from checks.node import workload_plan

    return list(workload_plan.launch_gpus(hw.nvml(), hw.environ().get("CUDA_VISIBLE_DEVICES")))


def free_memory(hw: Backend, gpus: Sequence[int], *, simulated: bool = False) -> list[int]:
    """Free bytes of each GPU, total less used as NVML reports them (v2's `used` leaves the
    driver's reservation out, so this is what an allocation can get, give or take that). A GPU
    whose use NVML does not report raises HardwareError; only a scenario that does not record it
    (most shipped ones predate the field) is taken as idle, and `sized` says so."""
    nvml = hw.nvml()
    free = []
    for index in (i for i in gpus if i >= 0):  # -1: a MIG instance whose GPU NVML cannot name
        gpu = nvml.gpu(index)
        try:
            used = int(gpu.query("memory_used_bytes") or 0)
        except NotSupported:
            if not simulated:
                raise
            used = 0
        free.append(int(gpu.query("memory_total_bytes")) - used)
    return free


def _peaks(ops: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    from checks.hw.measure import busbw

    peaks = {}
    for op, rows in ops.items():
        best = max(rows, key=lambda r: float(r["busbw_gbs"]), default=None)
        if best is not None:
            peaks[op] = {"busbw_gbs": round(busbw.peak_busbw(rows), 3), "at_bytes": int(best["bytes"])}
    return peaks


def measure(hw: Backend, *, simulated: bool, timeout_s: float) -> tuple[dict[str, Any], int]:
    """(what to write, exit code)."""
    from checks.hw.measure import collective_run

    gpus = usable_gpus(hw)
    if len(gpus) < 2:
        return {"skipped": f"{len(gpus)} usable GPU: a collective needs two ranks"}, EXIT_OK
    try:
        free = free_memory(hw, gpus, simulated=simulated)
    except HardwareError as exc:
        return {"error": f"could not read the GPUs' free memory to size the sweep: {exc}"}, EXIT_FAILED
    top = largest_message(free)
    sized = {"gpus": gpus, "free_bytes": free, "max_bytes_for_memory": top}
    if top == 0:
        return {"skipped": f"least free GPU memory {min(free)} B holds no {MIN_BYTES} B message",
                "sized": sized}, EXIT_FAILED
    nproc, backend = len(gpus), "nccl"
    if simulated:
        nproc, backend, top = SIMULATED_RANKS, "gloo", min(top, SIMULATED_MAX_BYTES)
        sized["simulated"] = (f"{SIMULATED_RANKS} CPU ranks over gloo, capped at "
                              f"{SIMULATED_MAX_BYTES} B")
    sweep = {**SWEEP, "max_bytes": top}
    m = collective_run.run(nproc=nproc, sweep=sweep, backend=backend, ops=OPS, timeout_s=timeout_s)
    ops = m.get("ops") or {}
    peaks = _peaks(ops)
    doc = {"sweep": sweep, "ops": OPS, "world_size": nproc, "backend": backend, "sized": sized,
           "ok": bool(m.get("ok")), "summary": m.get("summary"), "errors": m.get("errors") or [],
           "peaks": peaks, "curves": ops, "table": m.get("table", "")}
    wrong = m.get("errors") or any(int(r.get("wrong", 0)) for rows in ops.values() for r in rows)
    ok = m.get("ok") and not wrong and set(peaks) == set(OPS)
    return doc, EXIT_OK if ok else EXIT_FAILED


def main(argv: Sequence[str] | None = None) -> int:
    args = cliutil.parse(build_parser(), argv)
    if isinstance(args, int):
        return args
    from checks.hw.fixture import FixtureBackend, ScenarioError

    try:
        if args.simulate:
            hw: Backend = FixtureBackend.from_file(args.simulate)
        else:
            from checks.hw.linux import LinuxBackend

            hw = LinuxBackend()
        doc, code = measure(hw, simulated=bool(args.simulate), timeout_s=args.timeout)
    except (ScenarioError, HardwareError) as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return EXIT_USAGE
    safeio.write_text(args.out, json.dumps(doc, indent=2) + "\n")
    print(f"collectives-peak: {doc.get('summary') or doc.get('skipped')}", file=sys.stderr)
    return code


if __name__ == "__main__":
    from checks.supervise.procs import exit_on_signals

    exit_on_signals()
    sys.exit(main())
