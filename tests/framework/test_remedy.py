"""The remedy class of every fault code (checks/report/faults.yaml) and the one a report calls for
(checks/report/remedy.py), the table docs/operations.md shows, and the driver's own recovery
action overriding a code's default."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from checks.docgen import faults as gen
from checks.report import remedy
from checks.report.remedy import CLASSES, Remedy, default_remedy, remedy_for

ROOT = Path(__file__).resolve().parents[2]
FIX = "run: python -m checks.docgen.faults --write"


def test_every_fault_code_names_a_remedy_class() -> None:
    faults = gen.load_faults()
    registered = {c.code for c in gen.checks()}
    assert registered <= set(faults)
    for code, entry in faults.items():
        assert entry.get("remedy") in CLASSES, code
        assert default_remedy(code) == entry["remedy"], code
    # every class is used by some code except none needs to be; the table covers each code once
    table = gen.remedy_table(faults, gen.checks())
    for code in registered:
        assert table.count(f"[{code}]") == 1, code


def test_remedy_table_in_operations_doc_is_current() -> None:
    faults, chks = gen.load_faults(), gen.checks()
    assert gen.OPERATIONS.read_text() == gen.operations_text(faults, chks), \
        f"docs/operations.md remedy table: {FIX}"
    assert gen.main(["--check"]) == 0


def test_a_remedy_outside_the_classes_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "faults.yaml"
    bad.write_text('GPU002: {meaning: "m", confirm: ["true"], action: "a", remedy: replace}\n')
    with pytest.raises(gen.FaultsError, match="GPU002: remedy must be one of"):
        gen.load_faults(bad)


def test_could_not_collect_is_recheck_and_unknown_is_none() -> None:
    assert default_remedy("GPU002-E") == "recheck"
    assert default_remedy("XYZ999") == "none"
    assert default_remedy("INV005") == "reprovision"  # driver/library mismatch
    assert default_remedy("BMC001") == "rma"


def _result(status: str, code: str, uuid: str | None = None, **extra: Any) -> dict[str, Any]:
    device = {"index": 0, "uuid": uuid, "serial": f"S-{uuid}"} if uuid else None
    return {"status": status, "message": f"{code} says so", "fault_code": code,
            "device": device, "details": extra.pop("details", {}), **extra}


def _report(*checks: tuple[str, str, list[dict[str, Any]]]) -> dict[str, Any]:
    return {"checks": [{"id": cid, "code": code, "results": results}
                       for cid, code, results in checks]}


def test_a_passing_report_needs_no_remedy() -> None:
    assert remedy_for(_report(("ecc-errors", "GPU002", [_result("PASS", "GPU002", "GPU-a"),
                                                        _result("WARN", "GPU002", "GPU-b")]))) is None
    assert remedy_for({}) is None


def test_strongest_remedy_wins_and_names_its_gpus() -> None:
    report = _report(
        ("ecc-errors", "GPU002", [_result("FAIL", "GPU002", "GPU-a"),
                                  _result("FAIL", "GPU002", "GPU-b")]),
        ("gpu-temperature", "GPU008", [_result("FAIL", "GPU008", "GPU-c")]),
        ("pcie-link", "GPU006", [_result("ERROR", "GPU006-E", "GPU-d")]))
    got = remedy_for(report)
    assert got == Remedy(kind="gpu-reset", fault="GPU002", gpus=("GPU-a", "GPU-b"),
                         serials=("S-GPU-a", "S-GPU-b"), reason=got.reason if got else "")
    assert got is not None and got.reason.startswith("gpu-reset: GPU002 on GPU-a, GPU-b")
    # a reboot covers the reset
    report["checks"].append({"id": "sxid-events", "code": "GPU013",
                             "results": [_result("FAIL", "GPU013")]})
    assert (got := remedy_for(report)) is not None and got.kind == "reboot" and got.gpus == ()


def test_none_wins_over_everything_but_rma() -> None:
    reboot = ("sxid-events", "GPU013", [_result("FAIL", "GPU013")])
    config = ("shm-size", "HOST004", [_result("FAIL", "HOST004")])
    hardware = ("bmc-sensors", "BMC001", [_result("FAIL", "BMC001")])
    assert (r := remedy_for(_report(reboot, config))) is not None and r.kind == "none"
    assert (r := remedy_for(_report(reboot, config, hardware))) is not None and r.kind == "rma"
    assert remedy.strongest(list(CLASSES)) == "rma"
    assert remedy.STRENGTH[-1] == "recheck" and set(remedy.STRENGTH) == set(CLASSES)


@pytest.mark.parametrize(("action", "kind"), [
    ("gpu_reset", "gpu-reset"), ("bus_reset", "gpu-reset"), ("drain_p2p", "gpu-reset"),
    ("drain_and_reset", "gpu-reset"), ("node_reboot", "reboot"), ("system_reboot", "none"),
    ("recover_imex_domain", "none"), ("something_new", "none")])
def test_nvml_recovery_action_overrides_the_default(action: str, kind: str) -> None:
    got = remedy_for(_report(("gpu-recovery-action", "GPU015",
                              [_result("FAIL", "GPU015", "GPU-x", value=action)])))
    assert got is not None and got.kind == kind and got.gpus == ("GPU-x",)


@pytest.mark.parametrize(("code", "name", "kind"), [
    ("1", "Reset Required", "gpu-reset"), ("2", "Node Reboot Required", "reboot"),
    ("3", "Drain P2P", "gpu-reset"), ("4", "Drain and Reset", "gpu-reset"),
    ("7", "System Reboot Required", "none"), ("zz", "garbled", "none")])
def test_xid_154_text_overrides_the_default(code: str, name: str, kind: str) -> None:
    details = {"xid": 154, "recovery_action": {"code": f"0x{code}", "name": name},
               "catalog": {"action": "XID_154"}}
    got = remedy_for(_report(("xid-events", "GPU005",
                              [_result("FAIL", "GPU005", "GPU-y", details=details)])))
    assert got is not None and got.kind == kind, got


@pytest.mark.parametrize(("action", "kind"), [
    ("RESTART_BM", "reboot"), ("RESET_GPU", "gpu-reset"), ("CONTACT_SUPPORT", "rma"),
    ("RESTART_APP", "gpu-reset")])  # RESTART_APP fails only with the driver's RST: Yes
def test_xid_catalog_action_decides_an_xid(action: str, kind: str) -> None:
    details = {"xid": 1, "catalog": {"action": action}, "reset_request": "RST: Yes"}
    got = remedy_for(_report(("xid-events", "GPU005",
                              [_result("FAIL", "GPU005", details=details)])))
    assert got is not None and got.kind == kind


def _simulate(scenario: str) -> dict[str, Any]:
    run = subprocess.run([sys.executable, "-m", "checks", "--simulate", scenario, "--json", "-",
                          "-q"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1, run.stderr
    report: dict[str, Any] = json.loads(run.stdout)
    return report


def test_simulated_reports_get_the_drivers_remedy() -> None:
    got = remedy_for(_simulate("fault-gpu-recovery-action"))
    assert got is not None and got.kind == "gpu-reset" and got.fault == "GPU015"
    assert len(got.gpus) == 1 and got.gpus[0].startswith("GPU-") and got.serials
    # XID 79: NVIDIA's catalog says RESTART_BM; a reset cannot reach a GPU off the bus
    got = remedy_for(_simulate("fault-xid-79"))
    assert got is not None and got.kind == "reboot", got
