"""The docs document what the code has: the check catalogue (docs/checks.md), every shipped
scenario (docs/scenarios.md), and README.md links every topic document."""

from __future__ import annotations

import re

from checks.docgen import catalog
from checks.hw.fixture import shipped


def test_check_catalogue_is_current() -> None:
    text = catalog.CHECKS_DOC.read_text()
    assert catalog.embed(text) == text, "run: python -m checks.docgen.catalog --write"


def test_scenario_list_is_current_and_complete() -> None:
    text = catalog.SCENARIOS_DOC.read_text()
    fresh = catalog.embed(text, catalog.SCENARIOS_BEGIN, catalog.SCENARIOS_END,
                          catalog.scenarios_markdown())
    assert fresh == text, "run: python -m checks.docgen.catalog --write"
    missing = [s for s in shipped() if f"`{s}`" not in text]
    assert not missing, f"scenarios missing from docs/scenarios.md: {missing}"


def test_readme_links_every_topic_document_and_the_links_resolve() -> None:
    readme = catalog.ROOT / "README.md"
    text = readme.read_text()
    linked = set(re.findall(r"\]\((docs/[\w./-]+\.md)(?:#[\w-]+)?\)", text))
    documents = {f"docs/{p.name}" for p in (catalog.ROOT / "docs").glob("*.md")}
    assert documents <= linked, f"README.md does not link {sorted(documents - linked)}"
    assert all((catalog.ROOT / link).is_file() for link in linked)
    assert len(text.splitlines()) <= 260, "README.md is the front door: keep it short"


def test_catalog_check_exits_1_on_a_stale_doc_and_2_on_bad_usage(tmp_path, monkeypatch, capsys):
    assert catalog.main(["--check"]) == 0
    stale = tmp_path / "checks.md"
    stale.write_text(catalog.CHECKS_DOC.read_text().replace("| id | code |", "| id | fault |"))
    (tmp_path / "scenarios.md").write_text(catalog.SCENARIOS_DOC.read_text())
    monkeypatch.setattr(catalog, "CHECKS_DOC", stale)
    monkeypatch.setattr(catalog, "ROOT", tmp_path)
    monkeypatch.setattr(catalog, "SCENARIOS_DOC", tmp_path / "scenarios.md")
    assert catalog.main(["--check"]) == 1
    assert "checks.md is out of date" in capsys.readouterr().err
    assert catalog.main(["--chek"]) == 2
