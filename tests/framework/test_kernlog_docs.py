"""docs/kernel-log.md's XID, SXid, AER and corpus tables are generated from checks/kernlog/."""

from __future__ import annotations

from checks.docgen import kernlog as gen

FIX = "run: python -m checks.docgen.kernlog --write"


def test_the_kernel_log_doc_is_current() -> None:
    text = gen.DOC.read_text()
    assert gen.render(text) == text, FIX


def test_the_doc_tables_hold_every_row() -> None:
    text = gen.DOC.read_text()
    for row in ("| 46 | `ROBUST_CHANNEL_GPU_TIMEOUT_ERROR` | RESET_GPU | FAIL",
                "| 94 | `ROBUST_CHANNEL_CONTAINED_ERROR` | RESTART_APP | WARN",
                "| 12028 | egress nonposted PRIV error | nonfatal | FAIL",
                "| 26006 | SOE halted | driver | FAIL",
                "| nonfatal | `Uncorrected (Non-Fatal)` | `Uncorrectable (Non-Fatal)` |"):
        assert row in text, row


def test_check_mode_reports_a_stale_doc(monkeypatch, tmp_path, capsys) -> None:
    stale = tmp_path / "kernel-log.md"
    stale.write_text(gen.DOC.read_text().replace("| 46 |", "| 47 |", 1))
    monkeypatch.setattr(gen, "DOC", stale)
    monkeypatch.setattr(gen, "ROOT", tmp_path)
    assert gen.main(["--check"]) == 1
    assert "out of date" in capsys.readouterr().err
    assert gen.main(["--bogus"]) == 2
