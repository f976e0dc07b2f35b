"""The kernel log, read right (journalctl -> dmesg -> /dev/kmsg) and scanned right (xid-events,
nvswitch-sxid, pcie-aer). Log lines are quoted from the public reports named beside them."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from checks import profiles
from checks.hw import kernel_log as kernlog
from checks.hw.base import HardwareError
from checks.hw.fixture import FixtureBackend, load_scenario
from checks.hw.linux import LinuxBackend
from checks.node import registry, runner
from checks.node.context import Context, Options
from checks.node.suite import kernel_errors as shared
from checks.node.suite import kernlog_gpu_xid as xids
from checks.node.suite import kernlog_pcie_aer as aers

# --- reading: the fallback chain --------------------------------------------------------------

NO_ENTRIES = "-- No entries --"  # systemd#17442: journalctl without journal access, exit 0
DMESG_EPERM = "dmesg: read kernel buffer failed: Operation not permitted"  # noonghunna/club-3090#751
BOOT = "[    0.000000] Linux version 6.8.0-45-generic (buildd@lcy02-amd64-075)"


def _fake(bindir: Path, name: str, stdout: str = "", stderr: str = "", rc: int = 0,
          sleep: float = 0) -> None:
    script = bindir / name
    out = stdout.replace("'", "'\\''")
    err = stderr.replace("'", "'\\''")
    hang = f"exec /bin/sleep {sleep}" if sleep else ""  # exec: the timeout's kill reaches it
    script.write_text(f"#!/bin/sh\n{hang}\n"
                      f"printf '%s' '{out}'\nprintf '%s' '{err}' >&2\nexit {rc}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def bindir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "bin"
    path.mkdir()
    monkeypatch.setenv("PATH", str(path))  # only the fakes: nothing from the host answers
    return path


def _kmsg_record(prio: int, seq: int, usec: int, text: str) -> str:
    return f"{prio},{seq},{usec},-;{text}\n"


def test_journal_without_access_falls_through_to_dmesg(bindir: Path, tmp_path: Path) -> None:
    _fake(bindir, "journalctl", stdout=NO_ENTRIES + "\n")
    _fake(bindir, "dmesg", stdout=BOOT + "\n[   81.5] NVRM: Xid (PCI:0000:02:00): 79, GPU has "
                                         "fallen off the bus.\n")
    log = kernlog.read_kernel_log(kmsg=tmp_path / "absent")
    assert log.source == "dmesg --kernel"
    assert len(log) == 2 and "Xid" in log[1]
    assert log.skipped == [f"journalctl -k -b: {NO_ENTRIES} (no journal access, or the journal "
                           "holds nothing for this boot)"]


def test_journal_headers_are_not_kernel_lines(bindir: Path, tmp_path: Path) -> None:
    _fake(bindir, "journalctl", stdout="-- Logs begin at Mon 2024-09-30 10:00:00 UTC, end at "
                                       "Mon 2024-09-30 11:00:00 UTC. --\n" + BOOT + "\n")
    log = kernlog.read_kernel_log(kmsg=tmp_path / "absent")
    assert (log.source, list(log), log.skipped) == ("journalctl -k -b", [BOOT], [])


def test_dmesg_not_permitted_falls_through_to_kmsg(bindir: Path, tmp_path: Path) -> None:
    _fake(bindir, "dmesg", stderr=DMESG_EPERM + "\n", rc=1)  # and no journalctl at all
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(
        _kmsg_record(6, 1, 0, "Linux version 6.8.0-45-generic")
        + _kmsg_record(6, 1093, 4096000, "nvidia 0000:3b:00.0: enabling device (0000 -> 0003)")
        + " SUBSYSTEM=pci\n DEVICE=+pci:0000:3b:00.0\n"  # dictionary lines are not messages
        + _kmsg_record(12, 1094, 4100000, "a user-space line written to /dev/kmsg")
        + _kmsg_record(4, 1095, 81234551000, "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen "
                                            "off the bus.\\x5c"))
    log = kernlog.read_kernel_log(kmsg=kmsg)
    assert log.source == str(kmsg)
    assert list(log) == [
        "[    0.000000] Linux version 6.8.0-45-generic",
        "[    4.096000] nvidia 0000:3b:00.0: enabling device (0000 -> 0003)",
        "[81234.551000] NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\\"]
    assert log.skipped == ["journalctl -k -b: not installed",
                           f"dmesg --kernel: exit 1: {DMESG_EPERM}"]


def test_kmsg_reads_until_eagain_and_does_not_wait_for_more(bindir: Path, tmp_path: Path) -> None:
    """The real device never ends: reading stops at EAGAIN. A FIFO whose writer stays open
    behaves the same way."""
    fifo = tmp_path / "kmsg"
    os.mkfifo(fifo)
    writer = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)  # keeps the FIFO open: no EOF, only EAGAIN
    try:
        os.write(writer, (_kmsg_record(6, 1, 5_101_000, "nvidia: loading out-of-tree module")
                          + _kmsg_record(3, 2, 9_000_000, "NVRM: GPU at PCI:0000:18:00")).encode())
        done: dict[str, list[str]] = {}
        reader = threading.Thread(target=lambda: done.setdefault(
            "lines", list(kernlog.read_kernel_log(kmsg=fifo))), daemon=True)
        reader.start()
        reader.join(5)
        assert not reader.is_alive(), "kmsg reader waited for more records"
    finally:
        os.close(writer)
    assert done["lines"] == ["[    5.101000] nvidia: loading out-of-tree module",
                             "[    9.000000] NVRM: GPU at PCI:0000:18:00"]


def test_every_source_failing_is_an_error_naming_each(bindir: Path, tmp_path: Path) -> None:
    _fake(bindir, "journalctl", stdout=NO_ENTRIES + "\n")
    _fake(bindir, "dmesg", stderr=DMESG_EPERM + "\n", rc=1)
    with pytest.raises(HardwareError) as caught:
        kernlog.read_kernel_log(kmsg=tmp_path / "kmsg")
    message = str(caught.value)
    assert message.startswith("cannot read this boot's kernel log: journalctl -k -b: -- No entries")
    assert f"dmesg --kernel: exit 1: {DMESG_EPERM}" in message
    assert f"{tmp_path / 'kmsg'}: not present" in message
    assert "\n" not in message


def test_kmsg_refused_by_dmesg_restrict(bindir: Path, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Opening /dev/kmsg under kernel.dmesg_restrict=1 fails with EPERM (root reads anything, so
    the refusal is injected at os.open)."""
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(_kmsg_record(6, 1, 0, "Linux version 6.8.0-45-generic"))
    real_open = os.open

    def refuse(path, flags, *args):
        if Path(path) == kmsg:
            raise PermissionError(1, "Operation not permitted")
        return real_open(path, flags, *args)

    monkeypatch.setattr(kernlog.os, "open", refuse)
    with pytest.raises(HardwareError, match=r"kmsg: permission denied \(kernel.dmesg_restrict=1\?\)"):
        kernlog.read_kernel_log(kmsg=kmsg)


