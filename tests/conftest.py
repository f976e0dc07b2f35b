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


# tryfirst: xdist turns xdist_group markers into node ids in its own collection hook, and a
# root conftest registers before xdist's worker plugin, so it would otherwise run after xdist
# had read the markers (every group silently ignored).
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # `make test` runs two xdist workers with --dist loadgroup: a test file is one group, so its
    # module fixtures (the shared acceptance launch, a Slurm cluster, an e2e converge) are built
    # once. What e2e files share across a session (debootstrapped root tarballs, the wheelhouse,
    # the apt proxy's cache) is cached on disk under a file lock, so both workers reuse it.
    tests_dir = Path(__file__).resolve().parent
    for item in items:
        try:
            parts = Path(str(item.fspath)).resolve().relative_to(tests_dir).parts
        except ValueError:
            continue
        item.add_marker(pytest.mark.xdist_group("/".join(parts)))
    if cuda_devices():
        return
    reason = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(reason)
