"""A controller preview of the Slurm actions: `python -m checks.fleet.slurm report|health-check
--dry-run` asks no Slurm daemon (no sinfo, no scontrol: here they are stand-ins that record any
call) and prints the scontrol commands it would run. In-process, no Slurm cluster."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from checks.devtools import synthetic
from checks.devtools.synthetic import Broken, Slow
from checks.fleet import fleet_cli, slurm
from checks.fleet import slurm_control as control

sys.path.insert(0, str(Path(__file__).resolve().parent))
from slurmcluster import node_report

ECC = Broken("node0000", "ecc-errors", gpu=5, message="GPU5: 2 volatile uncorrectable ECC errors")


@pytest.fixture
def no_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """sinfo and scontrol on PATH that note every call and fail; no slurm.conf."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "slurm-calls"
    bin_dir.mkdir()
    for name in ("sinfo", "scontrol"):
        tool = bin_dir / name
        tool.write_text(f'#!/bin/sh\necho "{name} $*" >> {calls}\necho "slurm_load_partitions: '
                        'Unable to contact slurm controller" >&2\nexit 1\n')
        tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "no-slurm.conf"))
    monkeypatch.delenv("SLURMD_NODENAME", raising=False)
    return calls


_report = node_report


def test_without_dry_run_slurm_is_asked(tmp_path, h100_report, no_slurm, capsys) -> None:
    """The control: the default (a dry run that reads the node's state) needs slurmctld."""
    assert slurm.main(["report", str(_report(tmp_path, h100_report, [ECC]))]) == control.EXIT_SLURM
    assert "Unable to contact slurm controller" in capsys.readouterr().err
    assert no_slurm.read_text().startswith("sinfo ")


def test_report_dry_run_prints_the_drain(tmp_path, h100_report, no_slurm, capsys) -> None:
    assert slurm.main(["report", str(_report(tmp_path, h100_report, [ECC])), "--dry-run"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "gpu07.cluster.example: drain: fails: GPU002 ecc-errors GPU5: 2 volatile uncorrectable ECC errors",
        "dry run, Slurm not asked (--dry-run): scontrol update NodeName=gpu07.cluster.example State=DRAIN "
        "'Reason=NODECERT: GPU002 ecc-errors GPU5: 2 volatile uncorrectable ECC errors'"]
    assert not no_slurm.exists()
    assert control.offline is False  # the setting ends with the call


def test_report_dry_run_of_a_passing_node_shows_the_resume_it_would_run(tmp_path, h100_report, no_slurm,
                                                                         capsys) -> None:
    assert slurm.main(["report", str(_report(tmp_path, h100_report)), "--dry-run", "--node", "gpu07"]) == 0
    out = capsys.readouterr().out
    assert "gpu07: resume: passes; resumed only if drained with a 'NODECERT:' reason" in out
    assert "dry run, Slurm not asked (--dry-run): scontrol update NodeName=gpu07 State=RESUME" in out
    assert not no_slurm.exists()


def test_dry_run_and_apply_exclude_each_other(tmp_path, h100_report, no_slurm, capsys) -> None:
    path = _report(tmp_path, h100_report, [ECC])
    assert slurm.main(["report", str(path), "--dry-run", "--apply"]) == control.EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: --dry-run asks no Slurm daemon and --apply runs scontrol: give one"]
    assert not no_slurm.exists()


def test_health_check_dry_run_runs_the_checks_and_keeps_no_state(tmp_path, no_slurm, capsys) -> None:
    state = tmp_path / "state"
    code = slurm.main(["health-check", "--dry-run", "--node", "gpu07", "--state-dir", str(state),
                       "--textfile-dir", str(tmp_path / "textfiles"), "--", "--simulate", "fault-xid-79"])
    assert code == 1
    out = capsys.readouterr().out
    assert "gpu07: drain: fails: GPU005 xid-events XID 79" in out
    assert ("dry run, Slurm not asked (--dry-run): scontrol update NodeName=gpu07 State=DRAIN "
            "'Reason=NODECERT: GPU005 xid-events XID 79") in out
    assert not state.exists() and not (tmp_path / "textfiles").exists()
    assert not no_slurm.exists()


def test_fleet_summary_dry_run_lists_every_drain(tmp_path, h100_report, no_slurm, capsys) -> None:
    reports = synthetic.build(6, base=h100_report, run_id="r1",
                              slow=[Slow("node0003", "matmul_bf16_tflops", 0.7, gpu=1)])
    run = synthetic.write(reports, tmp_path / "r1")
    summary = tmp_path / "fleet.json"
    assert fleet_cli.main(["report", str(run), "--no-history", "-q", "--json", str(summary)]) == 1
    capsys.readouterr()
    assert slurm.main(["report", str(summary), "--dry-run"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("dry run, Slurm not asked (--dry-run): no node's state read, no partition guard")
    assert ("dry run, Slurm not asked (--dry-run): scontrol update NodeName=node0003 State=DRAIN "
            "'Reason=NODECERT: fleet straggler gpu-matmul matmul_bf16_tflops GPU1") in out
    assert "NodeName=node0000" not in out
    assert not no_slurm.exists()