def test_a_hung_journalctl_is_abandoned(bindir: Path, tmp_path: Path) -> None:
    _fake(bindir, "journalctl", stdout=BOOT, sleep=30)
    _fake(bindir, "dmesg", stdout=BOOT + "\n")
    log = kernlog.read_kernel_log(kmsg=tmp_path / "absent", timeout_s=0.5)
    assert log.source == "dmesg --kernel"
    assert log.skipped == ["journalctl -k -b: no answer within 0.5 s"]


def test_empty_sources_are_failures_not_a_quiet_kernel(bindir: Path, tmp_path: Path) -> None:
    _fake(bindir, "journalctl", stdout="")
    _fake(bindir, "dmesg", stdout="\n")
    (tmp_path / "kmsg").write_text("")
    with pytest.raises(HardwareError, match=r"dmesg --kernel: printed nothing; .*no kernel records"):
        kernlog.read_kernel_log(kmsg=tmp_path / "kmsg")


def test_linux_backend_reads_through_the_chain(bindir: Path) -> None:
    _fake(bindir, "journalctl", stdout=NO_ENTRIES + "\n")
    _fake(bindir, "dmesg", stdout=BOOT + "\n")
    lines = LinuxBackend().kernel_log()
    assert lines == [BOOT] and lines.source == "dmesg --kernel"  # type: ignore[attr-defined]


# --- scanning, through the public CLI ----------------------------------------------------------

def _scenario(tmp_path: Path, log: list[str] | dict, *, gpus: dict[int, str] | None = None,
              nvswitches: list[str] | None = None, paths: dict[int, list[str]] | None = None) -> str:
    """A scenario extending the healthy H100 node, with this kernel log and GPUs/NVSwitches moved
    to the addresses of the report the lines come from."""
    import yaml

    data: dict = {"description": "test: kernel log lines from the public reports cited in "
                                 "tests/framework/test_kernlog.py",
                  "extends": "h100-sxm-8x-healthy", "host": {"kernel_log": log}}
    overrides: dict[int, dict] = {}
    for index, address in (gpus or {}).items():
        overrides.setdefault(index, {})["pci_bus_id"] = address
    for index, bridges in (paths or {}).items():
        overrides.setdefault(index, {})["pci_path"] = bridges
    if overrides:
        data["gpu_overrides"] = overrides
    if nvswitches is not None:
        data["nvswitches"] = nvswitches
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True))
    return str(path)


