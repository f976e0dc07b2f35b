"""The XID and SXid policy is data (checks/kernlog/*.yaml) derived from NVIDIA's published
tables; these tests walk every row against the rule, so a new catalog release is a data change
with a visible diff, and check the verdicts the published sources require through the CLI."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from checks.kernlog import SXID_VERDICTS, XID_VERDICTS, sxid_policy, xid_policy

# 1-172: the catalog release mirrored in xid.yaml; 173-176: the codes the 595 driver's nverror.h
# defines beyond it (python -m checks.devtools.xid_import).
CATALOG_XIDS = range(1, 177)


def test_every_catalog_xid_has_one_row_with_a_source() -> None:
    policy = xid_policy()
    assert sorted(policy.rows) == list(CATALOG_XIDS)
    for row in policy.rows.values():
        assert row.name and row.source in policy.sources, row
        assert row.verdict in XID_VERDICTS, row


def test_every_xid_row_follows_the_catalog_rule_or_says_why_not() -> None:
    """reset/reboot/restart -> FAIL, restart-app/ignore -> WARN; a row off the rule, or with no
    catalog action, carries its reason."""
    policy = xid_policy()
    for row in policy.rows.values():
        if row.source == "own" or not row.action:
            assert row.source == "own" and row.reason, f"XID {row.xid}: no catalog action, no reason"
            continue
        assert row.action in policy.rule, f"XID {row.xid}: action {row.action} not in the rule"
        expected = policy.rule[row.action]
        assert row.verdict == expected or row.reason, (
            f"XID {row.xid} ({row.action}) is {row.verdict}, the rule says {expected}, no reason")


def test_reset_and_restart_actions_fail_and_application_ones_do_not() -> None:
    rule = xid_policy().rule
    for action in ("RESET_GPU", "RESTART_BM", "RESTART_VM"):
        assert rule[action] == "FAIL"
    for action in ("RESTART_APP", "IGNORE"):
        assert rule[action] == "WARN"


@pytest.mark.parametrize("xid,verdict", [
    (46, "FAIL"), (109, "FAIL"), (110, "FAIL"),  # catalog: RESET_GPU
    (79, "FAIL"), (48, "FAIL"), (95, "FAIL"),
    (94, "WARN"),  # contained: RESTART_APP
    (13, "WARN"), (31, "WARN"), (43, "WARN"),
    (145, "BY_SEVERITY"), (154, "RECOVERY_ACTION")])
def test_the_verdicts_the_catalog_requires(xid: int, verdict: str) -> None:
    assert xid_policy().rows[xid].verdict == verdict


def test_where_peers_disagree_the_choice_and_its_reason_are_in_the_data() -> None:
    rows = xid_policy().rows
    for xid in (63, 92, 94):
        row = rows[xid]
        assert row.peers.get("cloud") == "FATAL" and row.peers.get("nvsentinel") == "NONFATAL"
        assert "peers disagree" in row.reason and row.verdict == "WARN"


def test_every_sxid_row_follows_the_guide_or_says_why() -> None:
    policy = sxid_policy()
    assert len(policy.rows) > 90
    for row in policy.rows.values():
        assert row.verdict in SXID_VERDICTS and row.source in policy.sources, row
        if row.section in policy.rule:
            assert row.verdict == policy.rule[row.section], row
        elif row.verdict != "PRINTED":
            assert row.reason, f"SXid {row.sxid}: {row.verdict} without a reason"


@pytest.mark.parametrize("sxid,verdict", [
    (12028, "FAIL"),  # printed Non-fatal, the guide: NVLink traffic stalls until a restart
    (26006, "FAIL"), (26007, "FAIL"),  # SOE halted / exterr: no severity printed
    (24007, "FAIL"), (20034, "FAIL"),  # fatal in the guide
    (22013, "IGNORE"),  # the guide: safely ignored
    (11012, "PRINTED")])  # single-bit ECC, corrected by the switch
def test_the_sxid_verdicts_the_guide_requires(sxid: int, verdict: str) -> None:
    assert sxid_policy().rows[sxid].verdict == verdict


def test_a_bad_verdict_in_the_data_is_refused(monkeypatch: pytest.MonkeyPatch,
                                              tmp_path: Path) -> None:
    from checks import kernlog

    data = yaml.safe_load((Path(kernlog.__file__).parent / "xid.yaml").read_text())
    data["xids"][0]["verdict"] = "MAYBE"
    monkeypatch.setattr(kernlog, "_load", lambda name: data)
    kernlog.xid_policy.cache_clear()
    try:
        with pytest.raises(ValueError, match="XID 1 verdict 'MAYBE'"):
            kernlog.xid_policy()
    finally:
        monkeypatch.undo()
        kernlog.xid_policy.cache_clear()


# --- through the CLI: the driver's own lines ------------------------------------------------

# NVIDIA "GPU Memory Error Management" (and the driver's own comment on error containment):
# a contained error ("RST: No, D-RST: No") and an uncontained one ("RST: Yes").
XID_94_CONTAINED = ("NVRM: Xid (PCI:0000:01:00): 94, pid=7062, Contained: CE User Channel (0x9). "
                    "RST: No, D-RST: No")
XID_95_UNCONTAINED = ("NVRM: Xid (PCI:0000:01:00): 95, pid=7062, Uncontained: LTC TAG (0x2,0x0). "
                      "RST: Yes, D-RST: No")
# leptonai/gpud#46 (H100, dmesg -T): XID 109, whose catalog action is RESET_GPU
XID_109 = ("[Fri Aug 30 11:43:14 2024] NVRM: Xid (PCI:0000:cb:00): 109, pid=1797828, "
           "name=pt_main_thread, Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005")


def _xid_results(run_cli, tmp_path: Path, lines: list[str]) -> dict[int, dict]:
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump({
        "description": "test: XID lines from the sources cited in test_kernlog_policy.py",
        "extends": "h100-sxm-8x-healthy", "host": {"kernel_log": lines},
        "gpu_overrides": {0: {"pci_bus_id": "0000:01:00.0"}, 1: {"pci_bus_id": "0000:cb:00.0"}}}))
    _, report, err = run_cli("--simulate", str(path), "--only", "xid-events")
    assert report is not None, err
    (check,) = [c for c in report["checks"] if c["id"] == "xid-events"]
    return {r["details"]["xid"]: r for r in check["results"]}


def test_contained_94_warns_and_reset_xids_fail(run_cli, tmp_path: Path) -> None:
    results = _xid_results(run_cli, tmp_path, [XID_94_CONTAINED, XID_95_UNCONTAINED, XID_109])
    assert {x: r["status"] for x, r in results.items()} == {94: "WARN", 95: "FAIL", 109: "FAIL"}
    assert results[94]["details"]["catalog"]["action"] == "RESTART_APP"
    assert results[109]["device"]["pci"] == "0000:cb:00.0"


def test_the_drivers_own_reset_request_fails_a_warn_xid(run_cli, tmp_path: Path) -> None:
    """The same contained-error line, but the driver printed RST: Yes: it asks for a reset."""
    line = XID_94_CONTAINED.replace("RST: No, D-RST: No", "RST: Yes, D-RST: No")
    (result,) = _xid_results(run_cli, tmp_path, [line]).values()
    assert result["status"] == "FAIL" and result["details"]["reset_request"] == "RST: Yes"


def test_an_unknown_xid_with_the_drivers_reset_request_fails(run_cli, tmp_path: Path) -> None:
    line = XID_95_UNCONTAINED.replace("): 95,", "): 999,")
    (result,) = _xid_results(run_cli, tmp_path, [line]).values()
    assert result["status"] == "FAIL" and "RST: Yes" in result["message"]
