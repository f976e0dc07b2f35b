"""Fleet aggregation time for 1 000 hosts x 8 GPUs (goal: <= 2 s for load + validate + compute).

    .venv/bin/python benchmarks/fleet_bench.py [--hosts 1000] [--repeat 3] [--check]

Builds the reports (a real `python -m checks --simulate h100-sxm-8x-healthy` report per host, plus
the workload figures and curves) in a temporary directory, then times checks.report.aggregate.load
and its parts. JSON-schema validation is timed with both validators: jsonschema-rs (used when
installed) and the pure-Python jsonschema (the fallback), the latter on a sample, extrapolated.
--check exits 1 when over the goal (off by default: a shared machine's timings are noisy).

    python benchmarks/fleet_bench.py --scale 1000,10000

builds each fleet size and aggregates it in a fresh child process, the way `python -m checks.fleet
report` does, printing its wall s, CPU s and peak RSS (the child's own getrusage), which validator
and parser it used; run it with the venv users get (no dev extras), docs/fleet-memory.md says how.
The scale goal: 10 000 hosts in <= 5 s and <= 500 MB. `--compare DIR` aggregates each fleet also
with the `checks` package found in DIR (an earlier version: `git archive REV checks | tar -x -C
DIR`) and prints both side by side with the ratios.
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from checks.devtools import synthetic
from checks.report import aggregate, figures, load, summary

GOAL_S = 2.0
SCALE_GOAL = (10_000, 5.0, 500.0)  # hosts, wall s, peak RSS MB

_CHILD = """
import json, resource, sys, time
sys.path.insert(0, sys.argv[2])
from checks.report import aggregate, load
w0, c0 = time.perf_counter(), time.process_time()
fleet = aggregate.load(sys.argv[1])
wall, cpu = time.perf_counter() - w0, time.process_time() - c0
try:
    import jsonschema_rs  # noqa: F401
    validator = "jsonschema-rs"
except ImportError:
    validator = "jsonschema (pure Python)"