def _check(report: dict, check_id: str) -> dict:
    (chk,) = [c for c in report["checks"] if c["id"] == check_id]
    return chk


def _run(run_cli, scenario: str, *extra: str) -> dict:
    _, report, err = run_cli("--simulate", scenario, "--only", "pci-gpus", "--only", "xid-events",
                             "--only", "nvswitch-sxid", "--only", "pcie-aer", *extra)
    assert report is not None, err
    return report


def test_unreadable_log_is_error_in_every_log_check(run_cli, tmp_path: Path) -> None:
    scenario = _scenario(tmp_path, {"error": f"journalctl -k -b: {NO_ENTRIES}; dmesg --kernel: "
                                             f"exit 1: {DMESG_EPERM}; /dev/kmsg: permission denied"})
    code, report, _ = run_cli("--simulate", scenario, "--level", "quick")
    assert code == 1
    for check_id, fault in (("xid-events", "GPU005-E"), ("nvswitch-sxid", "GPU013-E"),
                            ("pcie-aer", "GPU014-E")):
        chk = _check(report, check_id)
        (result,) = chk["results"]
        assert (chk["status"], result["fault_code"]) == ("ERROR", fault)
        assert "Operation not permitted" in result["message"]


XID_LINES = {
    # wilicc/gpu-burn#1 (Tesla, dmesg after a crash)
    "hardware": "[74889.644138] NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus.",
    # NVIDIA "GPU Memory Error Management", Table 3: contained error with MIG enabled
    "mig": "NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9). "
           "RST: No, D-RST: No",
    # leptonai/gpud#46 (dmesg of an H100 node)
    "software": "[Fri Aug 30 11:43:14 2024] NVRM: Xid (PCI:0000:cb:00): 109, pid=1797828, "
                "name=pt_main_thread, Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005",
    # leptonai/gpud#1174 (GB200, kmsg input quoted in the PR): NVLink5 XIDs
    "nvlink5-nonfatal": "NVRM: Xid (PCI:0018:01:00): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 13 "
                        "(0x0409a0c2 0x00000008 0x00000001 0x00000000 0x00100000 0x00000004)",
    "nvlink5-fatal": "NVRM: Xid (PCI:0019:01:00): 149, NETIR Fatal XC0 i0 Link -1 (0x000fe406 "
                     "0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",
    # open-gpu-kernel-modules#446 (8x A100 SXM4, Talos journal with its own prefix)
    "prefixed": "192.168.11.119: kern: warning: [2026-04-22T21:25:20.505406921Z]: NVRM: Xid "
                "(PCI:0000:48:00): 62, 00002740 00002b08 00001126 0000117a 0000279f 0002a91a "
                "00000011 00000000",
}


def test_xid_classes(run_cli, tmp_path: Path) -> None:
    scenario = _scenario(tmp_path, list(XID_LINES.values()), gpus={
        0: "0000:01:00.0", 1: "0000:02:00.0", 2: "0000:48:00.0", 3: "0000:cb:00.0",
        4: "0018:01:00.0", 5: "0019:01:00.0"})
    report = _run(run_cli, scenario, "--only", "gpu-count")
    results = {r["details"]["xid"]: r for r in _check(report, "xid-events")["results"]}
    assert {x: r["status"] for x, r in results.items()} == {
        79: "FAIL", 94: "WARN", 109: "FAIL", 145: "WARN", 149: "FAIL", 62: "FAIL"}
    assert results[79]["device"]["pci"] == "0000:02:00.0"
    assert "reboot" in results[79]["remedy"] and "cannot reach" in results[79]["remedy"]
    assert results[94]["device"]["pci"] == "0000:01:00.0"  # MIG "GPU-I:05" suffix parsed
    # the catalog: 94 (contained, "RST: No") restarts the application, 109 resets the GPU
    assert "RESTART_APP" in results[94]["message"]
    assert "RESET_GPU" in results[109]["message"]
    assert results[145]["message"] == ("XID 145 (NVLINK_RLW_ERROR, NVLink5, non-fatal) x1 on "
                                       "0018:01:00.0")
    assert results[149]["message"] == ("XID 149 (NVLINK_NETIR_ERROR, NVLink5, fatal) x1 on "
                                       "0019:01:00.0")
    assert results[62]["details"]["last"] == XID_LINES["prefixed"]
    # gpu-count read NVML this run, so the result carries the GPU's index and serial for an RMA
    assert (results[62]["device"]["index"], results[62]["device"]["serial"]) == (2, "1650123000002")
    assert results[149]["details"]["source"] == "the fixture backend"


