"""Example output in the docs, produced by real runs of a shipped scenario in this process:

- README.md `example-output`: `python -m checks --simulate node-gpu-lost --level quick` as the
  terminal shows it 100 columns wide: the rows of the checks that failed, one check that could
  not measure the lost GPU, and the summary line, whose counts are the whole run's;
- docs/fleet.md `fleet-compact`: `python -m checks.fleet report DIR --format compact` over that
  run's JSON report, saved as the host node0009.

Two things differ from run to run and are fixed here: the host name (the scenario's name in the
title; node0009 for the fleet) and the run's duration (shown as 0.0 s).

    python -m checks.docgen.example_output            # print both
    python -m checks.docgen.example_output --write    # refresh README.md and docs/fleet.md
    python -m checks.docgen.example_output --check    # exit 1 when one is out of date
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from checks.docgen.regions import ROOT, Region
from checks.docgen.regions import main as regions_main

PROG = "checks.docgen.example_output"
SCENARIO = "node-gpu-lost"
WIDTH = 100
FLEET_HOST = "node0009"
# The rows shown: every FAIL, then the first check that could not measure the lost GPU.
SHOWN_ERRORS = 1


@functools.cache
def report() -> dict[str, Any]:
    from checks.node import node_cli

    with tempfile.TemporaryDirectory(prefix="nodecert-docgen-") as tmp:
        path = Path(tmp) / "report.json"
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            node_cli.main(["--simulate", SCENARIO, "--level", "quick", "--json", str(path), "-q"])
        doc: dict[str, Any] = json.loads(path.read_text())
    doc["host"], doc["duration_s"] = SCENARIO, 0.0
    return doc


def terminal() -> str:
    from rich.console import Console

    from checks.render import terminal as render

    doc = dict(report())
    failed = [c for c in doc["checks"] if c["status"] == "FAIL"]
    errors = [c for c in doc["checks"] if c["status"] == "ERROR"][:SHOWN_ERRORS]
    keep = {c["id"] for c in (*failed, *errors)}
    doc["checks"] = [c for c in doc["checks"] if c["id"] in keep]
    out = io.StringIO()
    console = Console(file=out, width=WIDTH, color_system=None, emoji=False, highlight=False,
                      force_terminal=False)
    render.render(doc, console)
    lines = [line.rstrip() for line in out.getvalue().splitlines()]
    return "\n".join(["```", *lines, "```"])


def fleet_compact() -> str:
    from checks.fleet import fleet_cli

    with tempfile.TemporaryDirectory(prefix="nodecert-docgen-") as tmp:
        run = Path(tmp) / "run"
        run.mkdir(mode=0o700)
        doc = dict(report(), host=FLEET_HOST)
        (run / f"{FLEET_HOST}.json").write_text(json.dumps(doc))
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            fleet_cli.main(["report", str(run), "--format", "compact", "--no-history"])
    lines = [line for line in out.getvalue().splitlines() if line.startswith(("FAIL ", "WARN "))
             and not line.startswith("FAIL  run")]
    return "\n".join(["```", *lines, "```"])


REGIONS = [
    Region(ROOT / "README.md", "example-output", f"the checks (a run of --simulate {SCENARIO})",
           terminal),
    Region(ROOT / "docs" / "fleet.md", "fleet-compact",
           f"the checks and checks/fleet/ (a run of --simulate {SCENARIO})", fleet_compact),
]


def main(argv: list[str] | None = None) -> int:
    return regions_main(PROG, REGIONS, argv)


if __name__ == "__main__":
    sys.exit(main())
