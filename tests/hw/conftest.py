"""Fixtures for the hardware layer: the real pynvml over a fake C library (fakenvml.py)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# pytest runs with --import-mode=importlib, which puts no test directory on sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parent))

import fakenvml


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch
              ) -> Iterator[Callable[..., fakenvml.FakeNvmlLibrary | None]]:
    """install(library) puts a FakeNvmlLibrary behind pynvml for this test. At the end, any
    fault inside the fake (a callback that raised, a function pynvml wanted that the fake lacks)
    fails the test, so a gap in the fake cannot pass as an NVML answer."""
    installed: list[fakenvml.FakeNvmlLibrary] = []

    def install(library: fakenvml.FakeNvmlLibrary | None) -> fakenvml.FakeNvmlLibrary | None:
        if library is not None:
            installed.append(library)
        return fakenvml.install(monkeypatch, library)

    yield install
    for library in installed:
        library.release.set()
        assert not library.problems, library.problems