def test_xid_154_puts_the_recovery_action_into_the_result(run_cli, tmp_path: Path) -> None:
    # An XID 31 as akash-network/support#244 quotes it, then XID 154 in the text NVIDIA's XID
    # catalogue gives, with the action open-gpu-kernel-modules#1134 reports after an XID 31
    # ("Xid 31 -> Xid 154 (Node Reboot Required)").
    lines = ["[Mon Aug  5 03:54:13 2024] NVRM: Xid (PCI:0000:00:07): 31, pid=2512125, "
             "name=python3.10, Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS "
             "GPCCLIENT_T1_8 faulted @ 0x73ac_1c000000. Fault is of type FAULT_PDE "
             "ACCESS_TYPE_VIRT_WRITE",
             "NVRM: Xid (PCI:0000:00:07): 154, GPU recovery action changed from 0x0 (None) to "
             "0x2 (Node Reboot Required)"]
    report = _run(run_cli, _scenario(tmp_path, lines, gpus={0: "0000:00:07.0"}))
    results = {r["details"]["xid"]: r for r in _check(report, "xid-events")["results"]}
    action = results[154]
    assert action["status"] == "FAIL"
    assert "'Node Reboot Required' (0x2)" in action["message"]
    assert action["details"]["recovery_action"] == {"code": "0x2", "name": "Node Reboot Required"}
    assert action["remedy"].startswith("drain the node and reboot it")
    assert results[31]["status"] == "WARN"


@pytest.mark.parametrize("action,remedy", [
    # open-gpu-kernel-modules#1045 (RTX 5080): "Xid 154 (GPU reset required)"
    ("0x1 (GPU Reset Required)", "reset the GPU"),
    ("0x4 (Drain and Reset)", "stop the jobs using this GPU (P2P included), reset"),
])
def test_xid_154_actions_word_the_remedy(run_cli, tmp_path: Path, action: str, remedy: str) -> None:
    line = f"NVRM: Xid (PCI:0000:18:00): 154, GPU recovery action changed from 0x0 (None) to {action}"
    (result,) = _check(_run(run_cli, _scenario(tmp_path, [line])), "xid-events")["results"]
    assert result["status"] == "FAIL" and remedy in result["remedy"]


def test_xid_on_a_five_digit_vmd_domain(run_cli, tmp_path: Path) -> None:
    # Under Intel VMD the kernel numbers the domain 10000 (bugzilla.kernel.org #215027:
    # "vmd 0000:00:0e.0: PCI host bridge to bus 10000:e0"); the driver prints it in full.
    line = "NVRM: Xid (PCI:10000:e1:00): 79, GPU has fallen off the bus."
    report = _run(run_cli, _scenario(tmp_path, [line], gpus={0: "10000:e1:00.0"}))
    (result,) = _check(report, "xid-events")["results"]
    assert (result["status"], result["device"]["pci"]) == ("FAIL", "10000:e1:00.0")
    assert result["details"]["logged_address"] == "10000:e1:00"


def test_gpu_lost_at_probe_without_an_xid_line(run_cli, tmp_path: Path) -> None:
    # NVIDIA/NVSentinel#155: the probe-time message carries no Xid number.
    lines = ["[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0",
             "               NVRM: (PCI ID: 10de:26b5) installed in this system has",
             "               NVRM: fallen off the bus and is not responding to commands.",
             "[ 1843.439662] NVRM: The NVIDIA probe routine failed for 1 device(s)."]
    report = _run(run_cli, _scenario(tmp_path, lines, gpus={0: "0000:b3:00.0"}))
    (result,) = _check(report, "xid-events")["results"]
    assert (result["status"], result["value"], result["device"]["pci"]) == ("FAIL", 79, "0000:b3:00.0")
    assert result["details"]["notes"] == ["lost at driver probe (no Xid line)"]


def test_an_xid_on_an_address_not_on_the_bus_is_still_reported(run_cli, tmp_path: Path) -> None:
    report = _run(run_cli, _scenario(tmp_path, [XID_LINES["hardware"]]))
    (result,) = _check(report, "xid-events")["results"]
    assert (result["status"], result["device"]["pci"]) == ("FAIL", "0000:02:00")
    assert result["details"]["on_bus"] is False


def test_unclassified_xid_warns(tmp_path: Path) -> None:
    """An XID beyond the shipped catalog (a newer driver) warns as unclassified; the line is
    Bumblebee-Project/Bumblebee#677's with the number changed."""
    line = "[24128.828315] NVRM: Xid (PCI:0000:01:00): 999, Channel ID 00000000 intr 00004000"
    hw = FixtureBackend(load_scenario(_scenario(tmp_path, [line])))
    profile = profiles.load("generic")
    (outcome,) = runner.run(registry.select("quick", ["xid-events"]), Context(hw, profile, Options()))
    (result,) = outcome.results
    assert result.status == "WARN"
    assert result.message.startswith("XID 999 (XID 999 is not in NVIDIA's catalog as shipped")


