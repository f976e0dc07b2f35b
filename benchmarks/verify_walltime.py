"""Wall time of `python -m checks` at the quick and standard levels on this machine.

Targets: quick <= 5 s, standard <= 25 s (issue 24: every acceptance job at the small size, on the
2-core development host). Each level runs RUNS times; prints the median wall time, the CPU
seconds of the whole process tree (user + system), and the slowest checks of the median run so a
regression points at its cause. Runs the real suite (no --simulate).

    .venv/bin/python benchmarks/verify_walltime.py [--runs N]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGETS = {"quick": 5.0, "standard": 25.0}


def timed_run(level: str) -> tuple[float, float, int, dict]:
    """(wall s, CPU s of the run's whole process tree, exit status, report)."""
    with tempfile.TemporaryDirectory(prefix="nodecert-walltime-") as tmp:
        report = Path(tmp) / "report.json"
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "checks", "--level", level, "--json",
                               str(report), "-q"], cwd=ROOT, check=False)
        wall = time.monotonic() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        doc = json.loads(report.read_text()) if report.exists() else {}
    return wall, cpu, proc.returncode, doc


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    runs = p.parse_args().runs
    load = os.getloadavg()[0]
    print(f"host: {os.cpu_count()} CPUs, load average {load:.2f} (other work inflates the times)")
    over = False
    for level, target in TARGETS.items():
        measured = sorted((timed_run(level) for _ in range(runs)), key=lambda m: m[0])
        wall, cpu, code, doc = measured[len(measured) // 2]
        verdict = "OK" if wall <= target else "OVER"
        over |= wall > target
        print(f"python -m checks --level {level:8}: median {wall:6.1f} s of "
              f"{[round(m[0], 1) for m in measured]} (target <= {target:g} s) {verdict}; "
              f"{cpu:.1f} CPU s; exit {code}, verdict {doc.get('verdict')}")
        slow = sorted(doc.get("checks", []), key=lambda c: -c["duration_s"])[:6]
        for c in slow:
            print(f"    {c['id']:26} {c['status']:5} {c['duration_s']:6.2f} s")
        launch = next((r["details"].get("launch") for c in doc.get("checks", [])
                       if c["id"].startswith("train-") for r in c["results"]
                       if (r.get("details") or {}).get("launch")), None)
        if launch:
            jobs = sum(r["details"].get("duration_s") or 0 for c in doc["checks"]
                       if c["id"].startswith("train-") for r in c["results"]
                       if r.get("details") and r["status"] != "SKIP")
            print(f"    acceptance launch {launch['duration_s']:.1f} s (jobs {jobs:.1f} s), "
                  f"prepared at the start of the run: {launch['prepared']}")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
