"""README.md documents what the code has: the check catalogue and the shipped scenarios."""

from __future__ import annotations

from checks import catalog
from checks.hw.fixture import shipped


def test_check_catalogue_in_readme_is_current() -> None:
    text = catalog.README.read_text()
    assert catalog.embed(text) == text, "run: python -m checks.catalog --write"


def test_every_shipped_scenario_is_documented() -> None:
    text = catalog.README.read_text()
    missing = [s for s in shipped() if f"`{s}`" not in text]
    assert not missing, f"scenarios missing from README.md: {missing}"
