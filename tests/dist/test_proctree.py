"""No process of a run outlives it: a real `python -m checks` (the collective check: forkrun and
its gloo ranks) and a real `python -m trainer` are stopped with SIGINT, SIGTERM and SIGKILL
(SIGKILL: nothing of ours runs, the kernel's parent-death signal ends the tree), and by their
own timeout; then no process that carries the run's marker remains, and the run's temporary
directories are gone. The ranks hang at their first heartbeat (NODECERT_INJECT), so the run is
still going when the signal arrives. The bound is pytest-timeout's."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from checks.supervise import forkrun, procs

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
MARK = "NODECERT_TEST_RUN"  # in the environment of every process the run starts

CHECKS = ["checks", "--only", "nccl-allreduce", "--nproc", "2", "--no-json", "--quiet"]
TRAINER = ["trainer", "ddp", "--nproc", "2", "--device", "cpu"]


class Run:
    def __init__(self, argv: list[str], tmp_path: Path, **extra_env: str) -> None:
        self.mark = uuid.uuid4().hex
        self.tmp = tmp_path / "tmp"  # TMPDIR of the whole run: what it leaves is seen here
        self.tmp.mkdir()
        self.log = tmp_path / "output.log"
        path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
        env = {**os.environ, "PYTHONPATH": path, MARK: self.mark, "TMPDIR": str(self.tmp),
               "NODECERT_INJECT": "hang:*", "OMP_NUM_THREADS": "1", **extra_env}
        with open(self.log, "wb") as out:
            # A session of its own: the signal goes to this process only, as `kill PID` would.
            self.proc = subprocess.Popen([sys.executable, "-m", *argv], env=env, cwd=tmp_path,
                                         stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)

    def processes(self) -> list[int]:
        return procs.with_env(MARK, self.mark)

    def ranks(self) -> list[int]:
        """The ranks forkrun forked (one host), by the name it gives them."""
        found = []
        for pid in self.processes():
            try:
                comm = Path(f"/proc/{pid}/comm").read_text().strip()
            except OSError:
                continue
            if comm.startswith(forkrun.RANK_COMM):
                found.append(pid)
        return found

    def wait_for_ranks(self, n: int) -> list[int]:
        while len(ranks := self.ranks()) < n:
            assert self.proc.poll() is None, f"the run ended early:\n{self.output()}"
            time.sleep(0.2)
        return ranks

    def wait_until_gone(self) -> None:
        while self.processes():
            time.sleep(0.1)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def left_in_tmp(self) -> list[str]:
        return sorted(p.name for p in self.tmp.iterdir())

    def cleanup(self) -> None:
        procs.kill_all(self.processes())
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def runs() -> Iterator[list[Run]]:
    made: list[Run] = []
    yield made
    for run in made:  # a failed assertion must not leave the run behind either
        run.cleanup()


def cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []  # gone meanwhile


def listening(pids: list[int]) -> list[str]:
    """Local addresses the processes `pids` listen on (TCP, from /proc/net/tcp{,6})."""
    inodes = set()
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").glob("*"):
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = []
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A" or fields[9] not in inodes:  # 0A: LISTEN
                continue
            raw_ip, port = fields[1].split(":")
            packed = bytes.fromhex(raw_ip)
            # /proc prints each 32-bit word in host (little-endian) order
            packed = b"".join(packed[i:i + 4][::-1] for i in range(0, len(packed), 4))
            found.append(f"{socket.inet_ntop(family, packed)}:{int(port, 16)}")
    return found


@pytest.mark.timeout(240)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL],
                         ids=["SIGINT", "SIGTERM", "SIGKILL"])
def test_checks_run_leaves_no_process_on_a_signal(runs: list[Run], tmp_path: Path,
                                                  sig: signal.Signals) -> None:
    run = Run(CHECKS, tmp_path)
    runs.append(run)
    run.wait_for_ranks(2)
    os.kill(run.proc.pid, sig)
    code = run.proc.wait()
    run.wait_until_gone()
    if sig == signal.SIGKILL:
        assert code == -signal.SIGKILL
        return  # nothing of ours ran: the temporary directories stay (docs/checks.md)
    assert code == 128 + sig, run.output()
    assert f"stopped by {sig.name}" in run.output()
    assert run.left_in_tmp() == []  # the collective's workdir went too


@pytest.mark.timeout(240)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_held_acceptance_launcher_goes_with_the_run(runs: list[Run], tmp_path: Path,
                                                      sig: signal.Signals) -> None:
    """The acceptance launcher the prepare hook started at the beginning of the run waits for
    its stage while the collective ranks hang: a signal to the run ends it too."""
    run = Run([*CHECKS[:2], "nccl-allreduce,train-ddp", *CHECKS[3:]], tmp_path)
    runs.append(run)
    run.wait_for_ranks(2)
    held = [pid for pid in run.processes() if "--hold" in cmdline(pid)]
    assert held, "the acceptance launcher should be waiting for its stage"
    os.kill(run.proc.pid, sig)
    code = run.proc.wait()
    run.wait_until_gone()
    if sig == signal.SIGKILL:
        assert code == -signal.SIGKILL
        return
    assert code == 128 + sig, run.output()
    assert run.left_in_tmp() == []  # the held launch's temporary directory went too


@pytest.mark.timeout(240)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_trainer_leaves_no_process_on_a_signal(runs: list[Run], tmp_path: Path,
                                               sig: signal.Signals) -> None:
    run = Run(TRAINER, tmp_path)
    runs.append(run)
    ranks = run.wait_for_ranks(2)
    # One host: nothing of the launch (forkrun's store, gloo) listens beyond loopback.
    tree = run.processes()
    addresses = listening(tree)
    assert addresses, "the rendezvous store should be listening"
    assert [a for a in addresses if not a.startswith(("127.", "::1:"))] == [], addresses
    assert set(ranks) <= set(tree)
    os.kill(run.proc.pid, sig)
    code = run.proc.wait()
    run.wait_until_gone()
    if sig == signal.SIGKILL:
        assert code == -signal.SIGKILL
        return
    assert code == 128 + sig, run.output()
    assert "stopped by SIGTERM: the ranks were killed and the workdir removed" in run.output()
    assert run.left_in_tmp() == []  # /tmp/nodecert-train-* included


@pytest.mark.timeout(240)
def test_trainer_timeout_kills_the_ranks_and_removes_its_workdir(runs: list[Run],
                                                                 tmp_path: Path) -> None:
    # The ranks start, then hang as the job begins: no progress for 3 s is a hang.
    run = Run([*TRAINER, "--stall", "3", "--timeout", "200"], tmp_path,
              NODECERT_INJECT="hang:*@ddp/start")
    runs.append(run)
    code = run.proc.wait()
    assert code == 1, run.output()
    assert "hung" in run.output() and "no progress for 3 s" in run.output()
    assert run.processes() == []
    assert run.left_in_tmp() == []
