"""What every `main(argv) -> int` of the project shares."""

from __future__ import annotations

import argparse
import math
import os
import stat
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import NoReturn

from checks import safeio


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace | int:
    """Parsed arguments, or the exit status when argparse has already answered (--help: 0, a
    usage error: 2, its one-line message printed) instead of raising SystemExit at the caller.
    A usage error is one line, `error: ...` (argparse would print its usage block first); --help
    still shows the usage."""
    for each in _parsers(parser):
        each.error = _one_line_error  # type: ignore[method-assign]
    try:
        return parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)


def number(kind: type[int] | type[float] = float, *, minimum: float | None = None,
           above: float | None = None, maximum: float | None = None) -> Callable[[str], int | float]:
    """An argparse `type=` for a finite number (NaN and infinities are usage errors: a NaN limit
    makes every comparison false, so a check against it could never fail), at least `minimum` or
    more than `above`, at most `maximum`."""

    def parse(text: str) -> int | float:
        value = kind(text)  # ValueError: argparse says "invalid int value: 'eight'"
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"not a finite number: {text!r}")
        if minimum is not None and value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum:g}: {text!r}")
        if above is not None and value <= above:
            raise argparse.ArgumentTypeError(f"must be more than {above:g}: {text!r}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {maximum:g}: {text!r}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


def _one_line_error(message: str) -> NoReturn:
    """argparse's `error` without its usage block: the README promises one line and exit 2."""
    print(f"error: {' '.join(message.split())}", file=sys.stderr)
    raise SystemExit(2)


def _parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """The parser and every subcommand's parser under it."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                yield from _parsers(sub)


def output_file(text: str) -> str:
    """An argparse `type=` for an output file: not empty, and not an existing symlink, device,
    FIFO or directory (only regular files are replaced: checks/safeio.py); '-' passes through
    for the options that write to stdout."""
    if not text:
        raise argparse.ArgumentTypeError("empty file name")
    if text == "-":
        return text
    try:
        info = os.lstat(text)
    except FileNotFoundError:
        safeio.remember(text)  # absent: created, unless another run creates it first
        return text
    except OSError:
        return text  # unreachable: the write says why
    if stat.S_ISLNK(info.st_mode):
        raise argparse.ArgumentTypeError(f"a symlink; only regular files are replaced: {text!r}")
    if not stat.S_ISREG(info.st_mode):
        raise argparse.ArgumentTypeError(f"not a regular file; only regular files are replaced: {text!r}")
    safeio.remember(text)  # another run's file there, written while this one runs, is not replaced
    return text
