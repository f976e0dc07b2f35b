"""Fleet fixtures: real `python -m checks --simulate` reports, multiplied into fleets with the
workload figures added and faults planted (checks.devtools.synthetic)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from checks.devtools import synthetic
from checks.devtools.synthetic import Broken, Slow

SCHEMA_DIR = Path(__file__).resolve().parents[2] / "checks" / "schema"


@pytest.fixture(scope="session")
def h100_report() -> dict[str, Any]:
    return synthetic.base_report("h100-sxm-8x-healthy")


@pytest.fixture(scope="session")
def cpu_report() -> dict[str, Any]:
    return synthetic.base_report("cpu-only-healthy")


@pytest.fixture(scope="session")
def fleet_schema() -> dict[str, Any]:
    return json.loads((SCHEMA_DIR / "fleet.schema.json").read_text())


@dataclass
class PlantedFleet:
    """1 000 hosts x 8 GPUs with known stragglers, failures, unreadable and missing reports."""

    directory: Path
    slow: list[Slow]
    broken: list[Broken]
    unreadable: dict[str, str] = field(default_factory=dict)  # host -> what is wrong
    missing: dict[str, str] = field(default_factory=dict)     # host -> caller's reason
    hosts: list[str] = field(default_factory=list)            # the inventory


SLOW = [
    Slow("node0007", "matmul_bf16_tflops", 0.80, gpu=3),   # 20 % below: FAIL
    Slow("node0123", "membw_copy_gbs", 0.93, gpu=0),           # 7 %: WARN
    Slow("node0500", "allreduce_busbw_gbs", 0.85),         # host-level, 15 %: FAIL
    Slow("node0999", "matmul_bf16_tflops", 0.94, gpu=7),   # 6 %: WARN
    Slow("node0321", "dataloader_max_samples_per_s", 0.70),    # host-level, 30 %: FAIL
]
BROKEN = [
    Broken("node0042", "ecc-errors", gpu=5, message="GPU5: 2 volatile uncorrectable ECC errors"),
    Broken("node0666", "row-remap", gpu=2, message="GPU2: row remapping pending"),
    Broken("node0777", "xid-events", message="XID 79 (GPU fallen off the bus) on 0000:5d:00.0"),
]


@pytest.fixture(scope="session")
def planted(tmp_path_factory: pytest.TempPathFactory, h100_report: dict[str, Any]) -> PlantedFleet:
    directory = tmp_path_factory.mktemp("reports") / "run-1"
    reports = synthetic.build(1000, base=h100_report, slow=SLOW, broken=BROKEN, seed=7)
    synthetic.write(reports, directory)
    (directory / "node1000.json").write_text('{"schema": "nodecert-report", truncated')
    bad = json.loads(json.dumps(reports[0]))
    bad["host"] = "node1001"
    bad["checks"][0]["results"][0]["status"] = "BROKEN"
    (directory / "node1001.json").write_text(json.dumps(bad))
    hosts = [synthetic.host_name(i) for i in range(1004)]
    return PlantedFleet(directory, SLOW, BROKEN,
                        unreadable={"node1000": "not JSON", "node1001": "invalid status"},
                        missing={"node1002": "unreachable", "node1003": "checks crashed: exit 137"},
                        hosts=hosts)


@pytest.fixture(scope="session")
def small_fleet(h100_report: dict[str, Any]) -> list[dict[str, Any]]:
    """24 hosts for the HTML and Prometheus tests: one straggler of each kind, one failure."""
    return synthetic.build(24, base=h100_report, run_id="run-small", slow=[
        Slow("node0007", "matmul_bf16_tflops", 0.8, gpu=3),
        Slow("node0010", "allreduce_busbw_gbs", 0.6),
        Slow("node0003", "membw_copy_gbs", 0.93, gpu=1),
    ], broken=[Broken("node0012", "ecc-errors", gpu=5, message="GPU5: uncorrectable ECC errors")])
