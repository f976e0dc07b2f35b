"""What every `main(argv) -> int` of the project shares."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace | int:
    """Parsed arguments, or the exit status when argparse has already answered (--help: 0, a
    usage error: 2, its one-line message printed) instead of raising SystemExit at the caller."""
    try:
        return parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)


def number(kind: type[int] | type[float] = float, *, minimum: float | None = None,
           above: float | None = None) -> Callable[[str], int | float]:
    """An argparse `type=` for a finite number (NaN and infinities are usage errors: a NaN limit
    makes every comparison false, so a check against it could never fail), at least `minimum` or
    more than `above`."""

    def parse(text: str) -> int | float:
        value = kind(text)  # ValueError: argparse says "invalid int value: 'eight'"
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"not a finite number: {text!r}")
        if minimum is not None and value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum:g}: {text!r}")
        if above is not None and value <= above:
            raise argparse.ArgumentTypeError(f"must be more than {above:g}: {text!r}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse
