"""Fixtures for the workload-check tests."""

from __future__ import annotations

import json
from collections.abc import Callable
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
