"""What every `main(argv) -> int` of the project shares."""

from __future__ import annotations

import argparse
from collections.abc import Sequence


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace | int:
    """Parsed arguments, or the exit status when argparse has already answered (--help: 0, a
    usage error: 2, its one-line message printed) instead of raising SystemExit at the caller."""
    try:
        return parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
