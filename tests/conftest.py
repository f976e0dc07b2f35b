"""Shared pytest setup: GPU-marked tests skip cleanly on machines without a CUDA device; the
longest test files start first (tests/durations.json)."""

from __future__ import annotations

import functools
import json
import statistics
from pathlib import Path

import pytest

# Seconds each test file took in a full `make test` run (written by tests/durations.py from a JUnit
# XML). Only the order uses it: `make test` hands whole files to its two workers as they free up
# (--dist loadfile --no-loadscope-reorder), so the longest go first and no 10-minute e2e file is
# left to start alone at the end. A file not listed counts as the median one.
DURATIONS = Path(__file__).with_name("durations.json")


@functools.cache
def cuda_devices() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _longest_files_first(items: list[pytest.Item]) -> None:
    try:
        seconds: dict[str, float] = json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        return
    usual = statistics.median(seconds.values()) if seconds else 0.0
    # Stable: the tests of one file keep their order (module fixtures, parametrisations).
    items.sort(key=lambda item: -seconds.get(item.nodeid.split("::", 1)[0], usual))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _longest_files_first(items)
    # (`make test` runs two xdist workers with --dist loadfile: a test file stays on one worker,
    # so its module fixtures (the shared acceptance launch, a Slurm cluster, an e2e converge) are
    # built once. What e2e files share across a session (debootstrapped root tarballs, the
    # wheelhouse, the apt proxy's cache) is cached on disk under a file lock. Not loadgroup:
    # xdist 3.8 tags the group onto `item._nodeid`, which pytest 9 no longer reads, so every
    # group was silently ignored.)
    if cuda_devices():
        return
    reason = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(reason)
