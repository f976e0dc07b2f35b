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
    if cuda_devices():
        return
    reason = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(reason)
