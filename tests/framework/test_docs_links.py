"""Docs that cannot drift: every link of every Markdown page of the repository resolves to a file
(and, for `#anchor`, a heading) inside the repository; no page or source comment refers to the
project's issue tracker by number (a reader of the repository cannot follow it); no merge-conflict
markers anywhere in the docs."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")
# the word issue and a bare number point into this project's tracker; with "#" after a
# repository's name they point into someone else's, which a reader can follow
ISSUE_REF = re.compile(r"\b[Ii]ssues?\s+\d+\b")
# the folders beside the checkout on the machines this grew on are not in the repository
OUTSIDE = re.compile(r"\.\./shared/|/work/shared")
CONFLICT = re.compile(r"^(<<<<<<<|=======$|>>>>>>>)", re.M)


def markdown_pages() -> list[Path]:
    tracked = subprocess.run(["git", "ls-files", "*.md"], cwd=ROOT, capture_output=True, text=True)
    names = tracked.stdout.split() if tracked.returncode == 0 else []
    pages = [ROOT / n for n in names] or [*ROOT.glob("*.md"), *ROOT.glob("docs/*.md"),
                                          *ROOT.glob("playbooks/roles/*/README.md")]
    return sorted(p for p in pages if p.is_file())


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    text = page.read_text()
    out = set(re.findall(r'<a (?:id|name)="([^"]+)"', text))
    for line in text.splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            title = re.sub(r"[^\w\- ]", "", title)
            out.add(title.replace(" ", "-"))
    return out


def _strip_code(text: str) -> str:
    text = re.sub(r"^(`{3,}|~{3,}).*?^\1", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


@pytest.mark.parametrize("page", markdown_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_resolves_inside_the_repository(page: Path) -> None:
    text = _strip_code(page.read_text())
    broken = []
    for target in LINK.findall(text) + IMAGE.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http(s)://, mailto: ...: not a file
            continue
        path_part, _, anchor = target.partition("#")
        resolved = (page.parent / path_part).resolve() if path_part else page
        if ROOT not in resolved.parents and resolved != ROOT:
            broken.append(f"{target} (outside the repository)")
        elif not resolved.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target} (no heading #{anchor})")
    assert not broken, f"{page.relative_to(ROOT)}: {broken}"


@pytest.mark.parametrize("page", markdown_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_issue_numbers_or_conflict_markers(page: Path) -> None:
    text = page.read_text()
    assert not CONFLICT.search(text), f"{page.relative_to(ROOT)}: merge-conflict markers"
    assert not OUTSIDE.search(text), f"{page.relative_to(ROOT)} points outside the repository"
    refs = sorted(set(ISSUE_REF.findall(text)))
    assert not refs, f"{page.relative_to(ROOT)} refers to the project's issues by number: {refs}"


def test_no_issue_numbers_in_source_comments() -> None:
    found = []
    for base in ("checks", "trainer", "tests", "playbooks", "benchmarks"):
        for path in (ROOT / base).rglob("*"):
            if path.suffix not in (".py", ".yml", ".yaml") or "__pycache__" in path.parts:
                continue
            for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                comment = line.partition("#")[2]
                if ISSUE_REF.search(comment) or OUTSIDE.search(comment):
                    found.append(f"{path.relative_to(ROOT)}:{n}")
    assert not found, f"comments that name the project's issues by number: {found[:20]}"
