"""checks.supervise.forkrun, the single-host launcher, run for real: what each forked rank sees
(torchrun's variables, its name, the preloaded modules, the launcher as its parent), a rank's
failure stopping the others with torchrun's failure block, and the refusal to fork a process
that already runs a thread."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from checks.supervise import forkrun, launch

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
