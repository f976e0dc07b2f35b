"""Shared pytest setup: GPU-marked tests skip cleanly on machines without a CUDA device."""

from __future__ import annotations

import functools

import pytest


@functools.cache
def cuda_devices() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
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
