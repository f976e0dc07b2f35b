"""Rank-side helpers: progress heartbeats, result/error files, and test fault injection.

Every rank started by `launch.launch()` finds NODECERT_WORKDIR in its environment. It calls
`beat("phase")` as it makes progress; the supervisor names the ranks whose progress stopped
first when a collective hangs. Results and errors go to per-rank JSON files.

Fault injection (tests only): NODECERT_INJECT="KIND:RANK[@PHASE][,...]" where KIND is
hang (sleep forever), exit (os._exit(3)), kill (SIGKILL itself), raise (an exception), or
corrupt (the caller asks `should_corrupt()` and sends wrong data). RANK `*` matches every rank
of the process that has the variable (across hosts, c10d assigns ranks by arrival). Without
@PHASE the fault fires at the first heartbeat.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ENV_WORKDIR = "NODECERT_WORKDIR"
ENV_INJECT = "NODECERT_INJECT"


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, default=str))
    tmp.replace(path)


class Rank:
    """Identity and reporting channel of one rank."""

    def __init__(self) -> None:
        self.rank = int(os.environ.get("RANK", "0"))
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.host = socket.gethostname()
        workdir = os.environ.get(ENV_WORKDIR)
        self.workdir = Path(workdir) if workdir else None
        self.seq = 0
        self.phase = "started"
        self._faults = _parse_faults(os.environ.get(ENV_INJECT, ""))
        self.beat("started")

    @property
    def prefix(self) -> str:
        return f"[{self.host}:{self.rank}]"

    def log(self, message: str) -> None:
        print(f"{self.prefix} {message}", flush=True)

    def beat(self, phase: str) -> None:
        """Record progress. Call before entering anything that can block (a collective)."""
        # Faults fire before the phase is announced, as a rank stuck in its own work would.
        self._maybe_inject(phase)
        self.seq += 1
        self.phase = phase
        if self.workdir is not None:
            _write_json(self.workdir / f"heartbeat-{self.rank}.json",
                        {"rank": self.rank, "seq": self.seq, "phase": phase, "time": time.time(),
                         "pid": os.getpid(), "host": self.host})

    def should_corrupt(self, phase: str | None = None) -> bool:
        return any(k == "corrupt" and r in (None, self.rank) and (p is None or p == phase)
                   for k, r, p in self._faults)

    def _maybe_inject(self, phase: str) -> None:
        for kind, rank, at in self._faults:
            if rank not in (None, self.rank) or kind == "corrupt" or (at is not None and at != phase):
                continue
            if at is None and self.seq > 0:
                continue
            if kind == "hang":
                self.log(f"injected fault: hanging at {phase}")
                while True:
                    time.sleep(3600)
            if kind == "exit":
                self.log(f"injected fault: exiting with status 3 at {phase}")
                os._exit(3)
            if kind == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if kind == "raise":
                raise RuntimeError(f"injected fault at {phase}")

    def result(self, data: dict[str, Any]) -> None:
        if self.workdir is not None:
            _write_json(self.workdir / f"result-{self.rank}.json", data)

    def error(self, exc: BaseException) -> None:
        if self.workdir is not None:
            _write_json(self.workdir / f"error-{self.rank}.json", {
                "rank": self.rank, "phase": self.phase, "time": time.time(),
                "error": f"{type(exc).__name__}: {exc}",
                "traceback": "".join(traceback.format_exception(exc))[-4000:]})


def _parse_faults(spec: str) -> list[tuple[str, int | None, str | None]]:
    faults = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        kind, _, rest = item.partition(":")
        rank, _, phase = rest.partition("@")
        faults.append((kind, None if rank == "*" else int(rank), phase or None))
    return faults


def run_rank(body: Callable[[Rank], dict[str, Any]]) -> int:
    """Run `body` as this rank's main; its returned dict becomes the rank's result file."""
    rank = Rank()
    try:
        result = body(rank)
    except BaseException as exc:
        rank.error(exc)
        rank.log(f"FAILED in {rank.phase}: {type(exc).__name__}: {exc}")
        return 1
    rank.beat("done")
    rank.result(result)
    return 0
