"""Import the XID codes a driver release defines into checks/kernlog/xid.yaml, with the diff.

The source is NVIDIA's own: the driver's error-code header, `src/common/sdk/nvidia/inc/nverror.h`
of NVIDIA/open-gpu-kernel-modules, one `#define NAME (code)` per XID up to
`ROBUST_CHANNEL_LAST_ERROR`, read from a clone at a release tag (the tag and its commit date are
recorded) or from a copy of the file (then say which release and date it is):

    python -m checks.devtools.xid_import --git ~/src/open-gpu-kernel-modules --tag 595.45.04
    python -m checks.devtools.xid_import --header nverror.h --release 595.45.04 --date 2026-03-05
    ... --write      # also add the missing rows and record the release in the table's sources

It prints the diff against the table: codes the header defines that the table lacks (`+`),
codes whose driver name differs from the table's catalog name (`~`, left as they are: the table
names rows as NVIDIA's XID catalog does, and the two disagree for some codes), and how many
table rows the header no longer defines (retired or unused codes, kept). `--write` adds only the
missing codes, each with the driver's name, no catalog action and the verdict an XID the table
does not know gets today (WARN, failed by the driver's own reset request), citing the release in
its `reason`; a row is then judged by hand (verdict and reason, our words) like any other
`source: own` row. Nothing else in the table is changed, so the review sees every decision.
Only the codes and names are taken from the header, none of its text.
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
TABLE = ROOT / "checks" / "kernlog" / "xid.yaml"
HEADER_PATH = "src/common/sdk/nvidia/inc/nverror.h"
REPOSITORY = "NVIDIA/open-gpu-kernel-modules"
LAST = "ROBUST_CHANNEL_LAST_ERROR"
DEFINE = re.compile(r"^#define\s+([A-Z][A-Z0-9_]*)\s+(?:\((\d+)\)|([A-Z][A-Z0-9_]*))\s*$", re.MULTILINE)
DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


class ImportError_(Exception):
    """Input the import cannot use (one-line message)."""


@dataclass(frozen=True)
class Header:
    codes: dict[int, list[str]]  # code -> the driver's names for it, in header order
    last: int                    # ROBUST_CHANNEL_LAST_ERROR
    release: str
    date: str


def parse(text: str, release: str, date: str) -> Header:
    """The XID codes of an nverror.h: every numeric define up to ROBUST_CHANNEL_LAST_ERROR."""
    defines = DEFINE.findall(text)
    last = [int(value) for name, value, _ in defines if name == LAST and value]
    if len(last) != 1:
        raise ImportError_(f"no single '#define {LAST} (N)': not the driver's nverror.h")
    codes: dict[int, list[str]] = {}
    by_name: dict[str, int] = {}
    for name, value, alias in defines:
        if name == LAST:
            break  # what follows (recovery levels, engine macros) is not an XID
        code = int(value) if value else by_name.get(alias, 0)  # `#define OLD_NAME NEW_NAME`
        if 0 < code <= last[0]:
            codes.setdefault(code, []).append(name)
            by_name[name] = code
    if not codes:
        raise ImportError_("no XID defines before ROBUST_CHANNEL_LAST_ERROR")
    return Header(codes=codes, last=last[0], release=release, date=date)


def read_git(repo: Path, tag: str) -> Header:
    """nverror.h at `tag` of a clone, with the tag's commit date."""
    def git(*args: str) -> str:
        proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                              timeout=60, check=False)
        if proc.returncode != 0:
            raise ImportError_(f"git {' '.join(args)}: {' '.join(proc.stderr.split()) or 'failed'}")
        return proc.stdout

    return parse(git("show", f"{tag}:{HEADER_PATH}"), tag, git("log", "-1", "--format=%cs", tag).strip())


def _table_rows(text: str) -> dict[int, dict]:
    data = yaml.safe_load(text)
    if not isinstance(data, dict) or not isinstance(data.get("xids"), list):
        raise ImportError_("the table has no 'xids' list")
    return {int(row["xid"]): row for row in data["xids"]}


def diff(header: Header, rows: dict[int, dict]) -> tuple[list[int], list[str]]:
    """(codes to add, the diff's lines)."""
    new = sorted(set(header.codes) - set(rows))
    lines = [f"+ {code} {' / '.join(header.codes[code])}" for code in new]
    for code in sorted(set(header.codes) & set(rows)):
        table_names = {n.strip() for n in str(rows[code]["name"]).split("/")}
        if not table_names & set(header.codes[code]):
            lines.append(f"~ {code} table {rows[code]['name']}, driver {' / '.join(header.codes[code])}")
    retired = sorted(set(rows) - set(header.codes))
    lines.append(f"= {len(retired)} table rows the header does not define (unused or retired codes, kept)")
    return new, lines


def source_text(header: Header) -> str:
    return (f"{REPOSITORY} {HEADER_PATH} at release {header.release} ({header.date}): the XID codes "
            f"and the driver's names, 1-{header.last} (checks/devtools/xid_import.py)")


def new_row(code: int, header: Header) -> str:
    name = " / ".join(header.codes[code])
    reason = (f"code and name from nverror.h {header.release} ({header.date}), no catalog row yet: "
              "warns as an unknown XID does, and fails on the driver's own reset request")
    return (f'  - {{xid: {code}, name: "{name}", description: "", action: "", verdict: WARN, '
            f'source: own, peers: {{}},\n     reason: "{reason}"}}\n')


def write(text: str, header: Header, new: list[int]) -> str:
    """The table's text with the new rows appended and the release recorded under sources."""
    entry = "  nverror: >-\n" + textwrap.fill(source_text(header), width=100, initial_indent="    ",
                                              subsequent_indent="    ", break_on_hyphens=False) + "\n"
    block = re.compile(r"^  nverror: >-\n(?:    .*\n)+", re.MULTILINE)
    if block.search(text):
        text = block.sub(lambda _: entry, text, count=1)
    elif "\nsources:\n" in text:
        text = text.replace("\nsources:\n", "\nsources:\n" + entry, 1)
    else:
        raise ImportError_("the table has no 'sources:' mapping")
    if not text.endswith("\n"):
        text += "\n"
    return text + "".join(new_row(code, header) for code in new)


def _args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m checks.devtools.xid_import",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--git", type=Path, help=f"a clone of {REPOSITORY}")
    parser.add_argument("--tag", help="the release tag to read (with --git), e.g. 595.45.04")
    parser.add_argument("--header", type=Path, help=f"a copy of {HEADER_PATH}")
    parser.add_argument("--release", help="the driver release the --header copy is from")
    parser.add_argument("--date", help="that release's date, YYYY-MM-DD (with --header)")
    parser.add_argument("--table", type=Path, default=TABLE, help="the XID table (default: %(default)s)")
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
        new, lines = diff(header, _table_rows(text))
        if args.write and new:
            fresh = write(text, header, new)
            _table_rows(fresh)  # still a table
            args.table.write_text(fresh, encoding="utf-8")
    except (ImportError_, OSError, UnicodeDecodeError, yaml.YAMLError, KeyError, ValueError,
            subprocess.TimeoutExpired) as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    print(f"{source_text(header)}; table {args.table.name}: {len(new)} new")
    print("\n".join(lines))
    if args.write and new:
        print(f"wrote {len(new)} rows to {args.table}: judge each (verdict, reason) before committing")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
