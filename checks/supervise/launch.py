"""Supervise a torchrun launch: heartbeats, hard timeouts, whole-group kill, first-failure report.

torchrun (`python -m torch.distributed.run`) starts the ranks; this module starts torchrun in a
session of its own, watches the ranks' heartbeat files (see rank.py) and:
- a rank that never starts (or a host that never joins) within `start_timeout_s` is named;
- when no rank makes progress for `stall_s`, or `timeout_s` passes, the ranks whose progress
  stopped first are named as hung, and torchrun with every rank is killed (SIGKILL), leaving no
  process behind;
- when a rank crashes, the rank, its exit code or signal and its last error are reported; a rank
  that only failed because a peer vanished is not blamed.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from checks.supervise import procs
from checks.supervise.rank import ENV_WORKDIR

# Errors a rank raises because another rank disappeared: the victim, not the cause.
PEER_LOSS = re.compile(r"Connection (closed|reset) by peer|remote process exited|Broken pipe|"
                       r"NCCL communicator was aborted|ProcessGroupGloo.*(closed|timed out)|"
                       r"Socket Timeout|Connection refused|read error|EOF", re.IGNORECASE)
GUARD = "checks.supervise.guard"  # `python -m GUARD MODULE`: MODULE dies with its parent
FORKRUN = "checks.supervise.forkrun"  # one host's launcher: imports torch once, forks the ranks
ROOT = str(Path(__file__).resolve().parents[2])  # the ranks import `checks` from here
FAILURE_BLOCK = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank[^)]*\)\s*\n\s*exitcode\s*:\s*(-?\d+)")


@dataclass
class RankState:
    rank: int
    state: str  # ok | error | crashed | hung | stopped | missing
    phase: str | None = None
    seq: int = 0
    heartbeat_age_s: float | None = None
    exitcode: int | None = None
    error: str | None = None
    host: str | None = None
    result: dict[str, Any] | None = None

    def describe(self) -> str:
        where = f"rank {self.rank}" + (f" on {self.host}" if self.host else "")
        if self.state == "hung":
            age = f" for {self.heartbeat_age_s:.0f} s" if self.heartbeat_age_s is not None else ""
            return f"{where} stopped heartbeating{age} (last heartbeat: '{self.phase}')"
        if self.state == "missing":
            return f"{where} never started (did not join)"
        if self.state == "crashed":
            how = _exit_text(self.exitcode)
            return f"{where} crashed ({how}) after '{self.phase}'" + (
                f": {self.error}" if self.error else "")
        if self.state == "error":
            return f"{where} failed after '{self.phase}': {self.error}"
        return f"{where}: {self.state}"


def _exit_text(code: int | None) -> str:
    if code is None:
        return "exit status unknown"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


@dataclass
class LaunchOutcome:
    ok: bool
    summary: str  # one line: what went wrong first, or "N ranks finished"
    ranks: dict[int, RankState]
    culprits: list[int] = field(default_factory=list)
    duration_s: float = 0.0
    returncode: int | None = None
    command: list[str] = field(default_factory=list)
    log_tail: str = ""
    workdir: str = ""
    hung: bool = False
    leftover_pids: list[int] = field(default_factory=list)  # could not be killed
    orphans_killed: list[int] = field(default_factory=list)  # outlived the launch, killed
    prepared: bool = False  # its launcher was started ahead (prepare())

    @property
    def results(self) -> dict[int, dict[str, Any]]:
        return {r: s.result for r, s in sorted(self.ranks.items()) if s.result is not None}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _endpoint_is_local(endpoint: str) -> bool:
    """True when the rendezvous address is one of this machine's own non-loopback addresses.
    torchrun's c10d backend guesses whether to host the rendezvous store from what the hostname
    resolves to; on a multi-homed leader whose hostname names another interface it guesses
    wrong, nobody hosts the store and every node waits until its join timeout."""
    import ipaddress

    host = endpoint.rpartition(":")[0].strip("[]")
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return False
    for family, _, _, _, sockaddr in infos:
        if ipaddress.ip_address(sockaddr[0]).is_loopback:
            continue  # several "hosts" on one machine: let torchrun fall back to being a client
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((sockaddr[0], 0))
                return True
            except OSError:
                continue
    return False


def torchrun_command(module: str, args: list[str], *, nproc: int, nnodes: int,
                     rdzv_endpoint: str | None, rdzv_id: str | None = None,
                     node_rank: int | None = None, local_addr: str | None = None,
                     join_timeout_s: float = 60.0, python: str = sys.executable,
                     log_dir: str | Path | None = None) -> list[str]:
    cmd = [python, "-m", GUARD, "torch.distributed.run", f"--nproc-per-node={nproc}",
           "--max-restarts=0", "--monitor-interval=0.1"]
    if log_dir is not None:  # else torchrun makes /tmp/torchelastic_*, left behind by a kill
        cmd.append(f"--log-dir={log_dir}")
    if rdzv_endpoint is None:
        raise ValueError("a torchrun launch needs rdzv_endpoint HOST:PORT (one host: forkrun)")
    cmd += [f"--nnodes={nnodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv_endpoint}",
            f"--rdzv-id={rdzv_id or 'nodecert'}",
            f"--rdzv-conf=join_timeout={int(join_timeout_s)}"
            + (",is_host=1" if _endpoint_is_local(rdzv_endpoint) else "")]
    if node_rank is not None:
        cmd.append(f"--node-rank={node_rank}")
    if local_addr:
        cmd.append(f"--local-addr={local_addr}")
    # Every rank runs through the guard: it dies with torchrun, even when torchrun is SIGKILLed.
    return [*cmd, "-m", GUARD, module, *args]


def forkrun_command(module: str, args: list[str], *, nproc: int, preload: Sequence[str] = (),
                    python: str = sys.executable, run_id: str | None = None) -> list[str]:
    """One host's launch: `forkrun` (through the guard: it dies with its parent) imports torch
    and `preload` once and forks the ranks."""
    return [python, "-m", GUARD, FORKRUN, f"--nproc={nproc}", f"--preload={','.join(preload)}",
            f"--run-id={run_id or 'nodecert'}", module, *args]


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _heartbeats(workdir: Path) -> dict[int, dict[str, Any]]:
    beats = {}
    for path in workdir.glob("heartbeat-*.json"):
        data = _read_json(path)
        if data is not None:
            beats[int(data["rank"])] = data
    return beats


def _setup(module: str, args: list[str], *, nproc: int, env: dict[str, str] | None,
           workdir: str | Path | None, nnodes: int = 1, rdzv_endpoint: str | None = None,
           rdzv_id: str | None = None, node_rank: int | None = None,
           local_addr: str | None = None, start_timeout_s: float = 120.0,
           python: str = sys.executable, preload: Sequence[str] = ()
           ) -> tuple[Path, list[str], dict[str, str]]:
    """The launch's workdir (made), launcher command and environment."""
    workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="nodecert-launch-"))
    workdir.mkdir(parents=True, exist_ok=True)
    single = nnodes == 1 and rdzv_endpoint is None
    if single:
        cmd = forkrun_command(module, args, nproc=nproc, preload=preload, python=python,
                              run_id=rdzv_id)
    else:
        cmd = torchrun_command(module, args, nproc=nproc, nnodes=nnodes,
                               rdzv_endpoint=rdzv_endpoint, rdzv_id=rdzv_id, node_rank=node_rank,
                               local_addr=local_addr, join_timeout_s=start_timeout_s,
                               python=python, log_dir=workdir / "torchelastic")
    pythonpath = os.pathsep.join(p for p in (ROOT, (env or {}).get("PYTHONPATH")
                                             or os.environ.get("PYTHONPATH")) if p)
    full_env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
                **(env or {}), ENV_WORKDIR: str(workdir), "PYTHONUNBUFFERED": "1",
                "PYTHONPATH": pythonpath}
    if single:
        # One host: nothing of the launch listens beyond loopback, neither the rendezvous store
        # (forkrun binds it there) nor gloo's sockets (unless the caller chose an interface).
        full_env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    return workdir, cmd, full_env


