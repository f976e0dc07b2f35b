"""Shared pytest setup: GPU-marked tests skip cleanly on machines without a CUDA device."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest


@functools.cache
def cuda_devices() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # `make test` runs two xdist workers with --dist loadgroup: a test file is one group (its
    # module fixtures: the shared acceptance launch, a Slurm cluster, are built once), and the
    # whole e2e suite is one group (debootstrapped roots, the stand-in repository), which runs
    # on one worker while the other works through the rest.
    tests_dir = Path(__file__).resolve().parent
    for item in items:
        try:
            parts = Path(str(item.fspath)).resolve().relative_to(tests_dir).parts
        except ValueError:
            continue
        item.add_marker(pytest.mark.xdist_group("e2e" if parts[0] == "e2e" else "/".join(parts)))
    if cuda_devices():
        return
    reason = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(reason)
