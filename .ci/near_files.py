"""Print the names nearest to a missing file's name in its directory (for Makefile messages)."""

import difflib
import os
import sys

path = sys.argv[1]
directory = os.path.dirname(path) or "."
try:
    names = sorted(n for n in os.listdir(directory) if not n.startswith("."))
except OSError:
    sys.exit(0)
near = difflib.get_close_matches(os.path.basename(path), names, n=3, cutoff=0.6)
print(", ".join(repr(n if directory == "." else os.path.join(directory, n)) for n in near))
