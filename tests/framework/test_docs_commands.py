"""The docs' commands run: every `make ...` / `python -m ...` line of a block marked runnable.

A fenced block is runnable when its info string has the word `runnable` (```sh runnable) or the
line right before the fence is `<!-- runnable -->`. Each of its lines that starts with `make ` or
`python -m ` is run from the repository root (python as this interpreter, PYTHONPATH the checkout)
and must exit 0, or N when the line ends with `# exit N`. Other lines are shown, not run. The
convention is documented in docs/contributing.md.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MARK = "<!-- runnable -->"
FENCE = re.compile(r"^\s*(`{3,}|~{3,})\s*(.*)$")
EXPECT = re.compile(r"#\s*exit\s+(\d+)\s*$")
SHELL_OPERATORS = set("|&;<>()")
TIMEOUT_S = 120


@dataclass(frozen=True)
class DocCommand:
    where: str  # file:line
    text: str
    argv: tuple[str, ...]
    expect: int


class NotPlain(ValueError):
    """A runnable line that needs a shell (pipes, redirects, $variables)."""


def runnable_blocks(text: str) -> list[tuple[int, list[str]]]:
    """(line number of the first line inside, lines) of every block marked runnable."""
    blocks: list[tuple[int, list[str]]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, info = m.group(1), m.group(2).split()
        marked = "runnable" in info or (i > 0 and lines[i - 1].strip() == MARK)
        start = i + 1
        i = start
        while i < len(lines) and not lines[i].strip().startswith(fence):
            i += 1
        if marked:
            blocks.append((start + 1, lines[start:i]))
        i += 1
    return blocks


def parse_line(line: str) -> tuple[tuple[str, ...], int] | None:
    """argv and expected exit status of one line; None for a line that is not run."""
    stripped = line.strip()
    if not (stripped.startswith("make ") or stripped == "make"
            or stripped.startswith("python -m ")):
        return None
    m = EXPECT.search(stripped)
    lexer = shlex.shlex(stripped, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    words = list(lexer)
    bad = [w for w in words if set(w) <= SHELL_OPERATORS or "$" in w or "`" in w]
    if bad:
        raise NotPlain(f"needs a shell ({' '.join(bad)}); runnable lines are plain commands")
    argv = (sys.executable, *words[1:]) if words[0] == "python" else tuple(words)
    return argv, int(m.group(1)) if m else 0


def doc_commands(paths: list[Path], root: Path = ROOT) -> list[DocCommand]:
    out = []
    for path in paths:
        for start, lines in runnable_blocks(path.read_text()):
            found = []
            for offset, line in enumerate(lines):
                where = f"{path.relative_to(root)}:{start + offset}"
                try:
                    parsed = parse_line(line)
                except NotPlain as exc:
                    raise NotPlain(f"{where}: {exc}") from None
                if parsed:
                    found.append(DocCommand(where, line.strip(), *parsed))
            if not found:
                raise NotPlain(f"{path.relative_to(root)}:{start - 1}: block marked runnable has "
                               "no `make`/`python -m` line")
            out += found
    return out


def doc_files() -> list[Path]:
    return [p for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))] if p.exists()]


COMMANDS = doc_commands(doc_files())


def test_the_docs_have_runnable_commands() -> None:
    assert len(COMMANDS) >= 3, "no (or hardly any) blocks marked runnable in README.md or docs/"


@pytest.mark.parametrize("cmd", COMMANDS, ids=[c.where for c in COMMANDS])
def test_doc_command_runs(cmd: DocCommand) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if cmd.argv[0] == "make":
        # A stale venv stamp would make `make` pip-install into the venv (shared by worktrees):
        # a docs test must never install anything.
        dry = subprocess.run([*cmd.argv[:1], "-n", *cmd.argv[1:]], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=TIMEOUT_S)
        installs = [ln for ln in dry.stdout.splitlines() if "pip install" in ln or " -m venv " in ln]
        assert not installs, (f"{cmd.where}: `{cmd.text}` would install first ({installs[0]}); "
                              "run `make venv` (or touch the venv's stamps), then re-run")
    try:
        proc = subprocess.run(cmd.argv, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{cmd.where}: `{cmd.text}` ran over {TIMEOUT_S} s; runnable docs commands "
                    "must be quick (simulate, --help, --list, --check)")
    tail = (proc.stdout + proc.stderr)[-2000:]
    assert proc.returncode == cmd.expect, (
        f"{cmd.where}: `{cmd.text}` exited {proc.returncode}, the doc says {cmd.expect}\n{tail}")


# --- the convention itself ------------------------------------------------------------------

SAMPLE = """\
Intro.

```sh runnable
python -m checks --list          # the checks
make -n test
cp a b
python -m checks --simulate fault-xid-79 --level quick   # exit 1
```

<!-- runnable -->
~~~
python -m checks.docgen.roles --check
~~~

```sh
python -m not.marked
```
"""


def test_blocks_are_found_by_info_string_or_comment() -> None:
    blocks = runnable_blocks(SAMPLE)
    assert [start for start, _ in blocks] == [4, 12]
    assert blocks[1][1] == ["python -m checks.docgen.roles --check"]


def test_lines_parse_into_argv_and_expected_exit(tmp_path: Path) -> None:
    cmds = _commands_of(SAMPLE, tmp_path)
    assert [c.where for c in cmds] == ["doc.md:4", "doc.md:5", "doc.md:7", "doc.md:12"]
    assert cmds[0].argv[0] == sys.executable and cmds[1].argv[0] == "make"
    assert [(c.argv[1:], c.expect) for c in cmds] == [
        (("-m", "checks", "--list"), 0), (("-n", "test"), 0),
        (("-m", "checks", "--simulate", "fault-xid-79", "--level", "quick"), 1),
        (("-m", "checks.docgen.roles", "--check"), 0)]


@pytest.mark.parametrize("line", ["python -m checks --list | head", "make verify > out.txt",
                                  "python -m checks --json $HOME/r.json", "make a && make b"])
def test_a_line_that_needs_a_shell_is_refused(line: str) -> None:
    with pytest.raises(NotPlain, match="needs a shell"):
        parse_line(line)


def test_a_runnable_block_without_commands_is_refused(tmp_path: Path) -> None:
    with pytest.raises(NotPlain, match="has no `make`/`python -m` line"):
        _commands_of("```sh runnable\ncp inventory.example inventory\n```\n", tmp_path)


def _commands_of(text: str, tmp_path: Path) -> list[DocCommand]:
    path = tmp_path / "doc.md"
    path.write_text(text)
    return doc_commands([path], root=tmp_path)