def test_xid_addresses_without_a_domain() -> None:
    """Lines without the domain map to the GPU only when one GPU has that bus:device."""
    seen = xids.scan_xids(["NVRM: Xid (0000:03:00): 13, Channel 00000001",  # old driver format
                           "NVRM: Xid (PCI:01:00): 79, GPU has fallen off the bus."])
    assert set(seen) == {("0000:03:00", 13), ("01:00", 79)}
    from checks.hw.base import PciDevice

    one = [PciDevice("0008:01:00.0", 0x10DE, 0x2941, 0x030200)]
    two = [*one, PciDevice("0009:01:00.0", 0x10DE, 0x2941, 0x030200)]  # GB200: one bus per domain
    assert shared.find("01:00", one) == one[0]
    assert shared.find("01:00", two) is None  # ambiguous: left as logged, never guessed
    assert shared.find("0009:01:00", two) == two[1]


def test_the_log_is_read_once_per_run(tmp_path: Path) -> None:
    class Counting(FixtureBackend):
        reads = 0

        def kernel_log(self) -> list[str]:
            Counting.reads += 1
            return super().kernel_log()

    hw = Counting(load_scenario(_scenario(tmp_path, [XID_LINES["hardware"]])))
    checks = registry.select("quick", ["xid-events", "nvswitch-sxid", "pcie-aer"])
    outcomes = runner.run(checks, Context(hw, profiles.load("generic"), Options()))
    assert [o.id for o in outcomes] == ["xid-events", "nvswitch-sxid", "pcie-aer"]
    assert Counting.reads == 1


# --- nvswitch-sxid -----------------------------------------------------------------------------

# canonical/tdx#414 (HGX H100, boot of a TD with protected PCIe)
SXID_NONFATAL = [
    "[   38.175561] nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Data {0x0000002b, "
    "0x0000002b, 0x00000000, 0x0000002b, 0x80005302, 0x00000000, 0x00000000, 0x00000000, 0x00000000}",
    "[   38.178720] nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Non-fatal, Link 44 Minion "
    "Link DLREQ interrupt",
    "[   38.180708] nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Severity 0 Engine instance "
    "44 Sub-engine instance 00",
    "[   38.187830] nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Non-fatal, Link 45 Minion "
    "Link DLREQ interrupt",
]
# open-gpu-kernel-modules#446 (8x A100 SXM4): only the Severity/Data lines of SXid 24007
SXID_24007_DETAIL = [
    "192.168.11.119: kern:     err: [2026-04-22T21:25:20.466440686Z]: nvidia-nvswitch1: SXid "
    "(PCI:0000:aa:00.0): 24007, Severity 1 Engine instance 12 Sub-engine instance 00",
    "192.168.11.119: kern:     err: [2026-04-22T21:25:20.500049682Z]: nvidia-nvswitch1: SXid "
    "(PCI:0000:aa:00.0): 24007, Data {0x10000000, 0x10008100, 0x10000000, 0x10008100, "
    "0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000}",
]
# AI闲谈, "大规模 GPU 集群运维实践" (the switch address is elided in the article; here it is
# the scenario's first NVSwitch)
SXID_FATAL = ("nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 24007, Fatal, Link 44 sourcetrack "
              "timeout error (First)")


def test_sxid_the_guide_says_to_ignore_passes(run_cli, tmp_path: Path) -> None:
    """22013 (Minion Link DLREQ interrupt): the Fabric Manager user guide says it can be safely
    ignored, so canonical/tdx#414's lines are reported, not a finding."""
    scenario = _scenario(tmp_path, SXID_NONFATAL, nvswitches=["0000:04:00.0", "0000:05:00.0"])
    (result,) = _check(_run(run_cli, scenario), "nvswitch-sxid")["results"]
    assert result["status"] == "PASS"
    assert "safely ignored" in result["message"]
    assert result["device"] == {"index": None, "pci": "0000:04:00.0", "uuid": None,
                                "name": "nvidia-nvswitch3", "serial": None}
    assert result["details"]["nonfatal"] == 2 and result["details"]["fatal"] == 0


def test_nonfatal_sxids_warn_past_the_threshold(run_cli, tmp_path: Path) -> None:
    """canonical/tdx#414's line shape with the code of a Non-fatal SXid the guide does not say
    to ignore (20001, TX replay)."""
    lines = [line.replace("22013", "20001") for line in SXID_NONFATAL]
    scenario = _scenario(tmp_path, lines, nvswitches=["0000:04:00.0", "0000:05:00.0"])
    (result,) = _check(_run(run_cli, scenario), "nvswitch-sxid")["results"]
    assert result["status"] == "WARN"
    assert result["message"] == ("non-fatal SXid 20001 TX Replay Error x2 on NVSwitch 0000:04:00.0 "
                                 "(Link 45 Minion Link DLREQ interrupt)")


