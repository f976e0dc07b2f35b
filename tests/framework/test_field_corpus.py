"""The field corpus: scenarios written from public field reports get the verdict the report implies.

Each `field-*` scenario is a machine someone reported (nvidia-smi output, kernel log, health-check
failure); its description cites the report. Each case states, per check id, the status the
suite must give (every check not named must PASS or SKIP) and, for faults, the PCI address the
result must name. Run through the public entry point (`checks.node.node_cli.main`) and read from the JSON
report. Sources and what each scenario shows: docs/scenarios.md.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from checks.hw.fixture import load_scenario, shipped

# --import-mode=importlib puts no test directory on sys.path (as in tests/e2e/conftest.py).
sys.path.insert(0, str(Path(__file__).resolve().parent))
from scenario_verdict import Case, W, assert_report_consistent, run, verdict_problems

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "scenarios.md"
# A report citation: owner/repo#N, owner/repo PR#N, a file of a repository, or a URL.
SOURCE_RE = re.compile(r"[\w.-]+/[\w.-]+ ?(?:PR ?)?#\d+|[\w.-]+/[\w.-]+ [\w./-]+\.\w+|https?://\S+")


CASES = [
    Case("field-h100-sxm-8x-nccl1264", {"persistence-mode": "WARN"}),
    Case("field-a100-sxm-8x-nccl-tests228"),
    Case("field-v100-sxm2-nvlink-inactive-azhpc73",
         {"nvlink": "FAIL", "gpu-profile": W("WARN", "PASS")},
         {"nvlink": {"0004:00:00.0": "FAIL"}}),
    Case("field-h100-sxm-8x-no-fabricmanager-gpuburn92",
         {"fabric-manager": "FAIL", "gpu-count": "FAIL", "os-supported": "WARN"}),
    Case("field-a100-sxm-8x-fm-mismatch-dstack2348", {"fabric-manager": "FAIL", "gpu-count": "FAIL"}),
    Case("field-l40-fell-off-bus-nvsentinel155",
         {"gpu-count": "FAIL", "xid-events": "FAIL", "gpu-profile": W("WARN", "PASS")},
         {"gpu-count": {"0000:b3:00.0": "FAIL"}, "xid-events": {"0000:b3:00.0": "FAIL"}}),
    Case("field-azure-nd96isr-h100-probe-failed-aicr1858", {"gpu-count": "FAIL"},
         {"gpu-count": {"000a:00:00.0": "FAIL"}}, free=frozenset({"xid-events"})),
    Case("field-azure-nd96isr-h200-azurehpc134"),
    Case("field-azure-nc80adis-h100nvl-azurehpc162"),
    # NVML cannot tell a pair whose bridge links are all down from unbridged cards: the operator
    # states what the SKU has (--expect-nvlink, inventory nodecert_expect_nvlink).
    Case("field-azure-nc80adis-h100nvl-no-nvlink-azhpc443", {"nvlink": "FAIL"},
         {"nvlink": {"0001:00:00.0": "FAIL", "0002:00:00.0": "FAIL"}}, args=("--expect-nvlink", "12")),
    Case("field-azure-nc80adis-h100nvl-no-nvlink-azhpc443", {"nvlink": "SKIP"}),
    Case("field-aws-a10g-err-testinfra3967",
         {"os-supported": "WARN", "gpu-profile": W("WARN", "PASS"), "driver-version": "FAIL",
          "persistence-mode": "WARN", "ecc-errors": "ERROR", "row-remap": "ERROR",
          "pcie-link": "ERROR", "clock-throttle": "ERROR", "gpu-temperature": "ERROR",
          "gpu-power": "ERROR", "mig-mode": "ERROR"}),
    Case("field-hfjobs-h200-1gpu-fabric-802",
         {"fabric-manager": "FAIL", "gpu-count": "FAIL",
          **dict.fromkeys(("xid-events", "nvswitch-sxid", "pcie-aer"), "ERROR")}),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_field_scenario_gets_the_verdict_its_report_implies(case: Case, tmp_path: Path) -> None:
    code, report = run(case.scenario, tmp_path, *case.args)
    assert verdict_problems(report, case) == []
    assert_report_consistent(code, report)


def test_every_field_scenario_has_a_case() -> None:
    field_scenarios = {s for s in shipped() if s.startswith("field-")}
    assert len(field_scenarios) >= 8
    assert field_scenarios == {c.scenario for c in CASES}
    assert len(CASES) == len({c.id for c in CASES})


def test_field_corpus_covers_several_models_healthy_and_faulty() -> None:
    names = set()
    for name in (s for s in shipped() if s.startswith("field-")):
        data = load_scenario(name)
        names.add(str((data.get("gpu_defaults") or {}).get("name") or data["gpus"][0]["name"]))
    assert {"NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA H200",
            "NVIDIA H100 NVL", "Tesla V100-SXM2-32GB", "NVIDIA L40"} <= names
    healthy = [c for c in CASES if not c.expect]
    assert len(healthy) >= 3 and len(CASES) - len(healthy) >= 5


@pytest.mark.parametrize("scenario", [s for s in shipped() if s.startswith(("field-", "node-"))])
def test_field_and_node_scenarios_cite_their_source(scenario: str) -> None:
    description = str(load_scenario(scenario).get("description", ""))
    assert SOURCE_RE.search(description), f"{scenario}: description names no source"
    assert f"`{scenario}`" in DOC.read_text(), f"{scenario} is not listed in docs/scenarios.md"


def test_every_shipped_scenario_cites_a_source() -> None:
    """A scenario is a claim about real hardware (house standard): every shipped one, not only
    the field and node ones, must say where it comes from."""
    missing = [s for s in shipped() if not SOURCE_RE.search(str(load_scenario(s).get("description", "")))]
    assert missing == [], f"shipped scenarios without a source in their description: {missing}"
