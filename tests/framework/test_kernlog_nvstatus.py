"""Driver status codes in the kernel log (checks/kernlog/nvstatus.yaml, imported from the driver's
nvstatuscodes.h by checks/devtools/nvstatus_import.py): the whole table, the import, and the lines
xid-events judges by it, with and without an Xid line. Real lines: the corpus
(checks/kernlog/corpus.yaml); the line forms here are the driver's own (nvassert.c, rpc.c,
osinit.c at 595.45.04) or quoted from the report each test names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from checks.devtools import nvstatus_import as imp
from checks.kernlog import nvstatus_policy
from checks.node.suite import kernlog_gpu_xid as xid

# The statuses whose row carries a remedy: the header's own words say the GPU needs a reset, is
# in one, has left the bus, or is in a fatal or broken hardware state (each row says why).
JUDGED = {
    "NV_ERR_RESET_REQUIRED": "reset", "NV_ERR_GPU_IN_FULLCHIP_RESET": "reset",
    "NV_ERR_GPU_IS_LOST": "reboot", "NV_ERR_FATAL_ERROR": "reboot",
    "NV_ERR_THRESHOLD_CROSSED": "reboot",
    "NV_ERR_BROKEN_FB": "rma", "NV_ERR_MEMORY_TRAINING_FAILED": "rma",
    "NV_ERR_SECURE_BOOT_FAILED": "rma", "NV_ERR_RESOURCE_RETIREMENT_ERROR": "rma"}


# --- the table -------------------------------------------------------------------------------

def test_every_status_row_is_unique_has_a_known_remedy_and_says_why_when_judged() -> None:
    policy = nvstatus_policy()
    assert len(policy.rows) == 151  # nvstatuscodes.h at 595.45.04
    assert len({r.name for r in policy.rows.values()}) == len(policy.rows)
    for row in policy.rows.values():
        assert row.name.startswith(("NV_OK", "NV_ERR_", "NV_WARN_")), row
        assert row.remedy in policy.remedies, row
        if row.remedy != "none":
            assert len(row.why) > 40, f"{row.name}: a remedy without a reason"
    assert {r.name: r.remedy for r in policy.rows.values() if r.remedy != "none"} == JUDGED
    assert policy.rows[0].name == "NV_OK" and policy.rows[0x0F].name == "NV_ERR_GPU_IS_LOST"
    assert policy.rows[0x62].name == "NV_ERR_RESET_REQUIRED"


def test_every_remedy_kind_fails_with_an_action_and_each_is_used() -> None:
    policy = nvstatus_policy()
    used = {r.remedy for r in policy.rows.values()}
    assert set(policy.remedies) == used == {"reset", "reboot", "rma", "none"}
    for name, kind in policy.remedies.items():
        if name == "none":
            assert kind.verdict == "PASS" and not kind.text
        else:
            assert kind.verdict == "FAIL" and kind.meaning and len(kind.text) > 40, name
    assert "nvidia-smi -r" in policy.remedies["reset"].text
    assert "reboot" in policy.remedies["reboot"].text and "RMA" in policy.remedies["rma"].text


def test_the_table_cites_the_header_release_it_was_imported_from() -> None:
    sources = nvstatus_policy().sources
    assert "nvstatuscodes.h at release 595.45.04 (2026-03-05)" in " ".join(sources["header"].split())
    assert "nvassert.c" in sources["printing"] and "rpc.c" in sources["printing"]


def test_a_status_listed_twice_or_judged_without_a_reason_is_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from checks import kernlog

    data = yaml.safe_load((Path(kernlog.__file__).parent / "nvstatus.yaml").read_text())
    for change, message in ((lambda d: d["statuses"].append(dict(d["statuses"][3])), "twice"),
                            (lambda d: d["statuses"][3].update(remedy="reset"), "without a why"),
                            (lambda d: d["statuses"][3].update(remedy="pray"), "unknown remedy")):
        broken = yaml.safe_load(yaml.safe_dump(data))
        change(broken)
        monkeypatch.setattr(kernlog, "_load", lambda name, b=broken: b)
        kernlog.nvstatus_policy.cache_clear()
        try:
            with pytest.raises(ValueError, match=message):
                kernlog.nvstatus_policy()
        finally:
            monkeypatch.undo()
            kernlog.nvstatus_policy.cache_clear()


# --- the import ------------------------------------------------------------------------------

HEADER = """#ifndef SDK_NVSTATUSCODES_H
NV_STATUS_CODE(NV_OK,                                  0x00000000, "Success")
NV_STATUS_CODE(NV_ERR_GENERIC,                         0x0000FFFF, "Failure: Generic Error")
NV_STATUS_CODE(NV_ERR_GPU_IS_LOST,                     0x0000000F, "GPU lost from the bus")
NV_STATUS_CODE(NV_ERR_BRAND_NEW,                       0x0000008D, "Added by a newer driver")
// Warnings:
NV_STATUS_CODE(NV_WARN_HOT_SWITCH,                     0x00010001, "WARNING Hot switch")
#endif
"""


def test_the_import_reads_codes_and_names_only_and_diffs_against_the_table() -> None:
    header = imp.parse(HEADER, "999.1", "2027-01-01")
    assert header.codes == {0: "NV_OK", 0xFFFF: "NV_ERR_GENERIC", 0x0F: "NV_ERR_GPU_IS_LOST",
                            0x8D: "NV_ERR_BRAND_NEW", 0x10001: "NV_WARN_HOT_SWITCH"}
    rows = {0: {"name": "NV_OK"}, 0x0F: {"name": "NV_ERR_OLD_NAME"}, 0x99: {"name": "NV_ERR_GONE"}}
    new, lines = imp.diff(header, rows)
    assert new == [0xFFFF, 0x8D, 0x10001]
    assert "+ 0x0000008D NV_ERR_BRAND_NEW" in lines
    assert "~ 0x0000000F table NV_ERR_OLD_NAME, driver NV_ERR_GPU_IS_LOST" in lines
    assert lines[-1].startswith("= 1 table rows")


def test_the_import_refuses_a_file_that_is_not_the_header() -> None:
    with pytest.raises(imp.ImportError_, match="NV_OK"):
        imp.parse("#define NV_OK 0\n", "1", "2020-01-01")
    with pytest.raises(imp.ImportError_, match="twice"):
        imp.parse(HEADER + 'NV_STATUS_CODE(NV_ERR_GPU_IS_LOST, 0x00000010, "x")\n', "1", "2020-01-01")


def test_write_adds_the_missing_rows_unjudged_and_records_the_release(tmp_path: Path,
                                                                      capsys) -> None:
    header, table = tmp_path / "nvstatuscodes.h", tmp_path / "nvstatus.yaml"
    header.write_text(HEADER)
    table.write_text("sources:\n  printing: x\nremedies: {}\nstatuses:\n"
                     "  - {code: 0x0000000F, name: NV_ERR_GPU_IS_LOST, remedy: reboot, why: w}\n")
    argv = ["--header", str(header), "--release", "999.1", "--date", "2027-01-01",
            "--table", str(table)]
    assert imp.main([*argv, "--write"]) == 0
    assert "4 new" in capsys.readouterr().out
    data = yaml.safe_load(table.read_text())
    assert [r["name"] for r in data["statuses"]] == [
        "NV_ERR_GPU_IS_LOST", "NV_OK", "NV_ERR_GENERIC", "NV_ERR_BRAND_NEW", "NV_WARN_HOT_SWITCH"]
    assert data["statuses"][0]["remedy"] == "reboot"  # a judged row is left as it was
    assert {r["remedy"] for r in data["statuses"][1:]} == {"none"}
    assert "at release 999.1 (2027-01-01)" in data["sources"]["header"]
    assert imp.main(argv) == 0 and "0 new" in capsys.readouterr().out  # idempotent


def test_bad_input_is_one_error_line_and_exit_2(tmp_path: Path, capsys) -> None:
    header = tmp_path / "h"
    header.write_text("not a header")
    assert imp.main(["--header", str(header), "--release", "1", "--date", "2020-01-01",
                     "--table", str(tmp_path / "missing.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err


# --- the lines -------------------------------------------------------------------------------

@pytest.mark.parametrize("line,expected", [
    # nvAssertOkFailedNoLog (NVIDIA/open-gpu-kernel-modules#688)
    ("NVRM: nvAssertOkFailedNoLog: Assertion failed: GPU lost from the bus [NV_ERR_GPU_IS_LOST] "
     "(0x0000000F) returned from rmStatus @ kernel_ce_gv100.c:106",
     (0x0F, "NV_ERR_GPU_IS_LOST", "assertion/check")),
    # nvCheckOkFailedNoLog (openwall/john#5835)
    ("NVRM: nvCheckOkFailedNoLog: Check failed: GPU lost from the bus [NV_ERR_GPU_IS_LOST] "
     "(0x0000000F) returned from nvdEngineDumpCallbackHelper(pGpu, pPrbEnc, pNvDumpState, "
     "pEngineCallback) @ nv_debug_dump.c:274", (0x0F, "NV_ERR_GPU_IS_LOST", "assertion/check")),
    # RPC failure (Neroued/ninfer#12)
    ("NVRM: GPU0 _issueRpcAndWait: rpcSendMessage failed with status 0x0000000f for fn 10 "
     "sequence 790!", (0x0F, None, "RPC")),
    # a GSP call's status (scitix/sichek#51): paramsStatus is not read, status is
    ("NVRM: rpcRmApiAlloc_GSP: GspRmAlloc failed: hClient=0xc1d1a616; paramsStatus=0x00000001; "
     "status=0x00000062", (0x62, None, "call")),
    # an expression that names a status is not a returned status (NVIDIA/open-gpu-kernel-modules#1045)
    ("NVRM: GPU0 nvAssertFailedNoLog: Assertion failed: (status == NV_OK) || (status == "
     "NV_ERR_GPU_IN_FULLCHIP_RESET) @ rs_client.c:844", None),
    # RmInitAdapter: init step 0x62, status 0x40 (NVIDIA/open-gpu-kernel-modules#1230)
    ("NVRM: GPU 0000:a1:00.0: RmInitAdapter failed! (0x62:0x40:2168)",
     (0x40, None, "RmInitAdapter")),
    ("NVRM: GPU0 _kgspBootGspRm: unexpected WPR2 already up, cannot proceed with booting GSP", None)])
def test_the_status_each_line_form_reports(line: str, expected: Any) -> None:
    assert xid._logged_status(line) == expected


def test_rm_init_adapters_init_step_is_not_read_as_reset_required() -> None:
    """NVIDIA/open-gpu-kernel-modules#1230: "RmInitAdapter failed! (0x62:0x40:2168)" is init step
    0x62 with status 0x40 (NV_ERR_INVALID_STATE): not NV_ERR_RESET_REQUIRED (0x62)."""
    assert xid.scan_statuses(["[  101.209077] NVRM: GPU 0000:a1:00.0: RmInitAdapter failed! "
                              "(0x62:0x40:2168)"]) == {}
    seen = xid.scan_statuses(["NVRM: GPU 0000:a1:00.0: RmInitAdapter failed! (0x27:0xf:2168)"])
    assert list(seen) == [("0000:a1:00.0", "NV_ERR_GPU_IS_LOST")]


def test_statuses_are_grouped_by_gpu_as_the_line_names_it() -> None:
    lines = ["NVRM: GPU 0000:a1:00.0: RmInitAdapter failed! (0x27:0x62:10)",
             "NVRM: GPU3 _issueRpcAndWait: rpcSendMessage failed with status 0x0000000f for fn 76!",
             "NVRM: GPU3 _issueRpcAndWait: rpcSendMessage failed with status 0x0000000f for fn 76!",
             "NVRM: nvAssertOkFailedNoLog: Assertion failed: Reset required [NV_ERR_RESET_REQUIRED] "
             "(0x00000062) returned from status @ kernel_channel.c:2874",
             "NVRM: _issueRpcAndWait: rpcSendMessage failed with status 0x00000065 for fn 76!",
             "nvidia-nvswitch0: rpc failed with status 0x0000000f"]  # not an NVRM line
    seen = xid.scan_statuses(lines)
    assert {k: v.count for k, v in seen.items()} == {
        ("0000:a1:00.0", "NV_ERR_RESET_REQUIRED"): 1, ("GPU3", "NV_ERR_GPU_IS_LOST"): 2,
        ("", "NV_ERR_RESET_REQUIRED"): 1}  # 0x65 (NV_ERR_TIMEOUT) is not judged


def _xid_events(run_cli, tmp_path: Path, lines: list[str],
                gpus: dict[int, str] | None = None) -> tuple[int, list[dict[str, Any]]]:
    data: dict[str, Any] = {"description": "test: driver status lines",
                            "extends": "h100-sxm-8x-healthy", "host": {"kernel_log": lines}}
    if gpus:
        data["gpu_overrides"] = {i: {"pci_bus_id": a} for i, a in gpus.items()}
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(data))
    code, report, err = run_cli("--simulate", str(path), "--only", "pci-gpus", "--only",
                                "xid-events")
    assert report is not None, err
    (check,) = [c for c in report["checks"] if c["id"] == "xid-events"]
    return code, check["results"]


def test_a_reset_required_line_without_any_xid_fails_that_gpu_with_the_reset_remedy(
        run_cli, tmp_path: Path) -> None:
    line = "NVRM: GPU 0000:a1:00.0: RmInitAdapter failed! (0x27:0x62:2168)"
    code, results = _xid_events(run_cli, tmp_path, [line], {6: "0000:a1:00.0"})
    (result,) = results
    assert code == 1 and result["status"] == "FAIL" and result["device"]["pci"] == "0000:a1:00.0"
    assert result["details"]["status"] == "NV_ERR_RESET_REQUIRED"
    assert result["details"]["code"] == "0x00000062" and "nvidia-smi -r" in result["remedy"]


def test_a_lost_gpu_named_only_by_the_drivers_instance_fails_the_node(run_cli,
                                                                       tmp_path: Path) -> None:
    """Neroued/ninfer#12: "NVRM: GPU0 ..." is the driver's probe order, not nvidia-smi's index,
    so the result is the node's, naming GPU0 as the driver does."""
    line = ("Aug 10 22:40:59.883607 anthill kernel: NVRM: GPU0 _issueRpcAndWait: rpcSendMessage "
            "failed with status 0x0000000f for fn 10 sequence 790!")
    code, results = _xid_events(run_cli, tmp_path, [line])
    (result,) = results
    assert code == 1 and result["status"] == "FAIL" and not result.get("device")
    assert result["details"]["gpu_instance"] == "GPU0" and "driver's GPU0" in result["message"]
    assert "reboot" in result["remedy"]