def test_fatal_sxid_fails_naming_the_nvswitch(run_cli, tmp_path: Path) -> None:
    code, report, _ = run_cli("--simulate", _scenario(tmp_path, [SXID_FATAL]), "--only",
                              "nvswitch-sxid")
    (result,) = _check(report, "nvswitch-sxid")["results"]
    assert code == 1
    assert result["status"] == "FAIL" and result["fault_code"] == "GPU013"
    assert "NVSwitch 0000:05:00.0" in result["message"] and "reboot" in result["remedy"]


def test_fatal_code_with_only_its_detail_lines_still_fails(run_cli, tmp_path: Path) -> None:
    scenario = _scenario(tmp_path, SXID_24007_DETAIL, nvswitches=["0000:aa:00.0"])
    (result,) = _check(_run(run_cli, scenario), "nvswitch-sxid")["results"]
    assert result["status"] == "FAIL" and "no severity printed" in result["message"]
    assert result["device"]["pci"] == "0000:aa:00.0"


def test_sxid_skips_without_nvswitch_and_passes_with_a_quiet_one(run_cli, tmp_path: Path) -> None:
    (skipped,) = _check(_run(run_cli, _scenario(tmp_path, [BOOT], nvswitches=[])),
                        "nvswitch-sxid")["results"]
    assert skipped["status"] == "SKIP" and "no NVSwitch" in skipped["message"]
    (quiet,) = _check(_run(run_cli, _scenario(tmp_path, [BOOT])), "nvswitch-sxid")["results"]
    assert quiet["status"] == "PASS" and quiet["message"].startswith("no SXid events from 4")


# --- pcie-aer ----------------------------------------------------------------------------------

# wilicc/gpu-burn#1: old kernel (requester IDs), a fatal error at the root port above the GPU,
# then XID 79
GPU_BURN_AER = [
    "[74785.660366] pcieport 0000:00:02.0: AER: Corrected error received: id=0010",
    "[74785.660380] pcieport 0000:00:02.0: PCIe Bus Error: severity=Corrected, type=Data Link "
    "Layer, id=0010(Transmitter ID)",
    "[74889.542031] pcieport 0000:00:02.0: AER: Uncorrected (Fatal) error received: id=0010",
    "[74889.542044] pcieport 0000:00:02.0: PCIe Bus Error: severity=Uncorrected (Fatal), "
    "type=Transaction Layer, id=0010(Receiver ID)",
    "[74889.542234] pcieport 0000:00:02.0: broadcast error_detected message",
    "[74889.542239] nvidia 0000:02:00.0: device has no AER-aware driver",
    "[74889.644138] NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus.",
]
# rwth-i6/returnn#1500 (dmesg -H of a hung training job)
RETURNN_AER = [
    "[  +0.000001] pcieport 0000:00:03.0: AER: Multiple Uncorrected (Fatal) error received: "
    "0000:00:03.0",
    "[  +0.000004] pcieport 0000:00:03.0: PCIe Bus Error: severity=Uncorrected (Fatal), "
    "type=Transaction Layer, (Requester ID)",
    "[  +0.000921] nvidia 0000:03:00.0: AER: can't recover (no error_detected callback)",
]
# bugzilla.kernel.org #215027 as quoted on linux-pci ("PCI: vmd: Enable Hotplug based on BIOS
# setting on VMD rootports", Dec 2023): NVMe below a VMD root port, 5-digit domain
VMD_AER = ["pcieport 10000:e0:06.0: AER: Corrected error received: 10000:e1:00.0",
           "nvme 10000:e1:00.0: PCIe Bus Error: severity=Corrected, type=Physical Layer, "
           "(Receiver ID)"]
VMD_AER_ON = "[    1.486704] pcieport 10000:e0:06.0: AER: enabled with IRQ 146"


def test_fatal_aer_at_the_port_above_a_gpu_fails(run_cli, tmp_path: Path) -> None:
    report = _run(run_cli, _scenario(tmp_path, GPU_BURN_AER, gpus={0: "0000:02:00.0"}))
    (result,) = _check(report, "pcie-aer")["results"]
    assert result["status"] == "FAIL" and result["fault_code"] == "GPU014"
    assert result["message"] == ("uncorrected PCIe error(s) on PCIe port 0000:00:02.0 above GPU "
                                 "0000:02:00.0: 1 corrected, 1 fatal")
    assert result["device"]["pci"] == "0000:02:00.0"
    assert result["details"]["role"] == "upstream"
    assert _check(report, "xid-events")["status"] == "FAIL"