@dataclass
class Prepared:
    """One host's launcher started ahead of its launch (`prepare()`): it imports torch and the
    rank program's modules while the caller does other work, and forks the ranks when
    `launch(prepared=...)` says go. `close()` ends it unused (safe to call again)."""
    proc: subprocess.Popen[bytes]
    log: Any  # the launcher's log file, open
    command: list[str]  # as started (with --hold)
    key: tuple[Any, ...]

    def usable(self, cmd: list[str], env: dict[str, str] | None) -> bool:
        return self.proc.poll() is None and self.key == _key(cmd, env)

    def go(self) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(b"go\n")
            self.proc.stdin.close()
        except OSError:
            pass  # it died meanwhile: the launch reports how

    def close(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        procs.kill_tree(self.proc)
        self.log.close()


def prepare(module: str, args: list[str], *, nproc: int, env: dict[str, str] | None = None,
            workdir: str | Path, preload: Sequence[str] = (), rdzv_id: str | None = None,
            python: str = sys.executable) -> Prepared:
    """Start one host's launcher for `launch(module, args, nproc=..., env=..., workdir=...,
    preload=..., prepared=<this>)` now; it waits after its imports. The caller closes it if
    the launch never comes (it also dies with the calling thread, PR_SET_PDEATHSIG)."""
    workdir, cmd, full_env = _setup(module, args, nproc=nproc, env=env, workdir=workdir,
                                    rdzv_id=rdzv_id, python=python, preload=preload)
    for stale in workdir.glob("*.json"):
        stale.unlink()
    held = [*cmd[:cmd.index(FORKRUN) + 1], "--hold", *cmd[cmd.index(FORKRUN) + 1:]]
    log = open(workdir / "launcher.log", "wb")  # noqa: SIM115 - closed by Prepared
    try:
        proc = procs.start(held, stdout=log, stderr=subprocess.STDOUT, env=full_env,
                           stdin=subprocess.PIPE)
    except BaseException:
        log.close()
        raise
    return Prepared(proc, log, held, _key(cmd, env))


def _key(cmd: list[str], env: dict[str, str] | None) -> tuple[Any, ...]:
    """What makes a prepared launcher this launch's: its command and the caller's own variables
    (the rest of the environment is the process's as it was at prepare(): a variable a check
    set in between, such as the digest's CUBLAS_WORKSPACE_CONFIG, does not reach the ranks)."""
    return tuple(cmd), tuple(sorted((env or {}).items()))


def launch(module: str, args: list[str], *, nproc: int, timeout_s: float,
           stall_s: float | None = None, start_timeout_s: float = 120.0,
           env: dict[str, str] | None = None, workdir: str | Path | None = None,
           nnodes: int = 1, world_size: int | None = None, rdzv_endpoint: str | None = None,
           rdzv_id: str | None = None, node_rank: int | None = None,
           local_addr: str | None = None, python: str = sys.executable,
           on_hang: Callable[[Path], object] | None = None,
           preload: Sequence[str] = (), prepared: Prepared | None = None) -> LaunchOutcome:
    """Run `python -m module args` on `nproc` ranks (per node) and supervise it: one host's
    ranks are forked by checks.supervise.forkrun after it imported torch and `preload` once;
    a multi-node launch runs under torchrun's c10d rendezvous. `prepared` (from `prepare()`
    with the same arguments) is that launcher started earlier, its imports done or under way:
    its ranks start now; another launch's, or one that died, is closed and a fresh one started.

    `on_hang(workdir)` runs when the launch is judged hung, before the ranks are killed (the
    trainer asks NCCL's flight recorder for its dump there).

    `world_size` is the total over all nodes (default nproc * nnodes); heartbeats of remote
    ranks are only visible when the workdir is shared, so on one node of a multi-node launch
    only the local ranks are judged.
    """
    workdir, cmd, full_env = _setup(module, args, nproc=nproc, env=env, workdir=workdir,
                                    nnodes=nnodes, rdzv_endpoint=rdzv_endpoint, rdzv_id=rdzv_id,
                                    node_rank=node_rank, local_addr=local_addr,
                                    start_timeout_s=start_timeout_s, python=python,
                                    preload=preload)
    log_path = workdir / "launcher.log"
    expected = set(range(nproc)) if nnodes == 1 else None
    hung, reason = False, ""
    leftovers: list[int] = []
    beats: dict[int, dict[str, Any]] = {}
    ready = prepared is not None and prepared.usable(cmd, env)
    if prepared is not None and not ready:
        prepared.close()  # not this launch, or no longer running: start afresh
    with contextlib.ExitStack() as stack:
        # The launcher in a session of its own, dying with this thread (procs.start); the ranks
        # dying with it (forkrun sets their parent-death signal, torchrun's go through the
        # guard). On any way out of this block (a hang, SIGINT/SIGTERM raised as an exception, a
        # bug) the whole tree is killed.
        if ready:
            assert prepared is not None
            stack.callback(prepared.log.close)
            proc, cmd = prepared.proc, prepared.command
            prepared.go()
        else:
            for stale in workdir.glob("*.json"):
                stale.unlink()
            log = stack.enter_context(open(log_path, "wb"))
            proc = procs.start(cmd, stdout=log, stderr=subprocess.STDOUT, env=full_env,
                               stdin=subprocess.DEVNULL)
        start = time.monotonic()
        try:
            last_total, last_progress = -1, start
            while proc.poll() is None:
                now = time.monotonic()
                beats = _heartbeats(workdir)
                total = sum(int(b["seq"]) for b in beats.values())
                if total != last_total:
                    last_total, last_progress = total, now
                started = set(beats)
                all_started = (expected is None and started) or (expected and expected <= started)
                if now - start > timeout_s:
                    hung, reason = True, f"did not finish within {timeout_s:g} s"
                elif not all_started and now - start > start_timeout_s:
                    hung, reason = True, f"not every rank started within {start_timeout_s:g} s"
                elif all_started and stall_s and now - last_progress > stall_s:
                    hung, reason = True, f"no progress for {stall_s:g} s"
                if hung:
                    break
                time.sleep(0.1)
            beats = _heartbeats(workdir)
            if hung and on_hang is not None:
                on_hang(workdir)
        finally:
            # The ranks' own pids only while torchrun still runs: after a clean exit they may
            # have been reused. Then anything still marked with this launch's workdir (a rank
            # that escaped the group or outlived torchrun) is an orphan: killed, and said so.
            ranks_pids = ([int(b["pid"]) for b in _heartbeats(workdir).values()]
                          if proc.returncode is None else [])
            leftovers = procs.kill_tree(proc, ranks_pids)
            orphans = procs.with_env(ENV_WORKDIR, str(workdir))
            leftovers = sorted(set(leftovers) | set(procs.kill_all(orphans)))
    duration = time.monotonic() - start
    log_text = log_path.read_text(errors="replace")
    ranks = _rank_states(workdir, beats, log_text, hung, nproc if nnodes == 1 else None)
    outcome = LaunchOutcome(ok=False, summary="", ranks=ranks, duration_s=duration,
                            returncode=proc.returncode, command=cmd,
                            log_tail="\n".join(log_text.splitlines()[-40:]),
                            workdir=str(workdir), hung=hung, leftover_pids=leftovers,
                            orphans_killed=orphans, prepared=ready)
    _judge(outcome, reason, world_size or nproc * nnodes)
    return outcome


def _rank_states(workdir: Path, beats: dict[int, dict[str, Any]], log_text: str, hung: bool,
                 nproc: int | None) -> dict[int, RankState]:
    now = time.time()
    exitcodes = {int(r): int(c) for r, c in FAILURE_BLOCK.findall(log_text)}
    ranks = set(beats) | set(exitcodes) | set(range(nproc or 0))
    states = {}
    for rank in sorted(ranks):
        beat = beats.get(rank, {})
        st = RankState(rank=rank, state="stopped", phase=beat.get("phase"), seq=beat.get("seq", 0),
                       heartbeat_age_s=now - beat["time"] if beat else None,
                       host=beat.get("host"), exitcode=exitcodes.get(rank))
        result = _read_json(workdir / f"result-{rank}.json")
        error = _read_json(workdir / f"error-{rank}.json")
        if result is not None:
            st.state, st.result, st.exitcode = "ok", result, st.exitcode or 0
        elif error is not None:
            st.state, st.error = "error", error.get("error")
            st.phase = error.get("phase", st.phase)
        elif rank in exitcodes and exitcodes[rank] != -signal.SIGTERM:
            # SIGTERM comes from torchrun stopping the survivors; anything else is the rank's own
            # (including a rank that died before its first heartbeat).
            st.state = "crashed"
            st.phase = st.phase or "start-up"
        elif not beat:
            st.state = "missing"
        states[rank] = st
    return states


def _judge(outcome: LaunchOutcome, reason: str, world_size: int) -> None:
    ranks = outcome.ranks
    if outcome.hung:
        live = [s for s in ranks.values() if s.state in ("stopped", "missing")]
        missing = [s for s in live if s.state == "missing"]
        if missing:
            culprits = missing
        else:
            # Peers block inside the collective the stuck rank never entered: the ranks with
            # the least progress are the ones that stopped.
            low = min((s.seq for s in live), default=0)
            culprits = [s for s in live if s.seq == low] or live
            for s in culprits:
                s.state = "hung"
        outcome.culprits = [s.rank for s in culprits]
        outcome.summary = f"{reason}: " + "; ".join(s.describe() for s in culprits) + \
            "; process group killed"
        return
    failed = [s for s in ranks.values() if s.state in ("error", "crashed", "missing")]
    done = [s for s in ranks.values() if s.state == "ok"]
    if not failed and outcome.returncode == 0 and len(done) >= min(world_size, len(ranks)) and done:
        outcome.ok = True
        outcome.summary = f"{len(done)} rank(s) finished"
        return
    if not failed:
        tail = outcome.log_tail.strip().splitlines()[-1:] or ["no output"]
        outcome.summary = f"launcher exited with status {outcome.returncode}: {tail[0]}"
        return
    # Blame the ranks that failed on their own, not the ones that lost a peer; a rank that never
    # heartbeated (missing: on a loaded host it may not have got that far before torchrun stopped
    # it) is the culprit only when no rank crashed or failed on its own.
    own = [s for s in failed if s.state == "crashed"
           or (s.state == "error" and not PEER_LOSS.search(s.error or ""))]
    culprits = own or [s for s in failed if s.state == "missing"] or failed
    outcome.culprits = [s.rank for s in culprits]
    outcome.summary = "; ".join(s.describe() for s in culprits)
