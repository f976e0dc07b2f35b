"""The check catalogue as a Markdown table, embedded in README.md between markers.

    python -m checks.catalog            # print the table
    python -m checks.catalog --write    # refresh README.md in place
"""

from __future__ import annotations

import sys
from pathlib import Path

from . import registry

BEGIN, END = "<!-- checks:begin -->", "<!-- checks:end -->"
README = Path(__file__).resolve().parent.parent / "README.md"


def markdown() -> str:
    rows = ["| id | code | level | needs | what it checks (threshold source) |",
            "|---|---|---|---|---|"]
    for chk in registry.ordered(registry.load_all().values()):
        doc = " ".join(chk.doc.split()).replace("|", "\\|")
        rows.append(f"| `{chk.id}` | {chk.code} | {chk.level} | {', '.join(chk.needs) or '-'} "
                    f"| {doc} |")
    return "\n".join(rows)


def embed(text: str) -> str:
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    return f"{head}{BEGIN}\n{markdown()}\n{END}{tail}"


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        README.write_text(embed(README.read_text()))
    else:
        print(markdown())
