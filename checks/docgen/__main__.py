"""Every generated text in one command:

    python -m checks.docgen --write    # regenerate every generated file and region
    python -m checks.docgen --check    # exit 1 when any is stale, one line per stale file

Runs every generator module of the package (checks/docgen/__init__.py) in turn, in this
process; each still has its own `python -m checks.docgen.NAME [--write | --check]`.
"""

from __future__ import annotations

import importlib
import sys

from checks.docgen import generators

USAGE = "usage: python -m checks.docgen [--write | --check]"


def _run(name: str, args: list[str]) -> int:
    try:
        module = importlib.import_module(f"checks.docgen.{name}")
        return int(module.main(args))
    except Exception as exc:  # one broken generator must not hide the others' verdicts
        print(f"error: python -m checks.docgen.{name} {args[0]} failed: "
              f"{type(exc).__name__}: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args not in (["--write"], ["--check"]):
        print(f"{USAGE} (got {' '.join(args) or 'nothing'})", file=sys.stderr)
        return 2
    codes = {name: _run(name, args) for name in generators()}
    failed = [name for name, code in codes.items() if code]
    if failed and args == ["--check"]:
        print(f"error: stale or failing: {', '.join(failed)}; run: python -m checks.docgen --write",
              file=sys.stderr)
    return max(codes.values(), default=0)


if __name__ == "__main__":
    sys.exit(main())
