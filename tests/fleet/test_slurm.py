"""The Slurm helper against stub `sinfo` and `scontrol` on PATH that record their arguments."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from checks.fleet import slurm, synthetic
from checks.fleet.synthetic import Broken

STUB = """#!{python}
import json, os, sys
with open(os.environ["STUB_LOG"], "a") as log:
    log.write(json.dumps([os.path.basename(sys.argv[0]), *sys.argv[1:]]) + "\\n")
if sys.argv[0].endswith("sinfo"):
    sys.stdout.write(os.environ.get("STUB_SINFO", "idle|none") + "\\n")
else:
    sys.stderr.write(os.environ.get("STUB_SCONTROL_ERR", ""))
    sys.exit(int(os.environ.get("STUB_SCONTROL_RC", "0")))
"""


class Slurm:
    """The stubs' PATH entry and what they were called with."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        for name in ("sinfo", "scontrol"):
            path = bin_dir / name
            path.write_text(STUB.format(python=sys.executable))
            path.chmod(path.stat().st_mode | stat.S_IXUSR)
        self.log = tmp_path / "calls.jsonl"
        self.monkeypatch = monkeypatch
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
        monkeypatch.setenv("STUB_LOG", str(self.log))

    def node(self, state: str, reason: str = "none") -> None:
        self.monkeypatch.setenv("STUB_SINFO", f"{state}|{reason}")

    def calls(self, name: str | None = None) -> list[list[str]]:
        if not self.log.exists():
            return []
        calls = [json.loads(line) for line in self.log.read_text().splitlines()]
        return [c[1:] for c in calls if name is None or c[0] == name]


@pytest.fixture()
def stub(tmp_path, monkeypatch) -> Slurm:
    return Slurm(tmp_path, monkeypatch)


def _report(tmp_path: Path, base: dict[str, Any], broken: list[Broken] = ()) -> Path:
    [report] = synthetic.build(1, base=base, broken=broken)
    report["host"] = "gpu07.cluster.example"
    path = tmp_path / "gpu07.json"
    path.write_text(json.dumps(report))
    return path


ECC = Broken("node0000", "ecc-errors", gpu=5, message="GPU5: 2 volatile uncorrectable ECC errors")
DRAIN = ["update", "NodeName=gpu07", "State=DRAIN",
         "Reason=NODECERT: ecc-errors GPU5: 2 volatile uncorrectable ECC errors"]


def test_dry_run_prints_the_drain_and_does_nothing(stub, tmp_path, h100_report, capsys) -> None:
    stub.node("idle")
    assert slurm.main(["report", str(_report(tmp_path, h100_report, [ECC]))]) == 1
    out = capsys.readouterr().out
    assert ("dry run (--apply to run): scontrol update NodeName=gpu07 State=DRAIN "
            "'Reason=NODECERT: ecc-errors GPU5: 2 volatile uncorrectable ECC errors'") in out
    assert stub.calls("scontrol") == []
    assert stub.calls("sinfo") == [["-h", "-N", "-n", "gpu07", "-o", "%T|%E"]]


def test_apply_drains_a_failed_node(stub, tmp_path, h100_report) -> None:
    stub.node("mixed")
    assert slurm.main(["report", str(_report(tmp_path, h100_report, [ECC])), "--apply"]) == 1
    assert stub.calls("scontrol") == [DRAIN]


def test_a_passing_idle_node_is_left_alone(stub, tmp_path, h100_report) -> None:
    stub.node("idle")
    assert slurm.main(["report", str(_report(tmp_path, h100_report)), "--apply"]) == 0
    assert stub.calls("scontrol") == []


def test_resumes_a_node_drained_with_our_prefix(stub, tmp_path, h100_report) -> None:
    stub.node("drained", "NODECERT: ecc-errors GPU5: 2 volatile uncorrectable ECC errors")
    assert slurm.main(["report", str(_report(tmp_path, h100_report)), "--apply"]) == 0
    assert stub.calls("scontrol") == [["update", "NodeName=gpu07", "State=RESUME"]]


@pytest.mark.parametrize("reason", ["admin: fan replaced, burn-in first", "NHC: check_hw_ib failed",
                                    "NODECERTX: something"])
def test_never_resumes_a_node_someone_else_drained(stub, tmp_path, h100_report, reason) -> None:
    stub.node("drained*", reason)
    assert slurm.main(["report", str(_report(tmp_path, h100_report)), "--apply"]) == 0
    assert stub.calls("scontrol") == []


