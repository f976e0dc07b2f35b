"""Run a command with the words of $ARGS appended: `make test ARGS="-m 'not e2e'"`.

The words are split as a shell splits them (quotes and backslashes honoured, shlex), and nothing
in them is run: no command substitution, no `;`, no variable or glob expansion. A quote left
open is one `error:` line and exit 2.

    python .ci/with_args.py COMMAND [ARG...]
"""

from __future__ import annotations

import os
import shlex
import sys


def main() -> int:
    if len(sys.argv) < 2:
        print("error: usage: with_args.py COMMAND [ARG...]", file=sys.stderr)
        return 2
    try:
        extra = shlex.split(os.environ.get("ARGS", ""))
    except ValueError as exc:
        print(f"error: ARGS: {exc}", file=sys.stderr)
        return 2
    os.execvp(sys.argv[1], [*sys.argv[1:], *extra])
    return 0  # pragma: no cover (execvp does not return)


if __name__ == "__main__":
    sys.exit(main())
