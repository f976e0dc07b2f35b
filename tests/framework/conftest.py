from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from checks.node import node_cli as cli


@pytest.fixture
def run_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """Run `python -m checks` through main(argv); return (exit code, report dict, stderr)."""

    def run(*argv: str) -> tuple[int, dict[str, Any] | None, str]:
        out = tmp_path / "report.json"
        code = cli.main([*argv, "--json", str(out), "--quiet"])
        err = capsys.readouterr().err
        report = json.loads(out.read_text()) if out.exists() else None
        return code, report, err

    return run
