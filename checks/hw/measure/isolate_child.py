"""Child side of isolate.py: run one workload in this process and hand the result back as JSON.

    echo '{"device": "cpu", "dtypes":["fp32"],"n":64}' | python -m checks.hw.measure.isolate_child matmul -

Its own module so that the parent side (isolate.py, imported by local.py) does not import the
Linux backend that imports local.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from checks.hw.base import NotSupported


def main(argv: list[str] | None = None) -> int:
    """Child side: `python -m checks.hw.measure.isolate_child NAME RESULT_FILE|-` with JSON on stdin."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m checks.hw.measure.isolate_child NAME RESULT_FILE|- < params.json",
              file=sys.stderr)
        return 2
    name, target = args
    reply: dict[str, Any]
    try:
        params = json.loads(sys.stdin.read() or "{}")
        if not isinstance(params, dict):
            raise ValueError("parameters must be a JSON object")
        from checks.hw.linux import LinuxBackend
        from checks.hw.measure import local

        handler = local.HANDLERS.get(name)
        if handler is None:
            raise NotSupported(f"unknown workload {name!r}")
        reply = {"result": handler(LinuxBackend(), **params)}
    except NotSupported as exc:
        reply = {"error": str(exc), "kind": "not_supported"}
    except Exception as exc:  # the parent reports it as the check's ERROR, in one line
        reply = {"error": f"{type(exc).__name__}: {' '.join(str(exc).split())}",
                 "kind": "hardware"}
    try:
        text = json.dumps(reply)
    except (TypeError, ValueError) as exc:
        text = json.dumps({"error": f"result of {name!r} is not JSON: {exc}", "kind": "hardware"})
    if target == "-":
        print(text)
    else:
        Path(target).write_text(text)
    return 0 if "result" in reply else 1


if __name__ == "__main__":
    sys.exit(main())