def test_never_overwrites_someone_elses_drain_reason(stub, tmp_path, h100_report, capsys) -> None:
    stub.node("draining", "admin: RMA ticket 4411")
    assert slurm.main(["report", str(_report(tmp_path, h100_report, [ECC])), "--apply"]) == 1
    assert stub.calls("scontrol") == []
    assert "already drained by someone else (admin: RMA ticket 4411)" in capsys.readouterr().out


def test_already_drained_by_us_for_the_same_reason(stub, tmp_path, h100_report) -> None:
    stub.node("drained", DRAIN[-1].removeprefix("Reason="))
    assert slurm.main(["report", str(_report(tmp_path, h100_report, [ECC])), "--apply"]) == 1
    assert stub.calls("scontrol") == []


def test_custom_prefix(stub, tmp_path, h100_report) -> None:
    stub.node("drained", "NODECERT: ecc-errors old")
    path = str(_report(tmp_path, h100_report))
    assert slurm.main(["report", path, "--apply", "--prefix", "GPUCERT"]) == 0
    assert stub.calls("scontrol") == []
    stub.node("drained", "GPUCERT: ecc-errors old")
    assert slurm.main(["report", path, "--apply", "--prefix", "GPUCERT", "--node", "n1"]) == 0
    assert stub.calls("scontrol") == [["update", "NodeName=n1", "State=RESUME"]]


def test_scontrol_failure_is_one_line_exit_3(stub, tmp_path, h100_report, monkeypatch, capsys) -> None:
    stub.node("idle")
    monkeypatch.setenv("STUB_SCONTROL_RC", "1")
    monkeypatch.setenv("STUB_SCONTROL_ERR", "slurm_update error: Invalid node name specified\n")
    assert slurm.main(["report", str(_report(tmp_path, h100_report, [ECC])), "--apply"]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Invalid node name specified" in err


@pytest.mark.parametrize(("content", "needle"), [
    ("{not json", "report unreadable"), ('{"schema": "nodecert-report"}', "required property"),
    (None, "No such file"),
])
def test_bad_report_is_one_line_exit_2(stub, tmp_path, content, needle, capsys) -> None:
    path = tmp_path / "r.json"
    if content is not None:
        path.write_text(content)
    assert slurm.main(["report", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and needle in err
    assert stub.calls() == []


def test_missing_slurm_commands(tmp_path, h100_report, monkeypatch, capsys) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert slurm.main(["report", str(_report(tmp_path, h100_report))]) == 3
    assert capsys.readouterr().err == "error: sinfo not found on PATH\n"


def test_cli_entry_point_never_prints_a_traceback(tmp_path) -> None:
    proc = subprocess.run([sys.executable, "-m", "checks.fleet.slurm", "report", str(tmp_path / "x.json")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and proc.stderr.startswith("error:")


def test_health_check_mode_drains_this_node(stub, monkeypatch) -> None:
    """HealthCheckProgram: runs the quick checks on 'this node' (a fault scenario) and drains it."""
    stub.node("idle")
    monkeypatch.setenv("SLURMD_NODENAME", "gpu11")
    code = slurm.main(["health-check", "--apply", "--", "--simulate", "fault-xid-79"])
    assert code == 1
    [call] = stub.calls("scontrol")
    assert call[:3] == ["update", "NodeName=gpu11", "State=DRAIN"]
    assert call[3].startswith("Reason=NODECERT: xid-events ")


def test_health_check_mode_resumes_after_repair(stub, monkeypatch) -> None:
    stub.node("drained", "NODECERT: xid-events XID 79")
    monkeypatch.setenv("SLURMD_NODENAME", "gpu11")
    assert slurm.main(["health-check", "--apply", "--", "--simulate", "h100-sxm-8x-healthy"]) == 0
    assert stub.calls("scontrol") == [["update", "NodeName=gpu11", "State=RESUME"]]


def test_health_check_with_bad_options_does_not_drain(stub) -> None:
    stub.node("idle")
    assert slurm.main(["health-check", "--apply", "--", "--simulate", "no-such-scenario"]) == 2
    assert stub.calls("scontrol") == []


def test_health_check_that_hangs_drains(stub, monkeypatch) -> None:
    stub.node("idle")
    monkeypatch.setenv("SLURMD_NODENAME", "gpu11")
    assert slurm.main(["health-check", "--apply", "--timeout", "0.01", "--", "--simulate",
                       "h100-sxm-8x-healthy"]) == 1
    assert stub.calls("scontrol") == [["update", "NodeName=gpu11", "State=DRAIN",
                                       "Reason=NODECERT: nodecert-run did not finish in 0.01 s"]]
