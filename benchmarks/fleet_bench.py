"""Fleet aggregation time for 1 000 hosts x 8 GPUs (goal: <= 2 s for load + validate + compute).

    .venv/bin/python benchmarks/fleet_bench.py [--hosts 1000] [--repeat 3] [--check]

Builds the reports (a real `python -m checks --simulate h100-sxm-8x-healthy` report per host, plus
the workload figures and curves) in a temporary directory, then times checks.report.aggregate.load
and its parts. JSON-schema validation is timed with both validators: jsonschema-rs (used when
installed) and the pure-Python jsonschema (the fallback), the latter on a sample, extrapolated.
--check exits 1 when over the goal (off by default: a shared machine's timings are noisy).

    python benchmarks/fleet_bench.py --scale 1000,10000 [--jobs N] [--compare DIR]

builds each fleet size and aggregates it in a fresh child process, as `python -m checks.fleet
report` does: once in one process, once with the reports read by N processes, this one and
N - 1 forked for the reading (checks.supervise.pool.ordered_map; default: as the fleet CLI
chooses, one per 64 reports up to the usable CPUs). Each run prints its wall s, its own CPU s and
peak RSS, and the forked processes' CPU s and the largest one's peak RSS (getrusage), which
validator and parser it used; run it with the venv
users get (no dev extras), docs/fleet-memory.md says how. The scale goal: 10 000 hosts in <= 5 s
and <= 500 MB. `--compare DIR` aggregates each fleet also with the `checks` package found in DIR
(an earlier version with the reading pool, 09534f4 or later: `git archive REV checks | tar -x -C
DIR`), in one process and with the same pool, printed below. `--report` also times the whole
`python -m checks.fleet report` users run (fleet.json, JUnit, HTML, a fresh history; the terminal
table to /dev/null) with the same processes, for this code and DIR's.
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
from checks.supervise import pool

GOAL_S = 2.0
SCALE_GOAL = (10_000, 5.0, 500.0)  # hosts, wall s, peak RSS MB

_CHILD = """
import functools, json, resource, sys, time
sys.path.insert(0, sys.argv[2])
from checks.report import aggregate, load
jobs = int(sys.argv[3])
w0, c0 = time.perf_counter(), time.process_time()
if jobs == 1:
    fleet = aggregate.load(sys.argv[1])
else:
    from checks.supervise import pool
    fleet = aggregate.load(sys.argv[1], functools.partial(pool.ordered_map, workers=jobs))
wall, cpu = time.perf_counter() - w0, time.process_time() - c0
workers = resource.getrusage(resource.RUSAGE_CHILDREN)
try:
    import jsonschema_rs  # noqa: F401
    validator = "jsonschema-rs"
except ImportError:
    validator = "jsonschema (pure Python)"
parser = "orjson" if getattr(load, "_orjson", None) is not None else "json"
print(json.dumps({"hosts": len(fleet.hosts), "verdict": fleet.verdict, "wall": wall, "cpu": cpu,
                  "workers_cpu": workers.ru_utime + workers.ru_stime,
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "worker_rss_mb": workers.ru_maxrss / 1024,
                  "validator": validator, "parser": parser}))
"""


# --report: the whole command users run, python -m checks.fleet report with its usual outputs
# (fleet.json, JUnit, HTML, a fresh history), the terminal table to /dev/null
_REPORT_CHILD = """
import json, os, resource, sys, tempfile, time
sys.path.insert(0, sys.argv[2])
from checks.fleet.fleet_cli import main
with tempfile.TemporaryDirectory() as out:
    w0 = time.perf_counter()
    with open(os.devnull, "w") as sys.stdout:
        rc = main(["report", sys.argv[1], "--jobs", sys.argv[3], "--json", out + "/fleet.json",
                   "--junit", out + "/junit.xml", "--html", out + "/fleet.html",
                   "--history", out + "/history.sqlite"])
    sys.stdout = sys.__stdout__
    wall = time.perf_counter() - w0
self_, workers = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"rc": rc, "wall": wall, "cpu": self_.ru_utime + self_.ru_stime,
                  "workers_cpu": workers.ru_utime + workers.ru_stime,
                  "rss_mb": self_.ru_maxrss / 1024, "worker_rss_mb": workers.ru_maxrss / 1024}))