def test_uncorrected_aer_found_above_the_gpu_by_pci_path(run_cli, tmp_path: Path) -> None:
    scenario = _scenario(tmp_path, RETURNN_AER[:2], gpus={0: "0000:03:00.0"},
                         paths={0: ["0000:00:03.0"]})
    (result,) = _check(_run(run_cli, scenario), "pcie-aer")["results"]
    assert result["status"] == "FAIL" and result["details"]["above"] == "0000:03:00.0"


def test_uncorrected_aer_found_above_the_gpu_by_the_recovery_lines(run_cli, tmp_path: Path) -> None:
    scenario = _scenario(tmp_path, RETURNN_AER, gpus={0: "0000:03:00.0"})
    (result,) = _check(_run(run_cli, scenario), "pcie-aer")["results"]
    assert result["status"] == "FAIL" and result["details"]["above"] == "0000:03:00.0"


def test_uncorrected_aer_on_the_gpu_itself_fails(run_cli, tmp_path: Path) -> None:
    # The device line as aer_print_error() prints it (format of the igb report below), logged by
    # the scenario's GPU 0000:18:00.0.
    lines = ["pcieport 0000:17:01.0: AER: Uncorrected (Non-Fatal) error received: 0000:18:00.0",
             "nvidia 0000:18:00.0: PCIe Bus Error: severity=Uncorrected (Non-Fatal), "
             "type=Transaction Layer, (Requester ID)"]
    (result,) = _check(_run(run_cli, _scenario(tmp_path, lines)), "pcie-aer")["results"]
    assert result["status"] == "FAIL" and result["message"].startswith(
        "uncorrected PCIe error(s) on GPU 0000:18:00.0: 1 nonfatal")


def test_uncorrected_aer_on_another_device_warns_naming_it(run_cli, tmp_path: Path) -> None:
    # netdev report of a panic in igb_io_error_detected(): a NIC's non-fatal AER error
    lines = ["[  T292] pcieport 0000:00:1c.5: AER: Uncorrected (Non-Fatal) error received: "
             "0000:09:00.0",
             "[  T292] igb 0000:09:00.0: PCIe Bus Error: severity=Uncorrected (Non-Fatal), "
             "type=Transaction Layer, (Requester ID)"]
    (result,) = _check(_run(run_cli, _scenario(tmp_path, lines)), "pcie-aer")["results"]
    assert result["status"] == "WARN"
    assert result["message"] == "uncorrected PCIe error(s) on igb 0000:09:00.0: 1 nonfatal"
    assert result["device"]["pci"] == "0000:09:00.0" and result["device"]["name"] == "igb"


def test_corrected_aer_warns_past_the_published_replay_limit(run_cli, tmp_path: Path) -> None:
    # The device line of aer_print_error() for a corrected Physical Layer error on an NVIDIA GPU
    # (same wording as the nvme line of bugzilla #215027); 81 is one more than DCGM's 80 replays.
    line = "nvidia 0000:3b:00.0: PCIe Bus Error: severity=Corrected, type=Physical Layer, (Receiver ID)"
    scenario = _scenario(tmp_path, [VMD_AER_ON, *[line] * 81], gpus={0: "0000:3b:00.0"})
    (result,) = _check(_run(run_cli, scenario), "pcie-aer")["results"]
    assert result["status"] == "WARN" and result["value"] == 81
    assert result["expected"] == "<= 80 per device"
    scenario = _scenario(tmp_path, [VMD_AER_ON, *[line] * 3], gpus={0: "0000:3b:00.0"})
    (result,) = _check(_run(run_cli, scenario), "pcie-aer")["results"]
    assert result["status"] == "PASS" and result["details"]["corrected"] == {"0000:3b:00.0": 3}


def test_corrected_aer_on_a_vmd_domain_and_newer_kernel_wording(run_cli, tmp_path: Path) -> None:
    # pop-os/pop#3363: kernel 6.x says "Correctable error message received from"
    newer = ["pcieport 0000:00:03.1: AER: Correctable error message received from 0000:00:00.0",
             "pcieport 0000:00:03.1: PCIe Bus Error: severity=Correctable, type=Data Link Layer, "
             "(Transmitter ID)"]
    lines = [VMD_AER_ON, *VMD_AER * 81, *newer]
    (result,) = _check(_run(run_cli, _scenario(tmp_path, lines)), "pcie-aer")["results"]
    assert result["status"] == "WARN"
    assert result["message"] == "81 corrected PCIe errors on nvme 10000:e1:00.0"
    aer = aers.scan_aer(lines)
    assert aer.devices["0000:00:03.1"].counts["corrected"] == 1
    assert aer.below == {"10000:e1:00.0": "10000:e0:06.0", "0000:00:00.0": "0000:00:03.1"}


