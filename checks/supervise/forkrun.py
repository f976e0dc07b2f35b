"""`python -m checks.supervise.forkrun --nproc N [--preload M,...] MODULE ARGS...`: one host's
ranks forked from one process that imported torch once.

torchrun imports torch, then starts every rank as a new interpreter that imports torch and the
rank program again: on a host with few cores that is most of a short launch (each import is
3-8 s of CPU, paid N+1 times before the first collective). This launcher imports torch and the
modules named by --preload once, freezes that heap (gc.freeze: the ranks' collections never scan
it, and its pages stay shared), then forks the N ranks. It is the single-host launcher of
checks.supervise.launch; multi-node launches keep torchrun's c10d rendezvous.

What the ranks see is torchrun's contract: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
GROUP_RANK, MASTER_ADDR/MASTER_PORT, and the rendezvous store hosted by the launcher (as
torchrun's agent hosts it: TORCHELASTIC_USE_AGENT_STORE), listening on the loopback address only.
When a rank exits non-zero the others get SIGTERM (SIGKILL after STOP_GRACE_S) and the launcher
prints torchrun's failure block (`rank : R (local_rank: R)` / `exitcode : C`, negative for a
signal), which the supervisor reads. Exit status: 0 when every rank exited 0, else 1; 128 + N
when stopped by signal N. Each rank dies with the launcher (PR_SET_PDEATHSIG), and the launcher
with its own parent (run it through checks.supervise.guard).

Prepared ahead (`--hold`, launch.prepare): the launcher does its imports while the caller runs
other checks, then forks the ranks when a line arrives on its stdin (checks.supervise.launch's
`launch(prepared=...)`); end of input without a line means the launch was not wanted (exit 0).

Forking is safe because nothing has a thread or a CUDA context yet: the launcher refuses to fork
otherwise (one line, exit 1), and the store's server starts only after the last fork.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import os
import runpy
import signal
import socket
import sys
import time
import traceback
from datetime import timedelta

from checks.supervise.procs import ENV_PARENT, set_pdeathsig

RANK_COMM = "nodecert-rank"  # + rank: each rank's /proc/PID/comm, what `ps` and `top` show
STOP_GRACE_S = 10.0  # after the first failure, the survivors' time to leave on SIGTERM
STORE_TIMEOUT_S = 300.0
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def why_not_fork() -> str | None:
    """Why forking ranks from this process would be unsafe now, or None."""
    if _threads() > 1:
        return f"{_threads()} threads are running (a forked rank would inherit their locks)"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "CUDA is initialised in the launcher (a forked rank cannot use it)"
    return None


def _name(comm: str) -> None:
    """This process's name as `ps` shows it (a forked rank's /proc/PID/environ still shows the
    launcher's environment: the variables set here live in Python's copy only)."""
    try:
        with open("/proc/self/comm", "w") as fh:
            fh.write(comm[:15])
    except OSError:
        pass


def _rank_env(rank: int, nproc: int, port: int, run_id: str) -> dict[str, str]:
    return {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(nproc),
            "LOCAL_WORLD_SIZE": str(nproc), "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1",
            "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(nproc), "ROLE_NAME": "default",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
            "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "0",
            "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_RUN_ID": run_id}


def _rank(rank: int, nproc: int, port: int, run_id: str, parent: int, listener: socket.socket,
          module: str, args: list[str]) -> None:
    """The forked child: become rank `rank` and run `python -m module args`. Never returns."""
    code = 1
    try:
        for sig in _STOP_SIGNALS:
            signal.signal(sig, signal.SIG_DFL)
        set_pdeathsig(signal.SIGKILL)
        if os.getppid() != parent:
            os._exit(1)  # the launcher died before the line above took effect
        listener.close()
        _name(f"{RANK_COMM}{rank}")
        os.environ.update(_rank_env(rank, nproc, port, run_id))
        os.environ[ENV_PARENT] = str(parent)
        sys.argv = [module, *args]
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:  # the rank's own crash, reported as torchrun would
            traceback.print_exc()
            code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(code)


def _stop(pids: set[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _wait_all(pids: dict[int, int]) -> dict[int, int]:
    """Reap every rank; on the first non-zero exit (or a stop signal) SIGTERM the others, then
    SIGKILL what is left after STOP_GRACE_S. {rank: exit code, negative for a signal}."""
    codes: dict[int, int] = {}
    live = dict(pids)  # pid -> rank
    stopping: list[int] = []  # the signal that stops us, once one arrives

    def on_signal(signum: int, _frame: object) -> None:
        stopping.append(signum)
        _stop(set(live), signal.SIGTERM)

    for sig in _STOP_SIGNALS:
        signal.signal(sig, on_signal)
    deadline: float | None = None
    while live:
        if deadline is not None and time.monotonic() >= deadline:
            _stop(set(live), signal.SIGKILL)
            deadline = None
        pid, status = os.waitpid(-1, os.WNOHANG) if deadline is not None else os.waitpid(-1, 0)
        if pid == 0:
            time.sleep(0.05)
            continue
        if pid not in live:
            continue
        rank = live.pop(pid)
        codes[rank] = os.waitstatus_to_exitcode(status)
        if (codes[rank] != 0 or stopping) and deadline is None and live:
            _stop(set(live), signal.SIGTERM)
            deadline = time.monotonic() + STOP_GRACE_S
    if stopping:
        sys.exit(128 + stopping[0])
    return codes


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m checks.supervise.forkrun")
    p.add_argument("--nproc", type=int, required=True)
    p.add_argument("--preload", default="", help="comma-separated modules to import before forking")
    p.add_argument("--run-id", default="nodecert")
    p.add_argument("--hold", action="store_true",
                   help="prepared ahead: after the imports wait for a line on stdin before forking "
                        "(end of input: exit 0, never used)")
    p.add_argument("module")
    p.add_argument("args", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    if a.nproc < 1:
        print("forkrun: --nproc must be at least 1", file=sys.stderr)
        return 2
    from torch.distributed import TCPStore

    for name in filter(None, a.preload.split(",")):
        importlib.import_module(name)
    why = why_not_fork()
    if why:
        print(f"forkrun: cannot fork the ranks: {why}", file=sys.stderr)
        return 1
    gc.collect()
    gc.freeze()
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(512)
    port = int(listener.getsockname()[1])
    sys.stdout.flush()
    sys.stderr.flush()
    if a.hold and not sys.stdin.buffer.readline():
        return 0  # prepared, then not wanted: the ranks never start
    me = os.getpid()
    pids: dict[int, int] = {}
    for rank in range(a.nproc):
        pid = os.fork()
        if pid == 0:
            _rank(rank, a.nproc, port, a.run_id, me, listener, a.module, a.args)
        pids[pid] = rank
    # Only now a thread: the store's server, on the socket bound above (loopback only).
    store = TCPStore("127.0.0.1", port, None, True, timedelta(seconds=STORE_TIMEOUT_S),
                     wait_for_workers=False, multi_tenant=True,
                     master_listen_fd=listener.fileno(), use_libuv=True)
    codes = _wait_all(pids)
    del store
    failed = {r: c for r, c in sorted(codes.items()) if c != 0}
    if failed:
        lines = ["forkrun: ranks failed:"]
        for i, (rank, code) in enumerate(failed.items()):
            lines += [f"[{i}]:", f"  rank      : {rank} (local_rank: {rank})",
                      f"  exitcode  : {code}"]
        print("\n".join(lines), file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
