"""The options table of docs/checks.md, generated from the parser `python -m checks` uses
(`checks.node.node_cli.build_parser`), so an option added to the parser and not documented
makes `--check` fail.

    python -m checks.docgen.options            # print the table
    python -m checks.docgen.options --write    # refresh docs/checks.md in place
    python -m checks.docgen.options --check    # exit 1 when docs/checks.md is out of date
"""

from __future__ import annotations

import argparse
import sys

from checks.docgen.regions import ROOT, Region
from checks.docgen.regions import main as regions_main

PROG = "checks.docgen.options"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _invocation(action: argparse.Action) -> str:
    if action.nargs == 0:
        return ", ".join(f"`{flag}`" for flag in action.option_strings)
    if action.metavar is not None:
        metavar = str(action.metavar)
    elif action.choices is not None:
        metavar = "|".join(str(c) for c in action.choices)
    else:
        metavar = action.dest.upper()
    return ", ".join(f"`{flag} {metavar}`" for flag in action.option_strings)


# Lists in a help text that change with every shipped file and are generated elsewhere in the
# docs: the table names where instead, so a new scenario does not make this table stale.
ELIDED = {"simulate": ("shipped scenarios: ",
                        "shipped scenarios: every name in [scenarios.md](scenarios.md)")}


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    text = action.help or ""
    if action.dest in ELIDED:
        lead, instead = ELIDED[action.dest]
        head, found, _ = text.partition(lead)
        text = head + instead if found else text
    if "%" in text:  # %(default)s and friends, expanded as --help expands them
        text = text % {**vars(action), "prog": parser.prog,
                       "default": action.default, "choices": ", ".join(map(str, action.choices or ()))}
    return text


def table(parser: argparse.ArgumentParser | None = None) -> str:
    if parser is None:
        from checks.node.node_cli import build_parser

        parser = build_parser()
    rows = ["| option | meaning |", "|---|---|"]
    for action in parser._actions:  # argparse keeps no public list of its actions
        if not action.option_strings or action.help == argparse.SUPPRESS:
            continue
        rows.append(f"| {_cell(_invocation(action))} | {_cell(_help(parser, action))} |")
    return "\n".join(rows)


REGIONS = [Region(ROOT / "docs" / "checks.md", "options",
                  "the help= texts in checks/node/node_cli.py build_parser()", table)]


def main(argv: list[str] | None = None) -> int:
    return regions_main(PROG, REGIONS, argv)


if __name__ == "__main__":
    sys.exit(main())
