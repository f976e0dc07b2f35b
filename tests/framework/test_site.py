"""A site's policy over the shipped profiles (checks/site.py): the layering generic -> model ->
site, through `python -m checks --site`/$NODECERT_SITE/the default file; what a site file may not
say, each a one-line usage error; the report records the policy; `python -m checks.site`
validates a file for the role."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from checks import site
from checks.node import node_cli

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = "h100-sxm-8x-healthy"  # aggregate corrected ECC 12 on a GPU: PASS under the shipped 20 M


def _write(tmp_path: Path, text: str, name: str = "site.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _run(tmp_path: Path, *argv: str) -> tuple[int, dict | None]:
    out = tmp_path / "report.json"
    rc = node_cli.main(["--simulate", SCENARIO, "--level", "quick", "-q", "--json", str(out), *argv])
    return rc, json.loads(out.read_text()) if out.exists() else None


def _status(report: dict, check_id: str) -> str:
    return next(c["status"] for c in report["checks"] if c["id"] == check_id)


POLICY = """\
profile:
  ecc: {aggregate_corrected_warn: 10}
models:
  h100-sxm:
    thresholds: {allreduce_busbw_gbs: 440}
    collective: {floor_bytes: 17179869184}
  a100-80gb:
    ecc: {aggregate_corrected_warn: 1}
skip: [bmc-sensors]
"""


def test_a_site_threshold_is_judged_and_recorded(tmp_path):
    rc, report = _run(tmp_path)
    assert rc == 0 and _status(report, "ecc-errors") == "PASS" and "site" not in report["options"]
    policy = _write(tmp_path, POLICY)
    rc, report = _run(tmp_path, "--site", str(policy))
    assert rc == 0 and _status(report, "ecc-errors") == "WARN"
    assert "bmc-sensors" not in {c["id"] for c in report["checks"]}
    recorded = report["options"]["site"]
    assert recorded["file"] == str(policy) and recorded["skip"] == ["bmc-sensors"]
    assert len(recorded["sha256"]) == 64
    # the keys it changed for the model this node is: not a100-80gb's
    assert recorded["changed"] == ["collective.floor_bytes", "ecc.aggregate_corrected_warn",
                                   "thresholds.allreduce_busbw_gbs"]
    import jsonschema

    jsonschema.validate(report, json.loads((ROOT / "checks/schema/report.schema.json").read_text()))


def test_the_environment_names_the_file_and_a_missing_one_is_an_error(tmp_path, monkeypatch, capsys):
    policy = _write(tmp_path, POLICY)
    monkeypatch.setenv(site.ENV, str(policy))
    rc, report = _run(tmp_path)
    assert rc == 0 and report["options"]["site"]["file"] == str(policy)
    monkeypatch.setenv(site.ENV, str(tmp_path / "sitee.yaml"))
    capsys.readouterr()
    assert node_cli.main(["--simulate", SCENARIO, "--level", "quick", "-q", "--no-json"]) == 2
    assert capsys.readouterr().err.strip() == f"error: {site.ENV}={tmp_path / 'sitee.yaml'}: no such file"


def test_the_default_file_is_this_machines_and_not_a_scenarios(tmp_path, monkeypatch):
    default = _write(tmp_path, POLICY, "default-site.yaml")
    monkeypatch.setattr(site, "DEFAULT", str(default))
    monkeypatch.delenv(site.ENV, raising=False)
    assert site.locate(None, simulated=False) == str(default)
    assert site.locate(None, simulated=True) is None
    assert site.locate("given.yaml", simulated=True) == "given.yaml"
    default.unlink()
    assert site.locate(None, simulated=False) is None


@pytest.mark.parametrize("text,message", [
    ("profile:\n  ecc: {aggregate_corected_warn: 10}\n", "unknown key ecc.aggregate_corected_warn"),
    ("profile:\n  ecc: {aggregate_corrected_warn: many}\n", "ecc.aggregate_corrected_warn"),
    ("profile:\n  peaks: {bf16_tflops: 2000}\n", "peaks describe(s) the GPU model"),
    ("models:\n  h100-sxm:\n    match: {pci_device_ids: [1]}\n", "match describe(s) the GPU model"),
    ("models:\n  h100-sxxm: {}\n", "models.h100-sxxm: no such profile"),
    ("thresholds: {allreduce_busbw_gbs: 1}\n", "unknown key thresholds (a site file has"),
    ("models:\n  h100-sxm:\n    thresholds: {allreduce_busbw_gbs: 440}\n", "floor_bytes"),
    ("profile:\n  ecc: {aggregate_corrected_warn: .nan}\n", "not a finite number"),
    ("skip: bmc-sensors\n", "skip must be a list"),
    ("- a\n- b\n", "top level must be a mapping"),
    ("profile: [\n", "cannot parse"),
])
def test_what_a_site_file_may_not_say_is_one_line_and_exit_2(tmp_path, capsys, text, message):
    policy = _write(tmp_path, text)
    rc, report = _run(tmp_path, "--site", str(policy))
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and report is None
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err


def test_a_skip_that_names_no_check_is_refused_with_the_nearest(tmp_path, capsys):
    policy = _write(tmp_path, "skip: [bmc-sensor]\n")
    rc, _ = _run(tmp_path, "--site", str(policy))
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "unknown check id or tag: bmc-sensor" in err and "bmc-sensors" in err


def test_the_validator_the_role_runs(tmp_path):
    good, bad = _write(tmp_path, POLICY, "good.yaml"), _write(tmp_path, "profile: {eccc: {}}\n", "bad.yaml")
    r = subprocess.run([sys.executable, "-m", "checks.site", str(good)], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "models.a100-80gb.ecc.aggregate_corrected_warn" in r.stdout and "skips bmc-sensors" in r.stdout
    r = subprocess.run([sys.executable, "-m", "checks.site", str(bad)], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.startswith("error: ") and "unknown key eccc" in r.stderr
    assert r.stderr.count("\n") == 1


def test_an_unknown_model_takes_the_sites_floors_for_generic(tmp_path):
    """INV003's remedy: a model without a profile is judged by generic; the site gives its own
    floors for it under models.generic, and the report says so."""
    policy = _write(tmp_path, "models:\n  generic:\n    ecc: {aggregate_corrected_warn: 0}\n")
    out = tmp_path / "unknown.json"
    rc = node_cli.main(["--simulate", "unknown-gpu-model", "--level", "quick", "-q", "--json", str(out),
                        "--site", str(policy), "--only", "gpu-profile"])
    report = json.loads(out.read_text())
    assert rc == 0 and report["profile"]["name"] == "generic"
    assert report["options"]["site"]["changed"] == ["ecc.aggregate_corrected_warn"]
    (result,) = report["checks"][0]["results"]
    assert "site.yaml" in result["remedy"] and "checks/profiles" not in result["remedy"]
