"""The same kernel events, printed the way each tool and kernel prints them, get the same
verdicts: dmesg, dmesg -T, dmesg -H, caller ids ([  T511]), dmesg --decode --time-format iso,
journalctl short (syslog `kernel:` prefix), short-monotonic, short-iso, short-iso-precise, and
Talos. The message texts are real lines: XID 79 from wilicc/gpu-burn#1; the 6.8+ AER wording from
minisforum-docs/MS-02-Ultra#10 and qualcomm-linux/kernel#323 on the addresses of the report
issue that motivated this (0000:63:00.0); SXid 12028 as leptonai/gpud's SXid tests quote it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from checks import profiles
from checks.hw.fixture import FixtureBackend, load_scenario
from checks.node import registry, runner
from checks.node.context import Context, Options

CHECKS = ("xid-events", "nvswitch-sxid", "pcie-aer")
EVENTS = [
    "pcieport 0000:60:01.0: AER: enabled with IRQ 120",
    "NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus.",
    "pcieport 0000:60:01.0: AER: Uncorrectable (Fatal) error message received from 0000:63:00.0",
    "nvidia 0000:63:00.0: PCIe Bus Error: severity=Uncorrectable (Fatal), type=Transaction Layer, "
    "(Requester ID)",
    "nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV "
    "error (First)",
]
PREFIXES = {
    "dmesg": "[ 1843.308145] ",
    "dmesg -T": "[Mon Aug  5 03:54:13 2024] ",
    "dmesg -H": "[  +0.000844] ",
    "caller id": "[   24.220626][  T511] ",
    "dmesg --decode iso": "kern  :err   : 2025-01-25T10:34:54,859532+00:00 ",
    "journalctl short": "Sep 19 16:18:02 bubz kernel: ",
    "journalctl short-monotonic": "[ 1843.308145] bubz kernel: ",
    "journalctl short-iso": "2024-09-19T16:18:02+0000 bubz kernel: ",
    "journalctl short-iso-precise": "2024-09-19T16:18:02.615790+00:00 bubz kernel: ",
    "talos": "192.168.11.119: kern: warning: [2026-04-22T21:25:20.505406921Z]: ",
    "no prefix": "",
}
EXPECTED = {"xid-events": {"0000:02:00.0": "FAIL"}, "pcie-aer": {"0000:63:00.0": "FAIL"},
            "nvswitch-sxid": {"0000:05:00.0": "FAIL"}}


def verdicts(tmp_path: Path, log: list[str] | dict) -> dict[str, dict[str, str]]:
    """Per check, device address -> status, on the healthy H100 node with GPU 0 at 0000:02:00.0,
    GPU 1 at 0000:63:00.0 and one NVSwitch at 0000:05:00.0."""
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump({
        "description": "test: kernel-log formats", "extends": "h100-sxm-8x-healthy",
        "host": {"kernel_log": log}, "nvswitches": ["0000:05:00.0"],
        "gpu_overrides": {0: {"pci_bus_id": "0000:02:00.0"}, 1: {"pci_bus_id": "0000:63:00.0"},
                          2: {"pci_bus_id": "0000:b3:00.0"}}}))
    hw = FixtureBackend(load_scenario(str(path)))
    outcomes = runner.run(registry.select("quick", ["pci-gpus", *CHECKS]),
                          Context(hw, profiles.load("generic"), Options()))
    return {o.id: {r.device.pci: r.status.value for r in o.results if r.device}
            for o in outcomes if o.id in CHECKS}


@pytest.mark.parametrize("prefix", PREFIXES.values(), ids=PREFIXES.keys())
def test_every_tool_format_gives_the_same_verdicts(tmp_path: Path, prefix: str) -> None:
    assert verdicts(tmp_path, [prefix + line for line in EVENTS]) == EXPECTED


def test_the_6_8_wording_without_message_and_with_the_old_one_agree(tmp_path: Path) -> None:
    """`AER: Uncorrectable (Non-Fatal) error received from <addr>` (the form the issue quotes)
    and the pre-6.8 `Uncorrected (Non-Fatal) error received: <addr>` both fail a GPU."""
    new = ["pcieport 0000:60:01.0: AER: Uncorrectable (Non-Fatal) error received from 0000:63:00.0"]
    old = ["pcieport 0000:60:01.0: AER: Uncorrected (Non-Fatal) error received: 0000:63:00.0"]
    assert verdicts(tmp_path, new)["pcie-aer"] == {"0000:63:00.0": "FAIL"}
    assert verdicts(tmp_path, old)["pcie-aer"] == {"0000:63:00.0": "FAIL"}


def test_an_uncorrectable_error_is_not_hidden_by_aer_enabled(tmp_path: Path) -> None:
    """With `AER: enabled` in the log and only the 6.8 wording, the check used to PASS
    "no PCIe AER errors"."""
    lines = [EVENTS[0], EVENTS[3]]
    assert verdicts(tmp_path, lines)["pcie-aer"] == {"0000:63:00.0": "FAIL"}
