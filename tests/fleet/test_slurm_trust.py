"""What a report or an argument says is not trusted by the Slurm helper, against a real Slurm
cluster (tests/fleet/slurmcluster.py): a host that scontrol would expand into many nodes drains
and resumes nothing, a verdict that contradicts its checks is refused, and an sbatch script's
arguments are never run by a shell."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from checks.devtools import synthetic
from checks.devtools.synthetic import Broken
from checks.fleet import slurm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from slurmcluster import SlurmCluster, local_cluster, pointed_at

NODES = ("t1", "t2")
ECC = Broken("node0000", "ecc-errors", gpu=5, message="GPU5: 2 volatile uncorrectable ECC errors")
# a report's host is refused where the report is read; an option where slurm.py reads it
REFUSED = re.compile(r"is not (a|one Slurm) node name|is a reserved name")
HOSTILE = ["t[1-2]", "ALL", "all", "t1,t2", "t1 t2", "t1\n", "t1\x07", " t1", "-t1",
           "t1;t2", "$(id)", "t" * 300]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[SlurmCluster]:
    with local_cluster(tmp_path_factory.mktemp("trust"), NODES) as c:
        yield c


@pytest.fixture()
def slurm_env(cluster, monkeypatch) -> SlurmCluster:
    return pointed_at(cluster, monkeypatch)


def _report(tmp_path: Path, base: dict[str, Any], host: str, broken: list[Broken] = ()) -> Path:
    [report] = synthetic.build(1, base=base, broken=list(broken))
    report["host"] = host
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    return path


def _drain(cluster: SlurmCluster, node: str, reason: str) -> None:
    cluster.run("scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}")


@pytest.mark.parametrize("host", HOSTILE)
def test_a_hostile_host_in_a_passing_report_resumes_nothing(slurm_env, tmp_path, h100_report,
                                                            host, capsys) -> None:
    for node in NODES:
        _drain(slurm_env, node, "NODECERT: GPU002 ecc-errors old")
    code = slurm.main(["report", str(_report(tmp_path, h100_report, host)), "--apply"])
    err = capsys.readouterr().err
    # refused when the report is read (checks/report/load.py), before any Slurm command
    assert code == 2 and err.count("\n") == 1 and REFUSED.search(err), err
    assert str(tmp_path / "report.json") in err
    for node in NODES:
        assert slurm_env.node_state(node) == ("drained", "NODECERT: GPU002 ecc-errors old")


@pytest.mark.parametrize("host", ["t[1-2]", "ALL", "t1,t2"])
def test_a_hostile_host_in_a_failing_report_drains_nothing(slurm_env, tmp_path, h100_report,
                                                           host, capsys) -> None:
    code = slurm.main(["report", str(_report(tmp_path, h100_report, host, [ECC])), "--apply"])
    assert code == 2 and REFUSED.search(capsys.readouterr().err)
    for node in NODES:
        assert slurm_env.node_state(node) == ("idle", "")


@pytest.mark.parametrize("node", ["t[1-2]", "ALL", "t1,t2"])
def test_a_hostile_node_option_is_refused(slurm_env, tmp_path, h100_report, node,
                                          monkeypatch, capsys) -> None:
    path = _report(tmp_path, h100_report, "t1", [ECC])
    assert slurm.main(["report", str(path), "--apply", "--node", node]) == 2
    monkeypatch.setenv("SLURMD_NODENAME", node)
    assert slurm.main(["prolog", "--apply", "--state-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err.count("is not one Slurm node name") == 2
    assert all(slurm_env.node_state(n) == ("idle", "") for n in NODES)


def test_a_pass_verdict_that_its_checks_contradict_is_refused(slurm_env, tmp_path, h100_report,
                                                              capsys) -> None:
    """A FAIL report edited to say PASS: refused, naming the file; the node is not resumed."""
    path = _report(tmp_path, h100_report, "t1", [ECC])
    doc = json.loads(path.read_text())
    doc["verdict"] = "PASS"
    path.write_text(json.dumps(doc))
    _drain(slurm_env, "t1", "NODECERT: GPU002 ecc-errors old")
    assert slurm.main(["report", str(path), "--apply"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(path) in err and "does not follow from its checks" in err
    assert slurm_env.node_state("t1") == ("drained", "NODECERT: GPU002 ecc-errors old")


def test_batch_script_arguments_are_never_run_by_a_shell(slurm_env, tmp_path) -> None:
    """Quoted arguments used to sit inside a single-quoted `bash -c`: a `'` closed it and
    `$(...)` ran in the batch shell. Through sbatch and srun on the real cluster, each argument
    now arrives unchanged at the program it is for (which refuses it, so the job is short)."""
    ran = [tmp_path / "ran-checks", tmp_path / "ran-node"]
    script = tmp_path / "verify.sbatch"
    reports = tmp_path / "reports"
    proc = subprocess.run([sys.executable, "-m", "checks.fleet.slurm", "batch-script", "--nodes", "2",
                           "--out", str(reports), "--ifname", f"eth0'$(touch {ran[1]})'", "--minutes",
                           "5", "--", "--simulate", f"$(touch {ran[0]})"],
                          capture_output=True, text=True, timeout=60, check=True)
    script.write_text(proc.stdout)
    assert subprocess.run(["bash", "-n", str(script)], check=False).returncode == 0
    proc = subprocess.run(["sbatch", "--parsable", "--wait", str(script)], capture_output=True,
                          text=True, timeout=300, env=slurm_env.env(), check=False)
    job = proc.stdout.strip().split(";")[0]
    log = (reports / f"{job}.log").read_text()
    assert not any(p.exists() for p in ran), log[-3000:]
    assert f"$(touch {ran[0]})" in log, log[-3000:]  # python -m checks named the literal scenario


@pytest.mark.parametrize("argv", [
    ["health-check", "--timeout", "nan"], ["health-check", "--timeout", "inf"],
    ["health-check", "--timeout", "-1"], ["health-check", "--slurm-timeout", "nan"],
    ["health-check", "--budget", "soon"], ["health-check", "--budget", "40s", "--timeout", "30"],
    ["epilog", "--timeout", "0"], ["prolog", "--node", "ALL"],
    ["report", "/dev/null", "--max-drain-fraction", "nan"], ["report", "FIFO"],
    ["scripts", "DIR", "--timeout", "nan"], ["scripts", "DIR", "--timeout", "inf"],
    ["scripts", "DIR", "--budget", "nan"], ["batch-script", "--nodes", "1"],
])
def test_bad_options_are_one_line_exit_2(tmp_path, argv, capsys, monkeypatch) -> None:
    """Nothing of this reaches Slurm: the options are refused first (no cluster needed)."""
    monkeypatch.setenv("SLURMD_NODENAME", "t1")
    monkeypatch.setenv("PATH", str(tmp_path))  # a Slurm call would fail with exit 3, not 2
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    argv = [str(fifo) if a == "FIFO" else str(tmp_path / "bin") if a == "DIR" else a for a in argv]
    if argv[0] in ("health-check", "epilog", "prolog"):
        argv += ["--state-dir", str(tmp_path / "state")]
    assert slurm.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err, err
