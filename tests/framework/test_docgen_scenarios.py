"""docs/scenarios.md's two hand-written verdict tables ("Field corpus", "Node types") held equal to
the shipped scenarios and to the verdicts the tests assert (tests/framework/test_field_corpus.py,
test_node_types.py): every `field-*`/`node-*` scenario has a row, no row names a scenario that
does not exist, and a row's verdict names every check its test case expects to FAIL, WARN or
ERROR. The prose (machine, source, how the verdict reads) stays hand-written."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from checks.hw.fixture import shipped

sys.path.insert(0, str(Path(__file__).resolve().parent))
import test_field_corpus
import test_node_types

DOC = Path(__file__).resolve().parents[2] / "docs" / "scenarios.md"
TABLES = {"### Field corpus": ("field-", test_field_corpus.CASES),
          "### Node types": ("node-", test_node_types.CASES)}
# A verdict cell names each check expected to FAIL or WARN; ERROR lists are often summarised
# ("per-GPU checks ERROR", "the kernel-log checks"), so they are not held here.
NAMED = ("FAIL", "WARN")


def rows(heading: str) -> dict[str, str]:
    """{scenario: verdict cell} of the table under this heading."""
    text = DOC.read_text().split(heading, 1)[1]
    section = re.split(r"\n#{2,3} ", text, maxsplit=1)[0]
    found = {}
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        for name in re.findall(r"`([^`]+)`", cells[0]):
            found[name] = cells[-1]
    return found


@pytest.mark.parametrize("heading", TABLES)
def test_table_lists_exactly_the_shipped_scenarios(heading: str) -> None:
    prefix, _ = TABLES[heading]
    listed = set(rows(heading))
    wanted = {s for s in shipped() if s.startswith(prefix)}
    assert sorted(wanted - listed) == [], f"{heading}: no row for these scenarios"
    assert sorted(listed - wanted) == [], f"{heading}: rows for scenarios that are not shipped"


@pytest.mark.parametrize("heading", TABLES)
def test_verdict_names_every_check_the_test_expects_not_ok(heading: str) -> None:
    _, cases = TABLES[heading]
    table = rows(heading)
    problems = []
    for case in cases:
        if case.args or case.scenario not in table:
            continue  # a variant with options is described in prose; a missing row fails above
        for check_id, want in case.expect.items():
            if want in NAMED and f"`{check_id}`" not in table[case.scenario]:
                problems.append(f"{case.scenario}: verdict does not name `{check_id}` ({want})")
        if not case.expect and not case.devices and not table[case.scenario].startswith("nothing"):
            problems.append(f"{case.scenario}: expected healthy, verdict says {table[case.scenario]!r}")
    assert problems == []
