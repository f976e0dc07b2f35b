"""The corpus: real kernel-log lines from public sources (checks/kernlog/corpus.yaml), each with
its citation and the verdict the sources support, run through the three kernel-log checks on the
healthy H100 node with the GPUs and NVSwitches moved to the addresses the report names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from checks import profiles
from checks.docgen import kernlog as docgen
from checks.hw.fixture import FixtureBackend, load_scenario
from checks.node import registry, runner
from checks.node.context import Context, Options

CHECKS = ("xid-events", "nvswitch-sxid", "pcie-aer")
ENTRIES: list[dict[str, Any]] = docgen.corpus()["entries"]


def _outcomes(tmp_path: Path, entry: dict[str, Any]) -> dict[str, list[Any]]:
    overrides: dict[int, dict[str, Any]] = {}
    for index, address in (entry.get("gpus") or {}).items():
        overrides.setdefault(int(index), {})["pci_bus_id"] = address
    for index, bridges in (entry.get("paths") or {}).items():
        overrides.setdefault(int(index), {})["pci_path"] = bridges
    data: dict[str, Any] = {"description": f"test: corpus entry from {entry['source']}",
                            "extends": "h100-sxm-8x-healthy",
                            "host": {"kernel_log": entry["lines"]}}
    if overrides:
        data["gpu_overrides"] = overrides
    if "nvswitches" in entry:
        data["nvswitches"] = entry["nvswitches"]
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True))
    hw = FixtureBackend(load_scenario(str(path)))
    outcomes = runner.run(registry.select("quick", ["pci-gpus", *CHECKS]),
                          Context(hw, profiles.load("generic"), Options()))
    return {o.id: list(o.results) for o in outcomes if o.id in CHECKS}


def _worst(results: list[Any]) -> str:
    order = ["ERROR", "FAIL", "WARN", "SKIP", "PASS"]
    return min((r.status for r in results), key=order.index)


@pytest.mark.parametrize("entry", ENTRIES, ids=[f"{i}-{e['source'][:40]}" for i, e in
                                                enumerate(ENTRIES)])
def test_corpus_entry_gets_the_verdict_its_sources_support(tmp_path: Path,
                                                           entry: dict[str, Any]) -> None:
    outcomes = _outcomes(tmp_path, entry)
    got = {check: _worst(results) for check, results in outcomes.items()}
    for check, expected in entry["expect"].items():
        assert got[check] == expected, (entry["source"], check, [
            (r.status, r.message) for r in outcomes[check]])
    for check, devices in (entry.get("devices") or {}).items():
        by_device = {r.device.pci: r.status for r in outcomes[check] if r.device}
        for address, expected in devices.items():
            assert by_device.get(address) == expected, (entry["source"], check, by_device)


def test_every_entry_cites_a_source_and_a_known_generation() -> None:
    for entry in ENTRIES:
        assert entry["source"].strip() and entry["lines"] and entry["expect"], entry
        assert entry["generation"] in docgen.GENERATIONS, entry
        assert set(entry["expect"]) <= set(CHECKS), entry


def test_the_corpus_covers_every_aer_wording_and_each_generation() -> None:
    text = "\n".join(line for e in ENTRIES for line in e["lines"])
    for wording in ("severity=Corrected", "severity=Correctable",
                    "severity=Uncorrected (Non-Fatal)", "severity=Uncorrectable (Non-Fatal)",
                    "severity=Uncorrected (Fatal)", "error received: id=",
                    "error message received from"):
        assert wording in text, wording
    assert {e["generation"] for e in ENTRIES} == set(docgen.GENERATIONS)


@pytest.mark.parametrize("scenario,check,device", [
    ("kernlog-nvswitch-sxid-12028-data-only", "nvswitch-sxid", "0000:84:00.0"),
    ("kernlog-gpu-lost-single-line", "xid-events", "0000:09:00.0")])
def test_shipped_kernel_log_scenarios_fail_through_the_cli(run_cli, scenario: str, check: str,
                                                           device: str) -> None:
    code, report, err = run_cli("--simulate", scenario, "--only", "pci-gpus", "--only", check)
    assert report is not None, err
    (chk,) = [c for c in report["checks"] if c["id"] == check]
    assert code == 1 and chk["status"] == "FAIL"
    assert [r["device"]["pci"] for r in chk["results"] if r["status"] == "FAIL"] == [device]