"""


def _report_in_child(directory: Path, root: str, jobs: int) -> dict[str, Any]:
    return _in_child(_REPORT_CHILD, directory, root, jobs)


def _aggregate_in_child(directory: Path, root: str, jobs: int = 1) -> dict[str, Any]:
    return _in_child(_CHILD, directory, root, jobs)


def _in_child(code: str, directory: Path, root: str, jobs: int) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", code, str(directory), root, str(jobs)],
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"aggregating with {root} failed: {out.stderr.strip().splitlines()[-1:]}")
    got: dict[str, Any] = json.loads(out.stdout)
    return got


def _line(label: str, got: dict[str, Any], width: int) -> str:
    workers = (f" + {got['workers_cpu']:6.2f}s in workers (largest {got['worker_rss_mb']:4.0f} MB)"
               if got["workers_cpu"] else "")
    return (f"  {label:<{width}} {got['wall']:7.2f}s wall  {got['cpu']:6.2f}s CPU{workers}  "
            f"peak RSS {got['rss_mb']:4.0f} MB")


def run_scale(sizes: list[int], check: bool, compare: str | None = None, jobs: int | None = None,
              report: bool = False) -> int:
    """Each fleet size aggregated in a fresh child process: wall, CPU, peak RSS; in one process,
    and with `jobs` reading processes (checks.supervise.pool; default: as python -m checks.fleet
    report chooses), and with the code in `compare`, side by side. `report`: the whole command
    too (_REPORT_CHILD), with the same processes."""
    root = str(Path(__file__).resolve().parents[1])
    base = synthetic.base_report()
    over = False
    for n in sizes:
        with tempfile.TemporaryDirectory(prefix="fleet-scale-") as tmp:
            directory = synthetic.write(synthetic.iter_build(n, base=base), Path(tmp) / "run")
            workers = jobs or pool.workers_for(n)
            try:
                ours = {"one process": _aggregate_in_child(directory, root)}
                if workers > 1:
                    ours[f"{workers} reading processes"] = _aggregate_in_child(directory, root, workers)
                runs = dict(ours)
                if compare:
                    runs[f"{compare} (one process)"] = _aggregate_in_child(directory, compare)
                    if workers > 1:
                        runs[f"{compare} ({workers} reading processes)"] = _aggregate_in_child(
                            directory, compare, workers)
                commands = {} if not report else {
                    label: _report_in_child(directory, where, workers)
                    for label, where in (("report", root), (f"{compare} report", compare or ""))
                    if where}
            except RuntimeError as exc:
                print(f"error: {n} hosts: {exc}")
                return 1
        first = next(iter(runs.values()))
        print(f"{n} hosts x 8 GPUs ({first['validator']}, {first['parser']}; "
              f"{pool.usable_cpus()} usable CPUs)")
        for label, got in runs.items():
            assert got["hosts"] == n and got["verdict"] == "PASS", got
            print(_line(label, got, max(map(len, runs))), flush=True)
        if commands:
            print(f"  python -m checks.fleet report --json --junit --html, fresh history, --jobs {workers}:")
            for label, got in commands.items():
                print(_line(label, got, max(map(len, runs))) + f"  exit {got['rc']}", flush=True)
        hosts, goal_s, goal_mb = SCALE_GOAL
        best = min(ours.values(), key=lambda got: got["wall"])
        if n == hosts and (best["wall"] > goal_s or best["rss_mb"] > goal_mb):
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
    p.add_argument("--jobs", type=int, metavar="N", help="with --scale: reading processes of the pooled "
                                                         "run (default: as python -m checks.fleet chooses)")
    p.add_argument("--report", action="store_true", help="with --scale: also time the whole python -m "
                                                         "checks.fleet report (JSON, JUnit, HTML, history)")
    args = p.parse_args(argv)
    if args.scale:
        try:
            sizes = [int(n) for n in args.scale.split(",")]
        except ValueError:
            p.exit(2, f"error: --scale takes host counts separated by commas, not {args.scale!r}\n")
        if args.compare and not (Path(args.compare) / "checks" / "report" / "aggregate.py").is_file():
            p.exit(2, f"error: --compare {args.compare}: no checks/report/aggregate.py there\n")
        if args.jobs is not None and args.jobs < 1:
            p.exit(2, f"error: --jobs {args.jobs}: give 1 or more processes\n")
        return run_scale(sizes, args.check, args.compare, args.jobs, args.report)

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
            rows.append(("summary pack (the report's text, LZ4) + figures.extract (what the fleet keeps)",
                         best_of(args.repeat, lambda: [(summary.Compactor().pack(d, b),
                                                        list(figures.extract("h", d))) for d, b in pairs])))
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