parser = "orjson" if getattr(load, "_orjson", None) is not None else "json"
print(json.dumps({"hosts": len(fleet.hosts), "verdict": fleet.verdict, "wall": wall, "cpu": cpu,
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "validator": validator, "parser": parser}))
"""


def _aggregate_in_child(directory: Path, root: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", _CHILD, str(directory), root],
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"aggregating with {root} failed: {out.stderr.strip().splitlines()[-1:]}")
    got: dict[str, Any] = json.loads(out.stdout)
    return got


def run_scale(sizes: list[int], check: bool, compare: str | None = None) -> int:
    """Each fleet size aggregated in a fresh child process: wall, CPU, peak RSS (and the same with
    the code in `compare`, side by side)."""
    root = str(Path(__file__).resolve().parents[1])
    base = synthetic.base_report()
    over = False
    print(f"{'hosts':>7}  {'wall':>8}  {'cpu':>8}  {'peak RSS':>9}  validator, parser"
          + ("   | compared with " + compare + ": wall, cpu, peak RSS (ratio now/then)" if compare else ""))
    for n in sizes:
        with tempfile.TemporaryDirectory(prefix="fleet-scale-") as tmp:
            directory = synthetic.write(synthetic.iter_build(n, base=base), Path(tmp) / "run")
            try:
                got = _aggregate_in_child(directory, root)
                then = _aggregate_in_child(directory, compare) if compare else None
            except RuntimeError as exc:
                print(f"error: {n} hosts: {exc}")
                return 1
        assert got["hosts"] == n and got["verdict"] == "PASS", got
        line = (f"{n:7d}  {got['wall']:7.2f}s  {got['cpu']:7.2f}s  {got['rss_mb']:6.0f} MB  "
                f"{got['validator']}, {got['parser']}")
        if then is not None:
            line += (f"   | {then['wall']:7.2f}s {then['cpu']:7.2f}s {then['rss_mb']:6.0f} MB  "
                     f"({got['wall'] / then['wall']:.2f}x, {got['cpu'] / then['cpu']:.2f}x, "
                     f"{got['rss_mb'] / then['rss_mb']:.2f}x)")
        print(line, flush=True)
        hosts, goal_s, goal_mb = SCALE_GOAL
        if n == hosts and (got["wall"] > goal_s or got["rss_mb"] > goal_mb):
            over = True
            print(f"  OVER the goal for {hosts} hosts: {goal_s:g} s, {goal_mb:g} MB")
    return 1 if check and over else 0


def best_of(repeat: int, fn: Callable[[], Any]) -> tuple[float, float]:
    """Best wall and CPU seconds of `repeat` runs (garbage of the previous run collected first)."""
    wall, cpu = [], []
    for _ in range(repeat):
        gc.collect()
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
    return min(wall), min(cpu)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hosts", type=int, default=1000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--check", action="store_true", help="exit 1 when over the goal")
    p.add_argument("--scale", metavar="N,N", help="fleet sizes to aggregate in a child process each")
    p.add_argument("--compare", metavar="DIR", help="with --scale: also aggregate with the checks "
                                                    "package in DIR (an earlier version)")
    args = p.parse_args(argv)
    if args.scale:
        try:
            sizes = [int(n) for n in args.scale.split(",")]
        except ValueError:
            p.exit(2, f"error: --scale takes host counts separated by commas, not {args.scale!r}\n")
        if args.compare and not (Path(args.compare) / "checks" / "report" / "aggregate.py").is_file():
            p.exit(2, f"error: --compare {args.compare}: no checks/report/aggregate.py there\n")
        return run_scale(sizes, args.check, args.compare)

    with tempfile.TemporaryDirectory(prefix="fleet-bench-") as tmp:
        t0 = time.perf_counter()
        reports = synthetic.build(args.hosts, base=synthetic.base_report(), slow=[
            synthetic.Slow(synthetic.host_name(7), "matmul_bf16_tflops", 0.8, gpu=3)])
        directory = synthetic.write(reports, Path(tmp) / "run")
        size_mb = sum(p.stat().st_size for p in directory.iterdir()) / 1e6
        print(f"built {args.hosts} host reports x 8 GPUs ({size_mb:.0f} MB) in "
              f"{time.perf_counter() - t0:.1f} s")

        paths = sorted(directory.glob("*.json"))
        blobs = [p.read_bytes() for p in paths]
        with load.gc_paused():
            docs = [json.loads(b) for b in blobs]
        parse = best_of(args.repeat, lambda: [json.loads(b) for b in blobs])
        with load.gc_paused():
            parse_nogc = best_of(args.repeat, lambda: [json.loads(b) for b in blobs])
        rows = [("json.loads, collector on", parse), ("json.loads, collector paused", parse_nogc)]
        with load.gc_paused():
            rows.append(("load.parse_json (orjson fast path, json's hooks)" if load._orjson else
                         "load.parse_json (json with its hooks: orjson not installed)",
                         best_of(args.repeat, lambda: [load.parse_json(b) for b in blobs])))
            pairs = list(zip(docs, blobs, strict=True))
            rows.append(("text_problem (depth, surrogates, on the bytes)",
                         best_of(args.repeat, lambda: [load.text_problem(d, b) for d, b in pairs])))
        try:
            fast = load.validator("rs")
            rows.append(("validate (jsonschema-rs)", best_of(args.repeat, lambda: [fast(d) for d in docs])))
        except ImportError:
            print("jsonschema-rs not installed: validation uses the pure-Python jsonschema")
        slow = load.validator("python")
        sample = docs[:25]
        wall, cpu = best_of(1, lambda: [slow(d) for d in sample])
        scale = len(docs) / len(sample)
        rows.append((f"validate (jsonschema, {len(sample)} extrapolated)", (wall * scale, cpu * scale)))
        with load.gc_paused():
            rows.append(("summary.compact + figures.extract (what the fleet keeps)",
                         best_of(args.repeat, lambda: [(summary.Compactor().compact(d),
                                                        list(figures.extract("h", d))) for d in docs])))
        found = aggregate.read(directory)
        with load.gc_paused():
            rows.append(("compute (medians, stragglers, digests) from summaries",
                         best_of(args.repeat, lambda: aggregate.aggregate(found))))
        total = best_of(args.repeat, lambda: aggregate.load(directory))
        rows.append(("aggregate.load total (load + validate + compute)", total))

        fleet = aggregate.load(directory)
        assert [(s.host, s.gpu.index if s.gpu else None) for s in fleet.stragglers] == [("node0007", 3)]
    width = max(len(name) for name, _ in rows)
    print(f"{'':{width}}  {'wall':>8}  {'cpu':>8}")
    for name, (wall, cpu) in rows:
        print(f"{name:{width}}  {wall:7.3f}s  {cpu:7.3f}s")
    verdict = "within" if total[0] <= GOAL_S else "OVER"
    print(f"fleet aggregation of {args.hosts} hosts: {total[0]:.2f} s wall ({total[1]:.2f} s CPU), "
          f"{verdict} the {GOAL_S:g} s goal")
    return 1 if args.check and total[0] > GOAL_S else 0


if __name__ == "__main__":
    sys.exit(main())
