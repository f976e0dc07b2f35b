"""checks.supervise.forkrun, the single-host launcher, run for real: what each forked rank sees
(torchrun's variables, its name, the preloaded modules, the launcher as its parent), a rank's
failure stopping the others with torchrun's failure block, the refusal to fork a process
that already runs a thread, and a launcher prepared ahead (launch.prepare): used by its launch,
closed by another, closed unused, ended by the end of its input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from checks.supervise import forkrun, launch, procs
from checks.supervise.rank import ENV_WORKDIR

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT)]),
       "OMP_NUM_THREADS": "1"}


def forkrun_(tmp_path: Path, *args: str, preload: str = "tests_preload_marker"
             ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "checks.supervise.forkrun", "--nproc=2",
                           f"--preload={preload}", "env_rank", str(tmp_path), *args],
                          env=ENV, capture_output=True, text=True, timeout=120, check=False)


def test_each_rank_sees_torchruns_contract_and_the_preloaded_modules(tmp_path: Path) -> None:
    proc = forkrun_(tmp_path)
    assert proc.returncode == 0, proc.stderr
    seen = {r: json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1)}
    for r, s in seen.items():
        assert {k: s[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")} == {
            "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}
        assert (s["GROUP_RANK"], s["MASTER_ADDR"], s["TORCHELASTIC_USE_AGENT_STORE"]) == (
            "0", "127.0.0.1", "True")
        assert s["comm"] == f"{forkrun.RANK_COMM}{r}"
        assert s["preloaded"] is True  # imported once by the launcher, before the fork
    assert seen[0]["ppid"] == seen[1]["ppid"]  # both forked by the one launcher


def test_a_failing_rank_is_reported_in_torchruns_failure_block(tmp_path: Path) -> None:
    proc = forkrun_(tmp_path, "7")  # rank 1 exits 7 after the barrier, rank 0 exits 0
    assert proc.returncode == 1
    codes = {int(r): int(c) for r, c in launch.FAILURE_BLOCK.findall(proc.stderr)}
    assert codes.pop(1) == 7, proc.stderr
    # rank 0 finished cleanly, or was still finishing when forkrun stopped it (SIGTERM)
    assert codes in ({}, {0: -15}), proc.stderr


def test_forkrun_refuses_to_fork_a_process_with_a_thread(tmp_path: Path) -> None:
    proc = forkrun_(tmp_path, preload="threaded_preload")
    assert proc.returncode == 1
    assert proc.stderr.strip() == ("forkrun: cannot fork the ranks: 2 threads are running (a "
                                   "forked rank would inherit their locks)")
    assert list(tmp_path.iterdir()) == []  # no rank ran


def _probe(tmp_path: Path, iters: str = "3") -> dict:
    return {"module": "probe_rank", "args": [iters], "nproc": 2, "env": dict(PROBE_ENV),
            "workdir": tmp_path / "work"}


PROBE_ENV = {"PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT)])}


def test_a_prepared_launcher_forks_its_ranks_when_the_launch_comes(tmp_path: Path) -> None:
    spec = _probe(tmp_path)
    held = launch.prepare(spec["module"], spec["args"], nproc=2, env=spec["env"],
                          workdir=spec["workdir"])
    assert not list(spec["workdir"].glob("heartbeat-*"))  # waiting: no rank yet
    outcome = launch.launch(spec["module"], spec["args"], nproc=2, env=spec["env"],
                            workdir=spec["workdir"], timeout_s=90, stall_s=30, prepared=held)
    assert outcome.ok, outcome.summary + outcome.log_tail
    assert "--hold" in outcome.command and outcome.returncode == 0
    assert outcome.prepared is True
    assert {r: res["sum"] for r, res in outcome.results.items()} == {0: 3.0, 1: 3.0}
    assert outcome.leftover_pids == [] and held.proc.poll() is not None


def test_another_launch_closes_the_prepared_launcher_and_starts_afresh(tmp_path: Path) -> None:
    spec = _probe(tmp_path)
    held = launch.prepare(spec["module"], spec["args"], nproc=2, env=spec["env"],
                          workdir=spec["workdir"])
    outcome = launch.launch(spec["module"], ["2"], nproc=2, env=spec["env"],
                            workdir=spec["workdir"], timeout_s=90, stall_s=30, prepared=held)
    assert outcome.ok, outcome.summary + outcome.log_tail
    assert "--hold" not in outcome.command
    assert outcome.prepared is False
    assert held.proc.poll() is not None  # the unused one is gone, not left waiting


def test_a_prepared_launcher_closed_unused_leaves_nothing(tmp_path: Path) -> None:
    spec = _probe(tmp_path)
    held = launch.prepare(spec["module"], spec["args"], nproc=2, env=spec["env"],
                          workdir=spec["workdir"])
    pid = held.proc.pid
    held.close()
    held.close()  # safe twice
    assert held.proc.poll() is not None
    assert procs.with_env(ENV_WORKDIR, str(spec["workdir"])) == []
    assert not Path(f"/proc/{pid}").exists()


def test_end_of_input_stops_a_held_launcher_without_ranks(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "checks.supervise.forkrun", "--nproc=2",
                           "--hold", "env_rank", str(tmp_path)], env=ENV, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=120, check=False)
    assert (proc.returncode, proc.stderr) == (0, "")
    assert list(tmp_path.iterdir()) == []
