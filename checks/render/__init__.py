"""Renderers over host reports, behind one interface: `write(kind, reports, path)` writes the
reports as `kind` (junit, html, prometheus) and returns the path written; `terminal.render`
prints one report. The JSON report itself is built by checks/report_schema.py. Each renderer is
imported when asked for, so a health check that writes none pays for none of them."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

WRITERS = {"junit": "checks.render.junit", "html": "checks.render.html",
           "prometheus": "checks.render.prometheus"}


def write(kind: str, reports: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """Write `reports` as `kind` to `path` (atomically, through checks.safeio)."""
    module = importlib.import_module(WRITERS[kind])
    return Path(module.write(list(reports), path))
