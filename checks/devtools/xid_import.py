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

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from checks.devtools import driver_header
from checks.devtools.driver_header import DATE, REPOSITORY, ImportError_  # noqa: F401 (the CLI's names)

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "checks" / "kernlog" / "xid.yaml"
HEADER_PATH = "src/common/sdk/nvidia/inc/nverror.h"
LAST = "ROBUST_CHANNEL_LAST_ERROR"
DEFINE = re.compile(r"^#define\s+([A-Z][A-Z0-9_]*)\s+(?:\((\d+)\)|([A-Z][A-Z0-9_]*))\s*$", re.MULTILINE)


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
    text, date = driver_header.git_header(repo, tag, HEADER_PATH)
    return parse(text, tag, date)


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
    text = driver_header.record_source(text, "nverror", source_text(header))
    return text + "".join(new_row(code, header) for code in new)


IMPORTER = driver_header.Importer(
    prog="python -m checks.devtools.xid_import", header_path=HEADER_PATH, table=TABLE,
    table_name="the XID table", parse=parse, table_rows=_table_rows, diff=diff, write=write,
    source_text=source_text, judge="verdict, reason")


def main(argv: list[str] | None = None) -> int:
    return driver_header.main(IMPORTER, __doc__.split("\n\n")[0], argv)


if __name__ == "__main__":
    raise SystemExit(main())
