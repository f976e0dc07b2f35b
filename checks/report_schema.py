"""The JSON report: one document per host and run, validated against schema/report.schema.json."""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
from collections import Counter
from pathlib import Path
from typing import Any

from checks import __version__, resources
from checks.model import CheckOutcome, Status

SCHEMA_PATH = resources.data("schema", "report.schema.json")
SCHEMA_VERSION = "1.0"
# Environment variables that change NCCL/gloo/torch behaviour are recorded with the results.
RECORDED_ENV_PREFIXES = ("NCCL_", "GLOO_", "TORCH_", "CUDA_", "OMP_NUM_THREADS", "NVIDIA_")


def recorded_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    environ = dict(os.environ if environ is None else environ)
    return {k: v for k, v in sorted(environ.items()) if k.startswith(RECORDED_ENV_PREFIXES)}


def build(outcomes: list[CheckOutcome], *, meta: dict[str, Any]) -> dict[str, Any]:
    counts = Counter(str(o.status) for o in outcomes)
    failed = any(o.status.is_problem for o in outcomes)
    return {
        "schema": "nodecert-report",
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "nodecert", "version": __version__},
        "host": meta.get("host") or socket.gethostname(),
        "run_id": meta.get("run_id"),
        "started_at": meta.get("started_at") or dt.datetime.now(dt.UTC).isoformat(),
        "duration_s": round(float(meta.get("duration_s", 0.0)), 3),
        "level": meta.get("level"),
        "backend": meta.get("backend"),
        "scenario": meta.get("scenario"),
        "profile": meta.get("profile"),
        "options": meta.get("options", {}),
        "system": meta.get("system", {}),
        "environment": meta.get("environment", {}),
        "summary": {s.value: counts.get(s.value, 0) for s in Status},
        "verdict": "FAIL" if failed else "PASS",
        "exit_code": 1 if failed else 0,
        "checks": [o.to_dict() for o in outcomes],
    }


def write(report: dict[str, Any], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(report, indent=2, default=str) + "\n")
    tmp.replace(path)
    return path


def schema() -> dict[str, Any]:
    return json.loads(SCHEMA_PATH.read_text())
