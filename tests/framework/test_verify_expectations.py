"""playbooks/verify.yml passes every expectation of the node CLI through from the inventory:
each `--expect-X` option of `python -m checks` has its `nodecert_expect_X` host variable."""

from __future__ import annotations

from pathlib import Path

from checks.node import node_cli

VERIFY = Path(__file__).resolve().parents[2] / "playbooks" / "verify.yml"


def test_verify_passes_every_expect_option_through() -> None:
    text = VERIFY.read_text()
    options = sorted(o for a in node_cli.build_parser()._actions for o in a.option_strings
                     if o.startswith("--expect-"))
    assert len(options) >= 7, options
    missing = []
    for option in options:
        var = "nodecert_expect_" + option.removeprefix("--expect-").replace("-", "_")
        if f"['{option}', {var}" not in text or f"if {var} is defined" not in text:
            missing.append(f"{option} ({var})")
    assert not missing, f"verify.yml does not pass through: {missing}"
