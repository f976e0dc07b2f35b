"""The Makefile entry points a user types, end to end on this machine."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import jsonschema

from checks.report import schema

ROOT = Path(__file__).resolve().parents[2]


def make(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["make", "--no-print-directory", "-C", str(ROOT), *args],
                          capture_output=True, text=True, timeout=timeout, check=False)


def test_make_verify_quick_on_this_host(tmp_path: Path) -> None:
    report = tmp_path / "host.json"
    junit = tmp_path / "junit.xml"
    proc = make("verify", "LEVEL=quick", f"ARGS=--json {report} --junit {junit}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(report.read_text())
    jsonschema.validate(doc, schema())
    assert doc["backend"] == "linux" and doc["verdict"] == "PASS"
    assert junit.read_text().startswith("<?xml")
    assert "os-supported" in proc.stdout


def test_make_provision_without_inventory_says_how(tmp_path: Path) -> None:
    proc = make("provision", f"INVENTORY={tmp_path / 'missing'}")
    assert proc.returncode == 2
    assert "copy inventory.example" in proc.stderr