def test_a_status_line_next_to_an_xid_line_is_reported_as_well(run_cli, tmp_path: Path) -> None:
    """The XID 79 line of NVIDIA/open-gpu-kernel-modules#776 names the GPU; an assertion line
    (#688's) carries no address: both are reported, the status for the node."""
    lines = ["Feb 02 16:44:36 staballoy kernel: NVRM: Xid (PCI:0000:01:00): 79, pid='<unknown>', "
             "name=<unknown>, GPU has fallen off the bus.",
             "NVRM: nvAssertOkFailedNoLog: Assertion failed: GPU lost from the bus "
             "[NV_ERR_GPU_IS_LOST] (0x0000000F) returned from rmStatus @ kernel_ce_gv100.c:106"]
    _, results = _xid_events(run_cli, tmp_path, lines, {0: "0000:01:00.0"})
    got = {str(r["value"]): (r["status"], (r.get("device") or {}).get("pci")) for r in results}
    assert got == {"NV_ERR_GPU_IS_LOST": ("FAIL", None), "79": ("FAIL", "0000:01:00.0")}


def test_statuses_that_mean_nothing_for_the_node_pass(run_cli, tmp_path: Path) -> None:
    lines = ["NVRM: GPU0 _kgspProcessRpcEvent: Failed to process received event 0x1004 "
             "(RC_TRIGGERED) from GPU0: status=0x21",
             "NVRM: nvAssertOkFailedNoLog: Assertion failed: Invalid argument to call "
             "[NV_ERR_INVALID_ARGUMENT] (0x0000001F) returned from status @ x.c:1"]
    code, results = _xid_events(run_cli, tmp_path, lines)
    assert code == 0 and [r["status"] for r in results] == ["PASS"]


