"""Usage errors at the command line: one `error:` line and exit 2, never a usage block, a
traceback, a PASS over nothing checked, or a command run from a Makefile variable."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from checks.fleet import fleet_cli
from checks.node import node_cli
from trainer import trainer_cli

ROOT = Path(__file__).resolve().parents[2]
SIM = ["--simulate", "h100-sxm-8x-healthy", "--level", "quick", "--no-json", "-q"]


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


@pytest.mark.parametrize("main, argv", [
    (node_cli.main, ["--bogus"]),
    (node_cli.main, ["--level", "fast"]),
    (fleet_cli.main, ["bogus"]),
    (fleet_cli.main, ["report"]),
    (trainer_cli.main, ["ddp", "--steps", "zero"]),
])
def test_argparse_errors_are_one_line(main, argv, capsys) -> None:
    assert main(argv) == 2
    assert "usage:" not in _one_line(capsys)


def test_slurm_subcommand_error_is_one_line(capsys) -> None:
    from checks.fleet import slurm

    assert slurm.main(["health-check", "--no-such-option"]) == 2
    _one_line(capsys)


@pytest.mark.parametrize("module, argv", [
    ("checks", ["--only"]),
    ("checks.fleet", ["report", "--nope"]),
    ("trainer", []),
])
def test_one_line_in_a_real_process(module, argv) -> None:
    proc = subprocess.run([sys.executable, "-m", module, *argv], capture_output=True, text=True,
                          timeout=60, cwd=ROOT, check=False)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: "), proc.stderr


@pytest.mark.parametrize("argv, words", [
    (["--only", "quick"], "is a level"),
    (["--skip", "standard"], "is a level"),
    (["--only", "gpu-profle"], "did you mean 'gpu-profile'"),
    (["--skip", "os-suported"], "did you mean 'os-supported'"),
    (["--only", "os-supported", "--skip", "os-supported"], "select no check"),
])
def test_only_and_skip_must_name_checks(argv, words, capsys) -> None:
    assert node_cli.main([*SIM, *argv]) == 2
    assert words in _one_line(capsys)


@pytest.mark.parametrize("argv", [
    ["--expect-driver", "abc"], ["--expect-driver", "58"], ["--expect-cuda", "twelve"],
    ["--duration", "0"], ["--duration", "9" * 400], ["--budget", "0s"],
])
def test_bad_expectations_and_durations(argv, capsys) -> None:
    assert node_cli.main([*SIM, *argv]) == 2
    _one_line(capsys)


def test_good_driver_still_accepted(capsys) -> None:
    assert node_cli.main([*SIM, "--expect-driver", "580.95.05", "--list"]) == 0


def test_missing_expectations_file_is_usage_error(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("NODECERT_EXPECTATIONS", str(tmp_path / "expect.yaml"))
    assert node_cli.main(["--level", "quick", "--no-json", "-q"]) == 2
    assert "no such file" in _one_line(capsys)


def test_trainer_seed_too_large(capsys) -> None:
    assert trainer_cli.main(["ddp", "--seed", str(10**30)]) == 2
    _one_line(capsys)


# --- output paths -------------------------------------------------------------------------

@pytest.mark.parametrize("flag", ["--json", "--html", "--junit", "--prometheus"])
def test_device_node_and_symlink_refused(flag, tmp_path, capsys) -> None:
    assert node_cli.main([*SIM[:-2], flag, "/dev/null"]) == 2
    _one_line(capsys)
    assert not Path("/dev/null").is_file()
    target = tmp_path / "target"
    target.write_text("keep")
    (tmp_path / "link").symlink_to(target)
    assert node_cli.main([*SIM[:-2], flag, str(tmp_path / "link")]) == 2
    assert "symlink" in _one_line(capsys)
    assert (tmp_path / "link").is_symlink() and target.read_text() == "keep"


def test_empty_output_name_refused(capsys) -> None:
    assert node_cli.main([*SIM[:-2], "--json", ""]) == 2
    assert "empty file name" in _one_line(capsys)
    assert trainer_cli.main(["ddp", "--json", ""]) == 2
    _one_line(capsys)


def test_safeio_refuses_special_files_at_write_time(tmp_path) -> None:
    from checks import safeio

    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(OSError, match="not a regular file"):
        safeio.write_text(tmp_path / "fifo", "x")
    with pytest.raises(OSError, match="empty file name"):
        safeio.write_text("", "x")
    assert safeio.write_text(tmp_path / "ok.json", "x").read_text() == "x"


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("reports")
    assert node_cli.main(["--simulate", "h100-sxm-8x-healthy", "--level", "quick", "-q",
                          "--json", str(directory / "node0001.json")]) == 0
    return directory


def test_fleet_unusable_history(reports, capsys) -> None:
    assert fleet_cli.main(["report", str(reports), "-q", "--history", "/etc/passwd"]) == 2
    line = _one_line(capsys)
    assert "root:" not in line
    assert fleet_cli.main(["report", str(reports), "-q", "--history", "/dev/null/x.db"]) == 2
    _one_line(capsys)


def test_fleet_output_refused(reports, capsys) -> None:
    for argv in (["--json", ""], ["--json", "/dev/null"], ["--html", str(reports)]):
        assert fleet_cli.main(["report", str(reports), "-q", "--no-history", *argv]) == 2
        _one_line(capsys)


# --- Makefile -----------------------------------------------------------------------------

def _make(*args: str) -> subprocess.CompletedProcess[str]:
    # -o: never (re)build the venv from a test
    return subprocess.run(["make", "--no-print-directory", "-C", str(ROOT), "-o", ".venv/.stamp-run",
                           "-o", ".venv/.stamp-dev", *args],
                          capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize("var", ["LEVEL=quick;touch {p}", "ARGS=--no-json;touch {p}",
                                 "ARGS=--no-json `touch {p}`", "INVENTORY=x;touch {p}",
                                 "LEVEL=quick\"; touch {p}; echo \""])
def test_make_variables_run_nothing(var, tmp_path) -> None:
    marker = tmp_path / "p"
    proc = _make("verify", var.format(p=marker))
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert not marker.exists()


def test_make_inventory_typo_suggests_the_file() -> None:
    proc = _make("verify", "INVENTORY=inventory.exampel")
    assert proc.returncode == 2
    assert "does not exist" in proc.stderr and "'inventory.example'" in proc.stderr
    assert "make provision" not in proc.stderr


def test_fleet_report_of_no_checks_is_not_pass(reports, tmp_path, capsys) -> None:
    import json

    doc = json.loads((reports / "node0001.json").read_text())
    doc["checks"], doc["summary"] = [], dict.fromkeys(doc["summary"], 0)
    (tmp_path / "node0001.json").write_text(json.dumps(doc))
    out = tmp_path / "fleet.json"
    assert fleet_cli.main(["report", str(tmp_path), "-q", "--no-history", "--json", str(out)]) == 1
    fleet = json.loads(out.read_text())
    assert fleet["verdict"] == "FAIL" and fleet["hosts"][0]["status"] == "ERROR"
    assert "no checks" in fleet["hosts"][0]["reason"]


@pytest.mark.parametrize("text", ["root:$6$s3cr3tHash:19000:0:99999:7:::\nbin:*:19000:0:::\n",
                                  "user: alice\npassword: [s3cr3tHash\n"])
def test_simulate_never_echoes_the_file(text, tmp_path, capsys) -> None:
    secret = tmp_path / "shadow"
    secret.write_text(text)
    assert node_cli.main(["--simulate", str(secret), "--no-json", "-q"]) == 2
    line = _one_line(capsys)
    assert "s3cr3tHash" not in line and "root:" not in line
