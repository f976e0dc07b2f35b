"""One event set, read through each of the three sources (journalctl -k, dmesg, /dev/kmsg) as
that source prints it, gives the same verdicts. The events are real driver and kernel lines:
the probe-time loss as one multi-line record (NVIDIA/NVSentinel#155), the single-line loss
(NVIDIA/nvidia-docker#1553's form, on the address the issue quotes), XID 79 (wilicc/gpu-burn#1),
a contained XID 94 (NVIDIA's GPU Memory Error Management guide), the 6.8+ AER wording
(minisforum-docs/MS-02-Ultra#10) and SXid 12028 (as leptonai/gpud's tests quote it)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from checks import profiles
from checks.hw import kernel_log as kernlog
from checks.hw.fixture import FixtureBackend, load_scenario
from checks.node import registry, runner
from checks.node.context import Context, Options

CHECKS = ("xid-events", "nvswitch-sxid", "pcie-aer")
# (priority, microseconds since boot, the record's lines): a record with several lines is one
# printk call with newlines in it.
RECORDS: list[tuple[int, int, list[str]]] = [
    (6, 1_234_567, ["pcieport 0000:60:01.0: AER: enabled with IRQ 120"]),
    (3, 1_843_308_145, ["NVRM: The NVIDIA GPU 0000:b3:00.0",
                        "NVRM: (PCI ID: 10de:26b5) installed in this system has",
                        "NVRM: fallen off the bus and is not responding to commands."]),
    (3, 1_843_439_662, ["NVRM: The NVIDIA probe routine failed for 1 device(s)."]),
    (4, 74_889_644_138, ["NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus."]),
    (4, 75_001_000_000, ["NVRM: GPU 0000:29:00.0: GPU has fallen off the bus."]),
    (4, 76_000_000_000, ["NVRM: Xid (PCI:0000:01:00): 94, pid=7062, Contained: CE User Channel "
                         "(0x9). RST: No, D-RST: No"]),
    (3, 77_000_000_000, ["pcieport 0000:60:01.0: AER: Uncorrectable (Fatal) error message "
                         "received from 0000:63:00.0"]),
    (3, 77_000_000_100, ["nvidia 0000:63:00.0: PCIe Bus Error: severity=Uncorrectable (Fatal), "
                         "type=Transaction Layer, (Requester ID)"]),
    (3, 78_000_000_000, ["nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 "
                         "egress non-posted PRIV error (First)"]),
]
EXPECTED = {
    "xid-events": {"0000:b3:00.0": "FAIL", "0000:29:00.0": "FAIL", "0000:02:00.0": "FAIL",
                   "0000:01:00.0": "WARN"},
    "pcie-aer": {"0000:63:00.0": "FAIL"},
    "nvswitch-sxid": {"0000:05:00.0": "FAIL"},
}


def _stamp(usec: int) -> str:
    return f"[{usec // 1_000_000:5d}.{usec % 1_000_000:06d}]"


def as_dmesg() -> str:
    """util-linux dmesg: the first line after the time, the others indented below it."""
    out = []
    for _, usec, lines in RECORDS:
        stamp = _stamp(usec)
        out.append(f"{stamp} {lines[0]}")
        out.extend(" " * (len(stamp) + 1) + line for line in lines[1:])
    return "\n".join(out) + "\n"


def as_journal() -> str:
    """journalctl -k -b -o short-monotonic: host and `kernel:` after the time; the lines of a
    multi-line message indented to where the message starts."""
    out = ["-- Logs begin at Mon 2024-09-30 10:00:00 UTC, end at Mon 2024-09-30 11:00:00 UTC. --"]
    for _, usec, lines in RECORDS:
        head = f"{_stamp(usec)} gpu-node-17 kernel: "
        out.append(head + lines[0])
        out.extend(" " * len(head) + line for line in lines[1:])
    return "\n".join(out) + "\n"


def _escape(text: str) -> str:
    return "".join(c if 0x20 <= ord(c) < 0x7F and c != "\\" else f"\\x{ord(c):02x}" for c in text)


def as_kmsg() -> str:
    """/dev/kmsg: one `prio,seq,usec,flags;text` per record, newlines inside a record escaped
    as \\x0a, dictionary lines after some records, and a user-space record (facility 1) that
    only /dev/kmsg shows and that must not count."""
    out = []
    for seq, (prio, usec, lines) in enumerate(RECORDS, start=1000):
        out.append(f"{prio},{seq},{usec},-;{_escape(chr(10).join(lines))}")
        if "nvidia 0000:63:00.0" in lines[0]:
            out += [" SUBSYSTEM=pci", " DEVICE=+pci:0000:63:00.0"]
    out.append("12,2000,79000000000,-;NVRM: Xid (PCI:0000:48:00): 79, written by a user process")
    return "\n".join(out) + "\n"


def verdicts(tmp_path: Path, log: list[str] | dict) -> dict[str, dict[str, str]]:
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump({
        "description": "test: one event set through each kernel-log source",
        "extends": "h100-sxm-8x-healthy", "host": {"kernel_log": log},
        "nvswitches": ["0000:05:00.0"],
        "gpu_overrides": {0: {"pci_bus_id": "0000:02:00.0"}, 1: {"pci_bus_id": "0000:63:00.0"},
                          2: {"pci_bus_id": "0000:b3:00.0"}, 3: {"pci_bus_id": "0000:29:00.0"},
                          4: {"pci_bus_id": "0000:01:00.0"}, 5: {"pci_bus_id": "0000:48:00.0"}}}))
    hw = FixtureBackend(load_scenario(str(path)))
    outcomes = runner.run(registry.select("quick", ["pci-gpus", *CHECKS]),
                          Context(hw, profiles.load("generic"), Options()))
    return {o.id: {r.device.pci: r.status.value for r in o.results if r.device}
            for o in outcomes if o.id in CHECKS}


@pytest.mark.parametrize("source,text", [("journalctl", as_journal()), ("dmesg", as_dmesg()),
                                         ("kmsg", as_kmsg())])
def test_each_source_gives_the_verdicts(tmp_path: Path, source: str, text: str) -> None:
    assert verdicts(tmp_path, {source: text}) == EXPECTED


def test_the_three_sources_agree(tmp_path: Path) -> None:
    seen = {source: verdicts(tmp_path, {source: text}) for source, text in
            (("journalctl", as_journal()), ("dmesg", as_dmesg()), ("kmsg", as_kmsg()))}
    assert seen["journalctl"] == seen["dmesg"] == seen["kmsg"]


def test_the_live_kmsg_reader_decodes_the_multi_line_record(tmp_path: Path) -> None:
    """Through read_kernel_log (no journalctl, no dmesg on PATH), as on a host that only has
    /dev/kmsg: the probe record comes back as three lines with the record's time."""
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(as_kmsg())
    log = kernlog.read_kernel_log(journalctl="absent-journalctl", dmesg="absent-dmesg", kmsg=kmsg)
    assert log.source == str(kmsg)
    assert log[1:4] == ["[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0",
                        "[ 1843.308145] NVRM: (PCI ID: 10de:26b5) installed in this system has",
                        "[ 1843.308145] NVRM: fallen off the bus and is not responding to commands."]
    assert not any("user process" in line or "SUBSYSTEM" in line for line in log)
    assert verdicts(tmp_path, list(log)) == EXPECTED


def test_kmsg_escapes_continuations_and_dictionary_lines() -> None:
    """The kernel's escapes come back as bytes (UTF-8 decoded), a newline splits the record, other
    control characters stay escaped; a `c` record continued by `+` fragments (older kernels) is
    one line; lines starting with a space are the dictionary; a malformed header is skipped."""
    text = ("6,1,1000000,-;caf\\xc3\\xa9 \\x5c path\\x09tab\\x1b[31m\n"
            " SUBSYSTEM=pci\n"
            "4,2,2000000,c;NVRM: Xid (PCI:0000:02:00): 79, \n"
            "4,3,2000001,+;GPU has fallen off the bus.\n"
            "4,x,3000000,-;not a record\n"
            "no header at all\n")
    assert kernlog.parse_kmsg(text) == [
        "[    1.000000] café \\ path\ttab\\x1b[31m",
        "[    2.000000] NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus."]
