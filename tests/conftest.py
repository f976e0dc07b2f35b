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
    # `make test` runs two xdist workers with --dist loadgroup: each suite directory is one group,
    # so a suite's expensive session fixtures (debootstrapped roots, the shared acceptance
    # launch, a Slurm cluster) are built once, and the slow e2e suite runs beside the others.
    tests_dir = Path(__file__).resolve().parent
    for item in items:
        try:
            suite = Path(str(item.fspath)).resolve().relative_to(tests_dir).parts[0]
        except ValueError:
            continue
        item.add_marker(pytest.mark.xdist_group(suite))
    if cuda_devices():
        return
    reason = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(reason)
