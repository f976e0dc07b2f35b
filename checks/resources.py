"""The data files the product reads at run time (profiles, scenarios, the fault table, the
report schema), found through importlib.resources so that they load the same from the source
tree and from the installed wheel; pyproject.toml's package-data lists each of them, and
tests/framework/test_installed_wheel.py runs the wheel as the pytorch role builds it."""

from __future__ import annotations

from importlib.resources import files
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # importlib.resources.abc is 3.11+; the annotation is all that needs it
    from importlib.resources.abc import Traversable


def data(*parts: str) -> Traversable:
    """`checks/<parts...>` inside the installed package."""
    node = files("checks")
    for part in parts:
        node = node / part
    return node


def stems(*parts: str, suffix: str = ".yaml") -> list[str]:
    """The names (without suffix) of the data files of one directory, sorted."""
    folder = data(*parts)
    if not folder.is_dir():
        return []
    return sorted(entry.name.removesuffix(suffix) for entry in folder.iterdir()
                  if entry.name.endswith(suffix) and entry.is_file())
