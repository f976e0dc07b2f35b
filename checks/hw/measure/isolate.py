"""Run one GPU measurement in a child process, so the supervising process never holds a CUDA
context.

Why: a CUDA context lives as long as its process. If `python -m checks` measured the GPUs
itself, it would keep a context on every GPU for the rest of the run, and on a GPU in compute
mode EXCLUSIVE_PROCESS every later process (the torchrun ranks of nccl-allreduce, the
acceptance jobs) would be refused: false FAILs that say nothing about the hardware. A child
that exits frees its contexts before the next check starts. A hard deadline kills the child's
whole process group (a GPU call stuck in the driver cannot hang the run).

Protocol: the parent writes the parameters as JSON to the child's stdin; the child writes
{"result": ...} or {"error": ..., "kind": ...} as JSON to the file named on its command line.
By hand (prints the result):

    echo '{"device": "cpu", "dtypes":["fp32"],"n":64}' | python -m checks.hw.measure.isolate_child matmul -
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from checks.hw.base import HardwareError, NotSupported
from checks.supervise import procs

MODULE = "checks.hw.measure.isolate_child"  # the child side


def _pythonpath() -> str:
    root = str(Path(__file__).resolve().parents[3])
    current = os.environ.get("PYTHONPATH")
    return f"{root}{os.pathsep}{current}" if current else root


def _tail(text: str, lines: int = 3) -> str:
    kept = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return " | ".join(kept[-lines:])


def run_child(name: str, params: Mapping[str, Any], *, timeout_s: float,
              python: str = sys.executable) -> Any:
    """The measurement `name` with `params`, computed in a child process. Raises NotSupported or
    HardwareError (one line) when the child reports one, crashes or passes its deadline."""
    with tempfile.TemporaryDirectory(prefix="nodecert-measure-") as tmp:
        out = Path(tmp) / "result.json"
        env = {**os.environ, "PYTHONPATH": _pythonpath()}
        # procs.run: a session of its own, killed with this process, and on the way out its
        # whole group (DataLoader workers, any leftover of a finished child) is killed too.
        try:
            proc = procs.run([python, "-m", MODULE, name, str(out)], timeout_s=timeout_s,
                             input=json.dumps(dict(params)), stderr=subprocess.STDOUT,
                             text=True, env=env)
        except subprocess.TimeoutExpired:
            raise HardwareError(f"measurement {name!r} did not finish within {timeout_s:g} s; "
                                f"its process group was killed") from None
        try:
            reply = json.loads(out.read_text())
        except (OSError, ValueError):
            raise HardwareError(f"measurement {name!r} died (exit status {proc.returncode}) "
                                f"without a result: {_tail(proc.stdout or '') or 'no output'}"
                                ) from None
    if "error" in reply:
        kind = NotSupported if reply.get("kind") == "not_supported" else HardwareError
        raise kind(f"{reply['error']}")
    return reply["result"]
