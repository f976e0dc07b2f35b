"""Write tests/durations.json (seconds per test file) from the JUnit XML of a full run, for the
order tests/conftest.py gives the files:

    .venv/bin/python -m pytest -n 2 --dist loadfile --junitxml=/tmp/junit.xml
    .venv/bin/python tests/durations.py /tmp/junit.xml
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

OUT = Path(__file__).with_name("durations.json")


def per_file(junit: Path) -> dict[str, float]:
    seconds: dict[str, float] = defaultdict(float)
    for case in ET.parse(junit).getroot().iter("testcase"):
        # classname "tests.e2e.test_e2e_provision" (+ ".Class" for tests in a class)
        parts = case.get("classname", "").split(".")
        while parts and not parts[-1].startswith("test_"):
            parts.pop()
        if parts:
            seconds["/".join(parts) + ".py"] += float(case.get("time", 0))
    return dict(seconds)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    seconds = per_file(Path(argv[0]))
    ordered = dict(sorted(((f, round(s, 1)) for f, s in seconds.items()), key=lambda fs: -fs[1]))
    OUT.write_text(json.dumps(ordered, indent=1) + "\n")
    print(f"{OUT}: {len(ordered)} files, {sum(ordered.values()):.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
