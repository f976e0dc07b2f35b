"""The kernel log is untrusted text: every line is parsed in time linear in its length. Each
test pushes a 1 MB line (plain junk, or a megabyte of near-matches for one pattern) through the
real path (scenario -> fixture backend -> the three checks, or /dev/kmsg decoding) and asserts
the verdict; the bound is the pytest-timeout marker, not a stopwatch. Before the patterns were
bounded, a 40 KB line of this kind took 21-47 s."""

from __future__ import annotations

from pathlib import Path

import pytest

from checks import profiles
from checks.hw import kernel_log as kernlog
from checks.hw.fixture import FixtureBackend, load_scenario
from checks.node import registry, runner
from checks.node.context import Context, Options

MB = 1 << 20
# wilicc/gpu-burn#1: the real XID 79 line that must still be found next to the junk
XID_79 = "[74889.644138] NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus."
AER_ON = "[    1.234567] pcieport 0000:00:01.0: AER: enabled with IRQ 120"


def _verdicts(tmp_path: Path, lines: list[str]) -> dict[str, list[str]]:
    """The healthy H100 node with these kernel-log lines (set after loading: a YAML round trip of
    a megabyte string takes PyYAML longer than the parse under test)."""
    data = load_scenario("h100-sxm-8x-healthy")
    data.setdefault("host", {})["kernel_log"] = lines
    hw = FixtureBackend(data)
    checks = registry.select("quick", ["xid-events", "nvswitch-sxid", "pcie-aer"])
    outcomes = runner.run(checks, Context(hw, profiles.load("generic"), Options()))
    return {o.id: [r.status for r in o.results] for o in outcomes}


def _fill(unit: str) -> str:
    return (unit * (MB // len(unit) + 1))[:MB]


# One near-match per pattern that backtracked before: each repeats a prefix the pattern accepts
# and never completes it.
NEAR_MISSES = {
    "no spaces (driver name before a PCI address)": "a",
    "driver names, then an address without a bus error": "nvidia 0000:01:00.0 ",
    "xid prefix without a closing parenthesis": "NVRM: Xid (PCI:0000:01:00 ",
    "recovery action without its closing parenthesis": "recovery action changed from 0x0 (",
    "_OSC list never naming AER": "_OSC: OS now controls [",
    "bandwidth line never finished": "nvidia 0000:01:00.0: 1.0 Gb/s available PCIe bandwidth, ",
    "SXid prefix without a code": "nvidia-nvswitch1: SXid (PCI:0000:04:00.0): ",
    "one megabyte of digits as an XID number": "0",
    "driver status name never followed by its code": "NVRM: [NV_ERR_GPU_IS_LOST] (0x",
    "RPC failure never giving its status": "NVRM: rpcSendMessage failed with status 0x",
}


@pytest.mark.timeout(20)
@pytest.mark.parametrize("unit", NEAR_MISSES.values(), ids=NEAR_MISSES.keys())
def test_a_1mb_line_of_near_matches_is_parsed_and_judged(tmp_path: Path, unit: str) -> None:
    junk = _fill(unit)
    verdicts = _verdicts(tmp_path, [AER_ON, junk, XID_79, "NVRM: Xid (PCI:0000:03:00): " + junk])
    assert verdicts["xid-events"] == ["FAIL"]  # the real XID 79 is found, the junk judged nothing
    assert verdicts["pcie-aer"] == ["PASS"]
    assert verdicts["nvswitch-sxid"] in (["PASS"], ["WARN"])  # junk SXid lines: severity unknown


@pytest.mark.timeout(20)
def test_a_1mb_line_that_starts_with_a_real_event_is_still_judged(tmp_path: Path) -> None:
    verdicts = _verdicts(tmp_path, [XID_79 + " " + _fill("x")])
    assert verdicts["xid-events"] == ["FAIL"]


@pytest.mark.timeout(20)
def test_a_1mb_kmsg_record_decodes(tmp_path: Path) -> None:
    """/dev/kmsg escapes are expanded before parsing: a megabyte of them, and a megabyte-long
    header field, neither hang nor crash the decoder."""
    escaped = _fill("\\x41")
    text = (f"6,1,5000000,-;{escaped}\n" + _fill("9") + ",2,3,-;x\n"
            + "4,3,81234551000,-;" + XID_79.split("] ", 1)[1] + "\n")
    lines = kernlog.parse_kmsg(text)
    assert len(lines) == 2  # the 1 MB sequence number is not a record
    assert lines[0].startswith("[    5.000000] AAAA") and len(lines[0]) > MB // 4
    assert lines[1] == "[81234.551000] " + XID_79.split("] ", 1)[1]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("unit", NEAR_MISSES.values(), ids=NEAR_MISSES.keys())
def test_the_patterns_are_linear_without_the_line_cap(monkeypatch: pytest.MonkeyPatch,
                                                      unit: str) -> None:
    """The line cap is a second defence: with it lifted, every pattern still runs a megabyte of
    near-matches in linear time."""
    from checks.node.suite import kernel_errors, kernlog_gpu_xid, kernlog_nvswitch_sxid, kernlog_pcie_aer

    monkeypatch.setattr(kernel_errors, "MAX_LINE_CHARS", 1 << 30)
    lines = [_fill(unit), XID_79]
    assert list(kernlog_gpu_xid.scan_xids(lines)) == [("0000:02:00", 79)]
    assert kernlog_nvswitch_sxid.scan_sxids([_fill(unit)]) == {}
    assert kernlog_pcie_aer.scan_aer(lines).devices == {}
