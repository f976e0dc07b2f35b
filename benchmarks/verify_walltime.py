"""Wall time of `python -m checks` at the quick and standard levels on this machine.

Targets: quick <= 5 s, standard <= 60 s. Prints the slowest checks of each run so a regression
points at its cause. Runs the real suite (no --simulate).

    .venv/bin/python benchmarks/verify_walltime.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGETS = {"quick": 5.0, "standard": 60.0}


def timed_run(level: str) -> tuple[float, int, dict]:
    with tempfile.TemporaryDirectory(prefix="nodecert-walltime-") as tmp:
        report = Path(tmp) / "report.json"
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "checks", "--level", level, "--json",
                               str(report), "-q"], cwd=ROOT, check=False)
        wall = time.monotonic() - t0
        doc = json.loads(report.read_text()) if report.exists() else {}
    return wall, proc.returncode, doc


def main() -> int:
    load = os.getloadavg()[0]
    print(f"host: {os.cpu_count()} CPUs, load average {load:.2f} (other work inflates the times)")
    over = False
    for level, target in TARGETS.items():
        wall, code, doc = timed_run(level)
        verdict = "OK" if wall <= target else "OVER"
        over |= wall > target
        print(f"python -m checks --level {level:8}: {wall:6.1f} s (target <= {target:g} s) "
              f"{verdict}; exit {code}, verdict {doc.get('verdict')}")
        slow = sorted(doc.get("checks", []), key=lambda c: -c["duration_s"])[:6]
        for c in slow:
            print(f"    {c['id']:26} {c['status']:5} {c['duration_s']:6.2f} s")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
