"""GPU reset markers (checks/hw/kernel_log.py): the kernel-log checks set aside what a GPU
logged before its reset in this boot, and judge everything else."""

from __future__ import annotations

import json
import subprocess
import sys

from checks.hw import kernel_log
from checks.hw.fixture import FixtureBackend

PCI4 = "0000:9a:00.0"
UUID4 = "GPU-6f1b0d6a-0000-4000-8000-000000000004"
XID_LINE = "[81234.552] NVRM: Xid (PCI:0000:9a:00): 79, GPU has fallen off the bus."


def _marker(clock: float, boot: str | None = None, pci: str = PCI4) -> kernel_log.ResetMarker:
    return kernel_log.ResetMarker(boot or kernel_log.boot_id(), clock, UUID4, pci, "now")


def test_lines_of_the_reset_gpu_before_its_reset_are_set_aside() -> None:
    lines = ["[    6.002] NVRM: loading NVIDIA UNIX Open Kernel Module", XID_LINE,
             "[81300.000] NVRM: Xid (PCI:0000:9a:00): 79, GPU has fallen off the bus.",
             "[81234.000] NVRM: Xid (PCI:0000:ab:00): 46, another GPU",
             "NVRM: Xid (PCI:0000:9a:00): 79, no timestamp"]
    kept, aside = kernel_log.since_resets(lines, [_marker(81234.6)])
    assert aside == [XID_LINE]
    assert kept == [lines[0], *lines[2:]]


def test_markers_of_another_boot_or_unreadable_ones_do_not_count(tmp_path) -> None:
    kernel_log.record_reset(tmp_path, _marker(1.0, boot="an-earlier-boot"))
    kernel_log.record_reset(tmp_path, _marker(2.0))
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / kernel_log.RESETS).write_text("{not json")
    assert [m.clock_s for m in kernel_log.reset_markers(tmp_path)] == [2.0]
    assert kernel_log.reset_markers(tmp_path / "other") == []


def test_the_fixture_reset_records_the_gpu_and_reads_the_recordings_clock() -> None:
    hw = FixtureBackend.from_file("fault-xid-79")
    assert hw.reset_gpu(UUID4) == 81234.552
    assert hw.resets == [UUID4]


def test_xid_events_passes_after_the_gpu_reset_and_fails_without_the_marker(tmp_path) -> None:
    def run() -> dict:
        out = tmp_path / "r.json"
        subprocess.run([sys.executable, "-m", "checks", "--simulate", "fault-xid-79", "--only",
                        "xid-events", "--json", str(out), "-q"],
                       env={"NODECERT_STATE_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"},
                       check=False, timeout=120)
        [check] = [c for c in json.loads(out.read_text())["checks"] if c["id"] == "xid-events"]
        return check

    assert run()["status"] == "FAIL"
    kernel_log.record_reset(tmp_path, _marker(81234.552))
    check = run()
    assert check["status"] == "PASS", check
    assert check["results"][0]["details"]["lines_before_gpu_reset"] == 1  # the Xid line
