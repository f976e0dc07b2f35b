"""docs/troubleshooting.md has a section for every registered fault code and is generated."""

from __future__ import annotations

from pathlib import Path

import pytest

from checks.docgen import faults as gen
from checks.node import registry

FIX = "run: python -m checks.docgen.faults --write"


def test_every_registered_fault_code_has_an_entry() -> None:
    missing = gen.missing_codes(gen.load_faults(), gen.checks())
    assert not missing, (
        "fault codes without an entry in checks/report/faults.yaml (give each meaning, confirm, "
        f"action; then {FIX}):\n  " + "\n  ".join(missing))


def test_no_entry_for_a_code_nothing_registers() -> None:
    orphans = gen.orphan_codes(gen.load_faults(), gen.checks())
    assert not orphans, f"checks/report/faults.yaml entries no check registers: {orphans}"


def test_troubleshooting_doc_is_current() -> None:
    text = gen.markdown(gen.load_faults(), gen.checks())
    assert gen.DOC.exists() and gen.DOC.read_text() == text, f"docs/troubleshooting.md: {FIX}"


def test_every_code_has_a_section_with_a_command() -> None:
    text = gen.DOC.read_text()
    for chk in registry.load_all().values():
        head = f"### {chk.code} `{chk.id}`"
        assert head in text, chk.code
        section = text.split(head, 1)[1].split("\n### ", 1)[0]
        assert "```sh\n" in section and "**What to do.**" in section, chk.code


def test_missing_code_is_named_and_gets_a_visible_placeholder() -> None:
    entries = gen.load_faults()
    chks = gen.checks()
    gpu002 = next(c for c in chks if c.code == "GPU002")
    del entries["GPU002"]
    assert gen.missing_codes(entries, chks) == [f"GPU002 (ecc-errors: {gpu002.title})"]
    assert "No entry in checks/report/faults.yaml yet: add GPU002" in gen.markdown(entries, chks)


def test_orphan_entry_is_named() -> None:
    entries = {**gen.load_faults(), "ZZZ999": {"meaning": "m", "confirm": ["c"], "action": "a"}}
    assert gen.orphan_codes(entries, gen.checks()) == ["ZZZ999"]


@pytest.mark.parametrize("text, message", [
    ("GPU002: [unclosed\n", "faults.yaml line 2: not valid YAML"),
    ("- a list\n", "expected a mapping"),
    ("GPU002: {meaning: m, action: a}\n", "GPU002: missing confirm"),
    ("GPU002: {meaning: m, confirm: nvidia-smi, action: a}\n", "confirm must be a list"),
    ("GPU002: {meaning: m, confirm: [c], action: a, means: x}\n", "unknown keys means"),
])
def test_bad_faults_file_is_one_clear_error(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "faults.yaml"
    path.write_text(text)
    with pytest.raises(gen.FaultsError, match=message):
        gen.load_faults(path)


def test_cli(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
             capsys: pytest.CaptureFixture[str]) -> None:
    doc = tmp_path / "troubleshooting.md"
    monkeypatch.setattr(gen, "DOC", doc)
    monkeypatch.setattr(gen, "ROOT", tmp_path)
    assert gen.main(["--check"]) == 1
    assert FIX in capsys.readouterr().err
    assert gen.main(["--write"]) == 0 and doc.read_text() == gen.DOC.read_text()
    assert gen.main(["--check"]) == 0
    assert gen.main(["--nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage:") and err.count("\n") == 1
