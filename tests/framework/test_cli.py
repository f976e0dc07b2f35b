"""`python -m checks` through main(argv): options, exit codes, one-line errors, outputs."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from checks.node import node_cli as cli


def test_help_documents_every_option(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"]) == 0
    text = capsys.readouterr().out
    for option in ("--level", "--only", "--skip", "--json", "--junit", "--simulate", "--profile",
                   "--expect-gpus", "--expect-driver", "--expect-cuda", "--duration", "--nproc"):
        assert option in text


@pytest.mark.parametrize("argv,needle", [
    (["--level", "extreme"], "invalid choice"),
    (["--only", "no-such-check"], "unknown check id or tag: no-such-check"),
    (["--simulate", "/nonexistent.yaml"], "no such file or shipped scenario"),
    (["--profile", "z999"], "unknown profile 'z999'"),
    (["--expect-gpus", "eight"], "invalid int value"),
    (["--duration", "soon"], "invalid duration"),
])
def test_bad_usage_exits_2_with_one_line(argv: list[str], needle: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([*argv, "--no-json", "-q"]) == 2
    err = capsys.readouterr().err
    assert needle in err
    assert "Traceback" not in err


@pytest.mark.parametrize("content,needle", [
    ("gpus: [\n  - {pci_bus_id: 1\n", "cannot parse"),
    ("- just\n- a list\n", "top level must be a mapping"),
    ("hosts: {}\n", "unknown key(s) ['hosts']"),
    ("gpus:\n  - {pci_bus_id: '0000:01:00.0', ecc_mod: true}\n", "unknown key(s) ['ecc_mod']"),
    ("extends: h100-sxm-8x-healthy\ngpu_overrides: {12: {ecc_mode: false}}\n", "not one of the 8 GPUs"),
    ("driver: {nvml: maybe}\n", "driver.nvml must be one of"),
    ("host: {shm_bytes: -5}\n", "host.shm_bytes must be a non-negative integer"),
    ("extends: self.yaml\n", "loops back"),
])
def test_bad_scenario_exits_2_with_one_line(tmp_path: Path, content: str, needle: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "self.yaml"
    path.write_text(content)
    assert cli.main(["--simulate", str(path), "--no-json", "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err
    assert len(err.splitlines()) == 1


def test_default_report_path_is_reports_hostname(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert cli.main(["--simulate", "cpu-only-healthy", "--level", "quick", "-q"]) == 0
    (report,) = (tmp_path / "reports").glob("*.json")
    assert json.loads(report.read_text())["host"] == report.stem


def test_junit_output(tmp_path: Path) -> None:
    junit = tmp_path / "out.xml"
    code = cli.main(["--simulate", "fault-pcie-x8", "--level", "quick", "--no-json", "-q",
                     "--junit", str(junit)])
    assert code == 1
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None and suite.get("failures") == "1"
    failed = [c.get("name") for c in suite.iter("testcase") if c.find("failure") is not None]
    assert failed == ["pcie-link"]
    skipped = [c.get("name") for c in suite.iter("testcase") if c.find("skipped") is not None]
    assert "retired-pages" in skipped


def test_only_and_skip_select_by_id_and_tag(run_cli) -> None:
    _, report, _ = run_cli("--simulate", "h100-sxm-8x-healthy", "--only", "host,gpu-count")
    ids = [c["id"] for c in report["checks"]]
    # Within a stage, checks run module by module (bmc, host, storage).
    assert ids == ["bmc-sensors", "os-supported", "nouveau-not-loaded", "secure-boot", "shm-size",
                   "memlock-limit", "cpu-numa", "disk-space", "swap", "gpu-count"]
    _, report, _ = run_cli("--simulate", "h100-sxm-8x-healthy", "--level", "quick",
                           "--skip", "health,inventory")
    assert {c["id"] for c in report["checks"]} == {
        "os-supported", "nouveau-not-loaded", "secure-boot", "shm-size", "memlock-limit", "cpu-numa",
        "bmc-sensors", "disk-space", "swap"}


def test_expectations_from_the_command_line(run_cli) -> None:
    code, report, _ = run_cli("--simulate", "h100-sxm-8x-healthy", "--level", "quick",
                              "--expect-gpus", "4", "--expect-driver", "580", "--expect-cuda", "12.8")
    st = {c["id"]: c for c in report["checks"]}
    assert code == 1
    assert st["gpu-count"]["status"] == "FAIL"
    assert "expected 4" in st["gpu-count"]["results"][0]["message"]
    assert st["driver-version"]["status"] == "FAIL"
    assert "expected 580" in st["driver-version"]["results"][0]["message"]
    assert st["cuda-compat"]["status"] == "FAIL"
    code, report, _ = run_cli("--simulate", "h100-sxm-8x-healthy", "--level", "quick",
                              "--expect-gpus", "8", "--expect-driver", "550", "--expect-cuda", "12.4")
    assert code == 0


def test_expect_gpus_on_a_gpu_less_host_fails(run_cli) -> None:
    code, report, _ = run_cli("--simulate", "cpu-only-healthy", "--level", "quick",
                              "--expect-gpus", "8")
    assert code == 1
    assert {c["id"]: c["status"] for c in report["checks"]}["pci-gpus"] == "FAIL"


def test_profile_override_is_recorded(run_cli) -> None:
    _, report, _ = run_cli("--simulate", "h100-sxm-8x-healthy", "--level", "quick",
                           "--profile", "h200")
    assert report["profile"]["name"] == "h200"
    assert report["profile"]["reason"] == "chosen with --profile"


def test_list_prints_selected_checks(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--list", "--level", "quick"]) == 0
    out = capsys.readouterr().out
    assert "ecc-errors" in out and "GPU002" in out


def test_json_to_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--simulate", "cpu-only-healthy", "--level", "quick", "--json", "-", "-q"]) == 0
    assert json.loads(capsys.readouterr().out)["verdict"] == "PASS"


def test_module_entry_point_runs_as_a_process(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "checks", "--simulate", "fault-shm-64mb",
                           "--level", "quick", "--json", str(tmp_path / "r.json")],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 1
    assert "shm-size" in proc.stdout and "FAIL" in proc.stdout
    assert "--shm-size" in proc.stdout  # the remedy is printed


def test_single_host_html_and_prometheus(tmp_path: Path) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    html, prom = tmp_path / "host.html", tmp_path / "host.prom"
    code = cli.main(["--simulate", "fault-ecc-uncorrectable", "--level", "quick", "--no-json", "-q",
                     "--html", str(html), "--prometheus", str(prom)])
    assert code == 1
    page = html.read_text()
    assert page.startswith("<!DOCTYPE html>") and "ecc-errors" in page and "<script src" not in page
    families = {f.name: f for f in text_string_to_metric_families(prom.read_text())}
    statuses = [s for s in families["nodecert_check_status"].samples
                if s.labels.get("check") == "ecc-errors" and s.labels.get("status") == "FAIL"]
    assert statuses and statuses[0].labels.get("gpu") == "2"
