"""A GPU process's Slurm job when no cgroup names it: the job step's slurmstepd above it
(checks/hw/jobprocs.py), through the fixture backend's host.process_tree and the real /proc.
The real daemon's processes: tests/fleet/test_slurm_gate.py (a job's PID on a busy node)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from checks.hw import jobprocs
from checks.hw.jobprocs import ProcInfo, slurm_job_of_ancestry
from checks.hw.linux import LinuxBackend
from checks.node import node_cli

# A batch job as slurmd 22.05 starts it: slurmstepd (root, daemonized: parent 1), the batch
# script's shell, the training process (what NVML lists on the GPU).
TREE = {
    900: ProcInfo(1, 0, "slurmstepd", "slurmstepd: [4242.batch]"),
    901: ProcInfo(900, 1000, "bash", "/bin/bash /var/spool/slurmd/job04242/slurm_script"),
    902: ProcInfo(901, 1000, "python", "python train.py"),
}


def _reader(tree: dict[int, ProcInfo]):  # type: ignore[no-untyped-def]
    return lambda pid: tree.get(pid)


@pytest.mark.parametrize(("title", "job"), [("slurmstepd: [4242.batch]", "4242"),
                                            ("slurmstepd: [17.0]", "17"),
                                            ("slurmstepd: [17.extern]", "17"),
                                            ("slurmstepd: [17]", None),
                                            ("slurmstepd: [x.0]", None),
                                            ("slurmstepd", None)])
def test_the_job_is_the_step_daemon_above_the_process(title: str, job: str | None) -> None:
    tree = {**TREE, 900: ProcInfo(1, 0, "slurmstepd", title)}
    assert slurm_job_of_ancestry(902, _reader(tree)) == job


def test_what_is_not_below_a_root_slurmstepd_is_no_job() -> None:
    # a user's own process named slurmstepd does not make its children a job's
    assert slurm_job_of_ancestry(902, _reader({**TREE, 900: ProcInfo(1, 1000, "slurmstepd",
                                                                      "slurmstepd: [1.0]")})) is None
    # a process that left the job (daemonized: its parent is init)
    assert slurm_job_of_ancestry(902, _reader({**TREE, 902: ProcInfo(1, 1000, "python", "")})) is None
    # a parent that ended, a process that is gone, a loop in a damaged table
    assert slurm_job_of_ancestry(902, _reader({902: TREE[902], 901: None})) is None
    assert slurm_job_of_ancestry(5, _reader(TREE)) is None
    assert slurm_job_of_ancestry(1, _reader({1: ProcInfo(2, 0, "a", ""),
                                             2: ProcInfo(1, 0, "b", "")})) is None
    # the process itself is not its own job's daemon
    assert slurm_job_of_ancestry(900, _reader(TREE)) is None


def test_read_proc_parses_a_name_with_parentheses_and_spaces(tmp_path: Path) -> None:
    pid = tmp_path / "77"
    pid.mkdir()
    (pid / "stat").write_text("77 (a) b (c)) S 12 77 77 0 -1 4194560\n")
    (pid / "status").write_text("Name:\ta) b (c)\nUid:\t1000\t0\t0\t0\n")
    (pid / "cmdline").write_bytes(b"slurmstepd: [5.0]\0\0")
    assert jobprocs.read_proc(77, tmp_path) == ProcInfo(12, 1000, "a) b (c)", "slurmstepd: [5.0]")
    assert jobprocs.read_proc(78, tmp_path) is None


def test_the_real_proc_is_read() -> None:
    me = jobprocs.read_proc(os.getpid())
    assert me is not None and me.ppid == os.getppid() and me.uid == os.getuid()


def test_a_real_process_below_a_root_step_daemon_is_found(tmp_path: Path) -> None:
    """A stand-in slurmstepd (a shell run under that name, with slurmstepd's title) and its
    child: found as job 55 when it runs as root, as on a node; not when it runs as a user."""
    daemon = tmp_path / "slurmstepd"
    daemon.symlink_to("/bin/bash")
    proc = subprocess.Popen(["/bin/bash", "-c", f'exec -a "slurmstepd: [55.batch]" {daemon} '
                             '-c "sleep 60; exit 0"'], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        child = None
        while child is None and time.monotonic() < deadline:
            children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
            child = int(children[0]) if children else None
            time.sleep(0.02)
        assert child is not None
        assert jobprocs.read_proc(proc.pid).comm == "slurmstepd"
        expected = "55" if os.geteuid() == 0 else None
        assert LinuxBackend().process_slurm_job(child) == expected
        assert LinuxBackend().process_slurm_job(os.getpid()) is None  # pytest is in no job
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()


def _busy_scenario(tmp_path: Path, tree: str) -> Path:
    scenario = tmp_path / "busy.yaml"
    scenario.write_text(
        "extends: h100-sxm-8x-healthy\n"
        "gpu_defaults:\n"
        "  memory_used_bytes: 42949672960\n"
        "  compute_processes: [{pid: 902, name: python, used_memory_bytes: 42949672960}]\n"
        f"host:\n  process_tree: {tree}\n")
    return scenario


def _occupied(tmp_path: Path, tree: str) -> tuple[int, list[dict]]:
    out = tmp_path / "report.json"
    code = node_cli.main(["--simulate", str(_busy_scenario(tmp_path, tree)), "--only",
                          "gpu-occupied", "--json", str(out), "-q"])
    report = json.loads(out.read_text())
    (check,) = [c for c in report["checks"] if c["id"] == "gpu-occupied"]
    return code, check["results"]


FLOW = ("{900: {ppid: 1, uid: 0, comm: slurmstepd, cmdline: 'slurmstepd: [4242.batch]'}, "
        "901: {ppid: 900, uid: 1000, comm: bash}, 902: {ppid: 901, uid: 1000, comm: python}}")


def test_every_gpu_a_job_holds_is_busy_through_the_fixture(tmp_path: Path) -> None:
    code, results = _occupied(tmp_path, FLOW)
    assert code == 0 and len(results) == 8
    assert {r["status"] for r in results} == {"SKIP"}
    assert all("busy: in use by Slurm job 4242 (pid 902 (python" in r["message"] for r in results)


def test_the_same_process_with_no_job_above_it_fails(tmp_path: Path) -> None:
    code, results = _occupied(tmp_path, FLOW.replace("uid: 0,", "uid: 1000,"))
    assert code == 1 and {r["status"] for r in results} == {"FAIL"}
    assert results[0]["message"].startswith("1 other process(es) hold a compute context: pid 902")


@pytest.mark.parametrize(("tree", "needle"), [
    ("[1, 2]", "host.process_tree must be 'live' or a mapping"),
    ("{abc: {ppid: 1}}", "'abc' is not a PID"),
    ("{902: {ppid: one}}", "host.process_tree[902].ppid must be int"),
    ("{902: {parent: 1}}", "host.process_tree[902] must be a mapping of"),
])
def test_a_bad_process_tree_is_one_line_exit_2(tmp_path: Path, capsys, tree: str, needle: str) -> None:
    code = node_cli.main(["--simulate", str(_busy_scenario(tmp_path, tree)), "--no-json", "-q"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and needle in err, err
