"""What disk-space must say on this machine, read independently of the check (os.statvfs of the
venv's and torch's directories against the generic profile's lines).

The tests that run the real checks on this host expect a PASS verdict, but disk-space judges a
shared resource: a CI host with under 5 GiB free must get disk-space FAIL and a non-zero exit, and
the test must say so instead of failing a correct check. Free space is read before and after the
run; where it crosses the line in between, either verdict is right."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import yaml

GENERIC = Path(__file__).resolve().parents[1] / "checks" / "profiles" / "generic.yaml"


def fail_line() -> int:
    return int(yaml.safe_load(GENERIC.read_text())["storage"]["free_fail_bytes"])


def free_bytes() -> int:
    """The least free space (f_bavail) over the file systems of the venv and torch."""
    spec = importlib.util.find_spec("torch")
    paths = [sys.prefix] + ([os.path.dirname(spec.origin)] if spec and spec.origin else [])
    return min(st.f_bavail * st.f_frsize for st in map(os.statvfs, paths))


class Window:
    """Free space read around a run: `with Window() as disk: run(...)`, then disk.allowed()."""

    def __enter__(self) -> Window:
        self.line = fail_line()
        self.before = free_bytes()
        return self

    def __exit__(self, *exc: object) -> None:
        self.after = free_bytes()

    def allowed(self) -> set[str]:
        """The disk-space statuses that are right for what was measured around the run."""
        seen = {self.before >= self.line, self.after >= self.line}
        return ({"PASS", "WARN"} if True in seen else set()) | ({"FAIL"} if False in seen else set())
