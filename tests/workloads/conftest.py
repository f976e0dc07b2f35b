"""Fixtures for the workload-check tests."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from checks.node import node_cli as cli

RunCli = Callable[..., tuple[int, dict[str, Any] | None]]


@pytest.fixture
def run_cli(tmp_path: Path) -> RunCli:
    """`python -m checks ARGS` through main(argv); (exit code, JSON report)."""

    def run(*argv: str) -> tuple[int, dict[str, Any] | None]:
        out = tmp_path / "report.json"
        code = cli.main([*argv, "--json", str(out), "--quiet"])
        return code, json.loads(out.read_text()) if out.exists() else None

    return run


class OneRank:
    """The supervised rank a collective sweep talks to, for the rank program's pieces run in the
    test's own process on a one-rank gloo group (no launch)."""
    rank = local_rank = 0
    world_size = 1

    def beat(self, phase: str) -> None:
        self.last = phase

    def should_corrupt(self, op: str) -> bool:
        return False


@pytest.fixture
def one_rank_group(tmp_path: Path) -> Iterator[tuple[Any, OneRank]]:
    """(collective_rank.Collectives on the CPU, its rank) inside a one-rank gloo process group."""
    import torch
    import torch.distributed as dist

    from checks.hw.measure import collective_rank

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        rank = OneRank()
        yield collective_rank.Collectives(rank, torch.device("cpu")), rank  # type: ignore[arg-type]
    finally:
        dist.destroy_process_group()
