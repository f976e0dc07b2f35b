"""What the importers of NVIDIA's driver headers share: checks/devtools/xid_import.py (nverror.h
into checks/kernlog/xid.yaml) and checks/devtools/nvstatus_import.py (nvstatuscodes.h into
checks/kernlog/nvstatus.yaml). Both read the header from a clone of the driver's source at a
release tag (the tag and its commit date recorded) or from a copy of the file (its release and
date given), print the diff against their table, and with --write append the missing rows and
record the release under the table's `sources:`; each importer says how its header is parsed,
how its table is keyed and what a new row looks like."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPOSITORY = "NVIDIA/open-gpu-kernel-modules"
DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


class ImportError_(Exception):
    """Input the import cannot use (one-line message)."""


def git_header(repo: Path, tag: str, path: str) -> tuple[str, str]:
    """(the header's text at `tag` of a clone, the tag's commit date)."""
    def git(*args: str) -> str:
        proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                              timeout=60, check=False)
        if proc.returncode != 0:
            raise ImportError_(f"git {' '.join(args)}: {' '.join(proc.stderr.split()) or 'failed'}")
        return proc.stdout

    return git("show", f"{tag}:{path}"), git("log", "-1", "--format=%cs", tag).strip()


def record_source(text: str, key: str, source: str) -> str:
    """The table's text with `sources.<key>` set to `source` (a folded block, replaced in place
    when there is one)."""
    entry = f"  {key}: >-\n" + textwrap.fill(source, width=100, initial_indent="    ",
                                             subsequent_indent="    ", break_on_hyphens=False) + "\n"
    block = re.compile(rf"^  {re.escape(key)}: >-\n(?:    .*\n)+", re.MULTILINE)
    if block.search(text):
        text = block.sub(lambda _: entry, text, count=1)
    elif (sources := re.search(r"^sources:\n", text, re.MULTILINE)):
        text = text[:sources.end()] + entry + text[sources.end():]
    else:
        raise ImportError_("the table has no 'sources:' mapping")
    return text if text.endswith("\n") else text + "\n"


@dataclass(frozen=True)
class Importer:
    """One header's import: its parser, its table and how the two are compared and written."""
    prog: str
    header_path: str
    table: Path
    table_name: str  # "the XID table"
    parse: Callable[[str, str, str], Any]  # (text, release, date) -> header
    table_rows: Callable[[str], dict[int, dict[str, Any]]]
    diff: Callable[[Any, dict[int, dict[str, Any]]], tuple[list[int], list[str]]]
    write: Callable[[str, Any, list[int]], str]
    source_text: Callable[[Any], str]
    judge: str  # what a person decides for each new row, e.g. "verdict, reason"

    def read_git(self, repo: Path, tag: str) -> Any:
        text, date = git_header(repo, tag, self.header_path)
        return self.parse(text, tag, date)


def _args(imp: Importer, description: str, argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=imp.prog, description=description)
    parser.add_argument("--git", type=Path, help=f"a clone of {REPOSITORY}")
    parser.add_argument("--tag", help="the release tag to read (with --git), e.g. 595.45.04")
    parser.add_argument("--header", type=Path, help=f"a copy of {imp.header_path}")
    parser.add_argument("--release", help="the driver release the --header copy is from")
    parser.add_argument("--date", help="that release's date, YYYY-MM-DD (with --header)")
    parser.add_argument("--table", type=Path, default=imp.table,
                        help=f"{imp.table_name} (default: %(default)s)")
    parser.add_argument("--write", action="store_true", help="add the missing rows to the table")
    args = parser.parse_args(argv)
    if bool(args.git) == bool(args.header):
        parser.error("give either --git DIR --tag TAG or --header FILE --release R --date D")
    if args.git and not args.tag:
        parser.error("--git needs --tag")
    if args.header and not (args.release and args.date and DATE.fullmatch(args.date)):
        parser.error("--header needs --release and --date YYYY-MM-DD")
    return args


def main(imp: Importer, description: str, argv: list[str] | None = None) -> int:
    args = _args(imp, description, argv)
    try:
        if args.git:
            header = imp.read_git(args.git, args.tag)
        else:
            header = imp.parse(args.header.read_text(encoding="utf-8"), args.release, args.date)
        text = args.table.read_text(encoding="utf-8")
        new, lines = imp.diff(header, imp.table_rows(text))
        if args.write and new:
            fresh = imp.write(text, header, new)
            imp.table_rows(fresh)  # still a table
            args.table.write_text(fresh, encoding="utf-8")
    except (ImportError_, OSError, UnicodeDecodeError, yaml.YAMLError, KeyError, ValueError,
            TypeError, subprocess.TimeoutExpired) as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    print(f"{imp.source_text(header)}; table {args.table.name}: {len(new)} new")
    print("\n".join(lines))
    if args.write and new:
        print(f"wrote {len(new)} rows to {args.table}: judge each ({imp.judge}) before committing")
    return 0
