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

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from checks.devtools import driver_header
from checks.devtools.driver_header import DATE, REPOSITORY, ImportError_  # noqa: F401 (the CLI's names)

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "checks" / "kernlog" / "nvstatus.yaml"
HEADER_PATH = "src/common/sdk/nvidia/inc/nvstatuscodes.h"
# NV_STATUS_CODE(NV_ERR_GPU_IS_LOST,   0x0000000F, "...") at the start of a line (the header's
# own `#define NV_STATUS_CODE` lines in other files are not in this one).
STATUS = re.compile(r"^NV_STATUS_CODE\(\s*(NV_[A-Z0-9_]{1,64})\s*,\s*0x([0-9A-Fa-f]{1,8})\s*,",
                    re.MULTILINE)


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
    text, date = driver_header.git_header(repo, tag, HEADER_PATH)
    return parse(text, tag, date)


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
    text = driver_header.record_source(text, "header", source_text(header))
    text = re.sub(r"^statuses: \[\]\n", "statuses:\n", text, count=1, flags=re.MULTILINE)
    return text + "".join(new_row(code, header) for code in new)


IMPORTER = driver_header.Importer(
    prog="python -m checks.devtools.nvstatus_import", header_path=HEADER_PATH, table=TABLE,
    table_name="the status table", parse=parse, table_rows=table_rows, diff=diff, write=write,
    source_text=source_text, judge="remedy, why")


def main(argv: list[str] | None = None) -> int:
    return driver_header.main(IMPORTER, __doc__.split("\n\n")[0], argv)


if __name__ == "__main__":
    raise SystemExit(main())
