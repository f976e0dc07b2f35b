"""Import the driver status codes a release defines into checks/kernlog/nvstatus.yaml, with the diff.

The source is NVIDIA's own: `src/common/sdk/nvidia/inc/nvstatuscodes.h` of
NVIDIA/open-gpu-kernel-modules, one `NV_STATUS_CODE(NAME, 0xCODE, "text")` per status, read from
a clone at a release tag (the tag and its commit date are recorded) or from a copy of the file
(then say which release and date it is):

    python -m checks.devtools.nvstatus_import --git ~/src/open-gpu-kernel-modules --tag 595.45.04
    python -m checks.devtools.nvstatus_import --header nvstatuscodes.h --release 595.45.04 --date 2026-03-05
    ... --write      # also add the missing rows and record the release in the table's sources

Why a table of every status: the driver prints these names and codes in its assertion, check and
RPC-failure lines (`Assertion failed: ... [NV_ERR_GPU_IS_LOST] (0x0000000F) returned from ...`,
`rpcSendMessage failed with status 0x0000000f ...`), often with no Xid line; xid-events judges
such lines by the row of their status. Most statuses are a caller's error and mean nothing for the
node (`remedy: none`); the few that mean the GPU needs a reset, has left the bus or is in a fatal
state carry a remedy and the reason, judged by hand from the header's own wording.

It prints the diff against the table: statuses the header defines that the table lacks (`+`),
codes whose name differs (`~`, left as they are) and how many table rows the header no longer
defines (kept). `--write` adds only the missing statuses, each with `remedy: none` and the release
in its `why`, and records the release under `sources`; nothing else in the table changes, so the
review sees every decision. Only the codes and names are taken from the header, none of its text.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "checks" / "kernlog" / "nvstatus.yaml"
HEADER_PATH = "src/common/sdk/nvidia/inc/nvstatuscodes.h"
REPOSITORY = "NVIDIA/open-gpu-kernel-modules"
# NV_STATUS_CODE(NV_ERR_GPU_IS_LOST,   0x0000000F, "...") at the start of a line (the header's
# own `#define NV_STATUS_CODE` lines in other files are not in this one).
STATUS = re.compile(r"^NV_STATUS_CODE\(\s*(NV_[A-Z0-9_]{1,64})\s*,\s*0x([0-9A-Fa-f]{1,8})\s*,",
                    re.MULTILINE)
DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


class ImportError_(Exception):
    """Input the import cannot use (one-line message)."""


@dataclass(frozen=True)
class Header:
    codes: dict[int, str]  # code -> the driver's name, in header order
    release: str
    date: str


def parse(text: str, release: str, date: str) -> Header:
    """The statuses of an nvstatuscodes.h: every NV_STATUS_CODE line; a code or a name defined
    twice is refused (the table keys on both)."""
    codes: dict[int, str] = {}
    names: set[str] = set()
    for name, value in STATUS.findall(text):
        code = int(value, 16)
        if code in codes or name in names:
            raise ImportError_(f"{name} (0x{code:08X}) defined twice: not the driver's "
                               "nvstatuscodes.h, or a header this import does not understand")
        codes[code] = name
        names.add(name)
    if "NV_OK" not in names:
        raise ImportError_("no NV_STATUS_CODE(NV_OK, ...) line: not the driver's nvstatuscodes.h")
    return Header(codes=codes, release=release, date=date)


def read_git(repo: Path, tag: str) -> Header:
    """nvstatuscodes.h at `tag` of a clone, with the tag's commit date."""
    def git(*args: str) -> str:
        proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                              timeout=60, check=False)
        if proc.returncode != 0:
            raise ImportError_(f"git {' '.join(args)}: {' '.join(proc.stderr.split()) or 'failed'}")
        return proc.stdout

    return parse(git("show", f"{tag}:{HEADER_PATH}"), tag, git("log", "-1", "--format=%cs", tag).strip())


def table_rows(text: str) -> dict[int, dict]:
    data = yaml.safe_load(text)
    if not isinstance(data, dict) or not isinstance(data.get("statuses"), list):
        raise ImportError_("the table has no 'statuses' list")
    return {int(row["code"]): row for row in data["statuses"]}


