"""The health-check path against Python's own floor and against importing torch, in one run.

Wall and CPU seconds (median of 5) of:
- `python -c pass`: the interpreter alone, the floor of any Python health check;
- `python -c "import torch"`: what the quick level used to pay before checking anything;
- `python -m checks --level quick --simulate h100-sxm-8x-healthy`: the whole quick level (40
  checks, the worker process, the report) on a shipped healthy 8-GPU scenario;
- `python -m checks --level quick`: the same on this host's real hardware layer.

CPU time is user + system of the command and everything it started (RUSAGE_CHILDREN after it
is reaped). Goal: the quick level in about a second of wall time on an idle node (LBNL NHC's
checks take 0.2-0.5 s), well under `import torch`.

    .venv/bin/python benchmarks/healthcheck_bench.py
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REPEAT = 5
SCENARIO = "h100-sxm-8x-healthy"
COMMANDS = {
    "python -c pass": [sys.executable, "-c", "pass"],
    'python -c "import torch"': [sys.executable, "-c", "import torch"],
    f"checks --level quick --simulate {SCENARIO}":
        [sys.executable, "-m", "checks", "--level", "quick", "--simulate", SCENARIO, "-q"],
    "checks --level quick (this host)": [sys.executable, "-m", "checks", "--level", "quick", "-q"],
}


def measure(argv: list[str], report: Path) -> tuple[float, float, int]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    extra = ["--json", str(report)] if "checks" in argv else []
    proc = subprocess.run([*argv, *extra], cwd=ROOT, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL, check=False)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, proc.returncode


def main() -> int:
    print(f"host: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} "
          f"(other work inflates the times); median of {REPEAT} runs, interleaved")
    walls: dict[str, list[float]] = {name: [] for name in COMMANDS}
    cpus: dict[str, list[float]] = {name: [] for name in COMMANDS}
    codes: dict[str, set[int]] = {name: set() for name in COMMANDS}
    with tempfile.TemporaryDirectory(prefix="nodecert-hcbench-") as tmp:
        for _ in range(REPEAT):  # interleaved, so a burst of load hits every command alike
            for name, argv in COMMANDS.items():
                wall, cpu, code = measure(argv, Path(tmp) / "report.json")
                walls[name].append(wall)
                cpus[name].append(cpu)
                codes[name].add(code)
    floor_wall = statistics.median(walls["python -c pass"])
    floor_cpu = statistics.median(cpus["python -c pass"])
    torch_wall = statistics.median(walls['python -c "import torch"'])
    torch_cpu = statistics.median(cpus['python -c "import torch"'])
    print(f"{'command':52} {'wall s':>7} {'cpu s':>7} {'wall/pass':>9} {'cpu/pass':>8} "
          f"{'wall/torch':>10} {'cpu/torch':>9}  exit")
    for name in COMMANDS:
        wall, cpu = statistics.median(walls[name]), statistics.median(cpus[name])
        print(f"{name:52} {wall:7.2f} {cpu:7.2f} {wall / floor_wall:9.1f} {cpu / floor_cpu:8.1f} "
              f"{wall / torch_wall:10.2f} {cpu / torch_cpu:9.2f}  "
              f"{','.join(map(str, sorted(codes[name])))}")
    quick = f"checks --level quick --simulate {SCENARIO}"
    bad = codes[quick] != {0}
    if bad:
        print(f"the healthy scenario did not pass: exit {codes[quick]}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