def test_a_narrow_link_reported_by_the_kernel_warns(run_cli, tmp_path: Path) -> None:
    # pcie_print_link_status() output quoted on linux-pci (an NVMe behind a x8 link)
    line = ("[    0.276602] pci 0000:01:00.0: 63.008 Gb/s available PCIe bandwidth, limited by "
            "8.0 GT/s PCIe x8 link at 0000:00:01.0 (capable of 126.016 Gb/s with 8.0 GT/s PCIe x16 "
            "link)")
    (result,) = _check(_run(run_cli, _scenario(tmp_path, [VMD_AER_ON, line])), "pcie-aer")["results"]
    assert result["status"] == "WARN"
    assert result["message"] == ("pci 0000:01:00.0 link limited: x8 at 8.0 GT/s (capable of x16 at "
                                 "8.0 GT/s), limited at 0000:00:01.0")


def test_a_gpu_link_slow_only_at_idle_is_not_a_finding() -> None:
    line = ("nvidia 0000:18:00.0: 4.000 Gb/s available PCIe bandwidth, limited by 2.5 GT/s PCIe "
            "x16 link at 0000:17:01.0 (capable of 504.112 Gb/s with 32.0 GT/s PCIe x16 link)")
    entry = aers.scan_aer([line]).devices["0000:18:00.0"]
    assert entry.link and entry.counts.get("narrow") == 0


def test_aer_pass_needs_the_kernel_to_own_aer(run_cli, tmp_path: Path) -> None:
    (on,) = _check(_run(run_cli, _scenario(tmp_path, [BOOT, VMD_AER_ON])), "pcie-aer")["results"]
    assert on["status"] == "PASS" and on["message"].startswith("no PCIe AER errors")
    # bugzilla.kernel.org #215027: firmware did not grant AER to the OS
    firmware = "acpi PNP0A08:00: _OSC: platform does not support [AER]"
    (fw,) = _check(_run(run_cli, _scenario(tmp_path, [BOOT, firmware])), "pcie-aer")["results"]
    assert fw["status"] == "SKIP" and "BMC/SEL" in fw["message"]
    (unknown,) = _check(_run(run_cli, _scenario(tmp_path, [BOOT])), "pcie-aer")["results"]
    assert unknown["status"] == "SKIP" and "does not show the kernel enabling AER" in unknown["message"]


def test_requester_ids_decode_to_addresses() -> None:
    assert aers._requester("0000:00:02.0", "0010") == "0000:00:02.0"
    assert aers._requester("10000:e0:06.0", "e100") == "10000:e1:00.0"


# --- a root port's uncorrectable line with no source after "received" -----------------------
# A V100 incident report (a fastllm development note, section "GPU 掉卡") quotes the root port's
# line without "from <address>"; the recovery lines after it are in the form rwth-i6/returnn#1500
# shows ("nvidia ...: AER: can't recover (no error_detected callback)", "pcieport ...: AER: device
# recovery failed"); the AER-enabled line is the form of VMD_AER_ON above, on this port.
NO_SOURCE_AER = [
    "[    1.486704] pcieport 0000:00:02.0: AER: enabled with IRQ 146",
    "[ 9031.002111] pcieport 0000:00:02.0: AER: Multiple Uncorrectable (Non-Fatal) error message "
    "received",
    "[ 9031.002955] nvidia 0000:05:00.0: AER: can't recover (no error_detected callback)",
    "[ 9031.002963] pcieport 0000:00:02.0: AER: device recovery failed"]


def test_an_uncorrectable_line_without_a_source_fails_the_gpu_below_the_port(
        run_cli, tmp_path: Path) -> None:
    """Before, the line did not match (the pattern needed a source address), so with AER enabled
    the check passed with "no PCIe AER errors" although recovery failed below the port."""
    # the healthy node's NVSwitches moved off 0000:05:00.0, the report's GPU
    scenario = _scenario(tmp_path, NO_SOURCE_AER, gpus={0: "0000:05:00.0"},
                         nvswitches=["0000:e0:00.0"])
    (result,) = _check(_run(run_cli, scenario), "pcie-aer")["results"]
    assert result["status"] == "FAIL" and result["device"]["pci"] == "0000:05:00.0"
    assert result["details"]["role"] == "upstream" and result["details"]["device"] == "0000:00:02.0"
    assert result["details"]["recovery_failed"] is True
    assert result["message"].endswith("1 nonfatal, device recovery failed")


def test_an_uncorrectable_line_without_a_source_and_no_gpu_below_warns(run_cli,
                                                                       tmp_path: Path) -> None:
    scenario = _scenario(tmp_path, NO_SOURCE_AER[:2])
    (result,) = _check(_run(run_cli, scenario), "pcie-aer")["results"]
    assert result["status"] == "WARN" and result["details"]["device"] == "0000:00:02.0"