# --- Xid lines whose address cannot be read ----------------------------------------------------

def test_an_xid_line_whose_address_cannot_be_read_is_judged_for_the_node(run_cli,
                                                                        tmp_path: Path) -> None:
    """A V100 incident report (a fastllm development note, section "GPU 掉卡") quotes "NVRM: Xid
    (PCI:0000:08:00/0000:09:00): 154 ... GPU Reset Required". Before, a line whose address did
    not parse was skipped and the check said "no XID events"; now the XID is judged, for the
    node (154 without a readable recovery action warns, as it does on a GPU)."""
    lines = ["NVRM: Xid (PCI:0000:08:00/0000:09:00): 154 ... GPU Reset Required"]
    _, results = _xid_events(run_cli, tmp_path, lines, {2: "0000:08:00.0", 3: "0000:09:00.0"})
    (result,) = results
    assert result["status"] == "WARN" and not result.get("device") and result["value"] == 154
    assert result["details"]["logged_address"] == "PCI:0000:08:00/0000:09:00"
    assert "no GPU address" in result["message"]


def test_an_unreadable_address_does_not_hide_a_failing_xid(run_cli, tmp_path: Path) -> None:
    """The same address shape on an XID whose catalog action is a reset (48, RESET_GPU family)."""
    lines = ["NVRM: Xid (PCI:0000:08:00/0000:09:00): 48, pid=1, DBE (double bit error) ECC error"]
    code, results = _xid_events(run_cli, tmp_path, lines)
    assert code == 1 and [(r["status"], r.get("device")) for r in results] == [("FAIL", None)]