def diff(header: Header, rows: dict[int, dict]) -> tuple[list[int], list[str]]:
    """(codes to add, the diff's lines)."""
    new = [code for code in header.codes if code not in rows]
    lines = [f"+ 0x{code:08X} {header.codes[code]}" for code in new]
    for code in sorted(set(header.codes) & set(rows)):
        if rows[code]["name"] != header.codes[code]:
            lines.append(f"~ 0x{code:08X} table {rows[code]['name']}, driver {header.codes[code]}")
    gone = sorted(set(rows) - set(header.codes))
    lines.append(f"= {len(gone)} table rows the header does not define (retired codes, kept)")
    return new, lines


def source_text(header: Header) -> str:
    return (f"{REPOSITORY} {HEADER_PATH} at release {header.release} ({header.date}): every "
            f"status code and its name, {len(header.codes)} in all "
            "(checks/devtools/nvstatus_import.py)")


def new_row(code: int, header: Header) -> str:
    return (f"  - {{code: 0x{code:08X}, name: {header.codes[code]}, remedy: none}}"
            f"  # new in {header.release}\n")


def write(text: str, header: Header, new: list[int]) -> str:
    """The table's text with the new rows appended and the release recorded under sources."""
    entry = "  header: >-\n" + textwrap.fill(source_text(header), width=100, initial_indent="    ",
                                             subsequent_indent="    ", break_on_hyphens=False) + "\n"
    block = re.compile(r"^  header: >-\n(?:    .*\n)+", re.MULTILINE)
    if block.search(text):
        text = block.sub(lambda _: entry, text, count=1)
    elif (sources := re.search(r"^sources:\n", text, re.MULTILINE)):
        text = text[:sources.end()] + entry + text[sources.end():]
    else:
        raise ImportError_("the table has no 'sources:' mapping")
    text = re.sub(r"^statuses: \[\]\n", "statuses:\n", text, count=1, flags=re.MULTILINE)
    if not text.endswith("\n"):
        text += "\n"
    return text + "".join(new_row(code, header) for code in new)


def _args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m checks.devtools.nvstatus_import",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--git", type=Path, help=f"a clone of {REPOSITORY}")
    parser.add_argument("--tag", help="the release tag to read (with --git), e.g. 595.45.04")
    parser.add_argument("--header", type=Path, help=f"a copy of {HEADER_PATH}")
    parser.add_argument("--release", help="the driver release the --header copy is from")
    parser.add_argument("--date", help="that release's date, YYYY-MM-DD (with --header)")
    parser.add_argument("--table", type=Path, default=TABLE,
                        help="the status table (default: %(default)s)")
    parser.add_argument("--write", action="store_true", help="add the missing rows to the table")
    args = parser.parse_args(argv)
    if bool(args.git) == bool(args.header):
        parser.error("give either --git DIR --tag TAG or --header FILE --release R --date D")
    if args.git and not args.tag:
        parser.error("--git needs --tag")
    if args.header and not (args.release and args.date and DATE.fullmatch(args.date)):
        parser.error("--header needs --release and --date YYYY-MM-DD")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    try:
        if args.git:
            header = read_git(args.git, args.tag)
        else:
            header = parse(args.header.read_text(encoding="utf-8"), args.release, args.date)
        text = args.table.read_text(encoding="utf-8")
        new, lines = diff(header, table_rows(text))
        if args.write and new:
            fresh = write(text, header, new)
            table_rows(fresh)  # still a table
            args.table.write_text(fresh, encoding="utf-8")
    except (ImportError_, OSError, UnicodeDecodeError, yaml.YAMLError, KeyError, ValueError,
            TypeError, subprocess.TimeoutExpired) as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    print(f"{source_text(header)}; table {args.table.name}: {len(new)} new")
    print("\n".join(lines))
    if args.write and new:
        print(f"wrote {len(new)} rows to {args.table}: judge each (remedy, why) before committing")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
