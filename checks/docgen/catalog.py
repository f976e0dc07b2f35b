"""Generated tables embedded in the docs between markers: the check catalogue (docs/checks.md)
and the list of shipped scenarios (docs/scenarios.md). A test keeps both in sync with the code.

    python -m checks.docgen.catalog            # print the check table
    python -m checks.docgen.catalog --write    # refresh both documents in place
    python -m checks.docgen.catalog --check    # exit 1 when either is out of date
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from checks.node import registry

ROOT = Path(__file__).resolve().parents[2]
CHECKS_DOC = ROOT / "docs" / "checks.md"
SCENARIOS_DOC = ROOT / "docs" / "scenarios.md"
BEGIN, END = "<!-- checks:begin -->", "<!-- checks:end -->"
SCENARIOS_BEGIN, SCENARIOS_END = "<!-- scenarios:begin -->", "<!-- scenarios:end -->"


def markdown() -> str:
    rows = ["| id | code | level | needs | what it checks (threshold source) |",
            "|---|---|---|---|---|"]
    for chk in registry.ordered(registry.load_all().values()):
        doc = " ".join(chk.doc.split()).replace("|", "\\|")
        rows.append(f"| `{chk.id}` | {chk.code} | {chk.level} | {', '.join(chk.needs) or '-'} "
                    f"| {doc} |")
    return "\n".join(rows)


def scenarios_markdown() -> str:
    """Every shipped scenario with the first sentence of its description (which names its
    source)."""
    from checks.hw.fixture import load_scenario, shipped

    rows = ["| scenario | what it is (from its `description`) |", "|---|---|"]
    for name in shipped():
        text = " ".join(str(load_scenario(name).get("description", "")).split())
        first = re.split(r"(?<=[.!?])\s+(?=[A-Z(])", text, maxsplit=1)[0]
        rows.append(f"| `{name}` | {first.replace('|', '/')} |")
    return "\n".join(rows)


def embed(text: str, begin: str = BEGIN, end: str = END, table: str | None = None) -> str:
    head, found, rest = text.partition(begin)
    if not found:
        raise ValueError(f"marker {begin} missing")
    _, _, tail = rest.partition(end)
    return f"{head}{begin}\n{markdown() if table is None else table}\n{end}{tail}"


def write() -> None:
    CHECKS_DOC.write_text(embed(CHECKS_DOC.read_text()))
    SCENARIOS_DOC.write_text(embed(SCENARIOS_DOC.read_text(), SCENARIOS_BEGIN, SCENARIOS_END,
                                   scenarios_markdown()))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args not in ([], ["--write"], ["--check"]):
        print(f"usage: python -m checks.docgen.catalog [--write | --check] (got {' '.join(args)})",
              file=sys.stderr)
        return 2
    if args == ["--write"]:
        write()
        return 0
    if args == ["--check"]:
        stale = [str(doc.relative_to(ROOT)) for doc, fresh in (
            (CHECKS_DOC, embed(CHECKS_DOC.read_text())),
            (SCENARIOS_DOC, embed(SCENARIOS_DOC.read_text(), SCENARIOS_BEGIN, SCENARIOS_END,
                                  scenarios_markdown()))) if doc.read_text() != fresh]
        for doc in stale:
            print(f"error: {doc} is out of date; run: python -m checks.docgen.catalog --write",
                  file=sys.stderr)
        return 1 if stale else 0
    print(markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
