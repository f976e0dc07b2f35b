"""A fleet with history for the drift/digest HTML tests and the docs/img screenshot: 8 hosts, six
runs; node0002's GPU5 loses matmul throughput run after run (FAIL), node0006's GPU1 loses memory
bandwidth (WARN), node0004's GPU3 computes another reference digest.

    PYTHONPATH=. python tests/fleet/drift_fleet.py /tmp/fleet.html
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from checks.devtools import synthetic
from checks.devtools.synthetic import Slow
from checks.fleet import drift, history
from checks.report import aggregate

GOOD = "3f6c0a9e51d2b7c4" + "0" * 48
ODD = "a81e44f09b3c2d17" + "0" * 48
MATMUL = [1.06, 1.06, 1.05, 1.06, 1.0, 0.94]   # node0002 GPU5, by run: 11 % below its median last
MEMBW = [1.03, 1.03, 1.04, 1.03, 1.01, 0.97]    # node0006 GPU1: 6 % below


def add_digests(report: dict[str, Any], odd: dict[int, str]) -> None:
    synthetic.add_digests(report, odd, default=GOOD)


def build(base: dict[str, Any], db: Path) -> aggregate.Fleet:
    fleet = None
    with history.History(db) as store:
        for run in range(len(MATMUL)):
            reports = synthetic.build(8, base=base, run_id=f"2026-11-{20 + run:02d}", seed=run, slow=[
                Slow("node0002", "matmul_bf16_tflops", MATMUL[run], gpu=5),
                Slow("node0006", "membw_copy_gbs", MEMBW[run], gpu=1)])
            for r in reports:
                add_digests(r, {3: ODD} if r["host"] == "node0004" and run == len(MATMUL) - 1 else {})
            fleet = aggregate.from_reports(reports, run_id=f"2026-11-{20 + run:02d}")
            fleet.set_drift(drift.find(fleet, store))
            store.record(fleet)
            fleet.lemons = store.lemons()
    assert fleet is not None
    return fleet


if __name__ == "__main__":
    import tempfile

    from checks.render import html

    with tempfile.TemporaryDirectory() as tmp:
        result = build(synthetic.base_report("h100-sxm-8x-healthy"), Path(tmp) / "h.sqlite")
    print(html.write_fleet(result, sys.argv[1]))
