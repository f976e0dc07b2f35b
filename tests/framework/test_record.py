"""`python -m checks record`: a recording, simulated again, gives the verdict of what was recorded.

Three round trips: this machine (live quick run vs its recording), every shipped scenario read
through FixtureBackend and recorded (the hardware layer answers every question the same), and a
redacted recording (no serial, UUID or hostname left, verdict unchanged).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from checks.hw.base import (
    GPU_FIELDS,
    Backend,
    GpuHandle,
    GpuLost,
    HardwareError,
    NvmlUnavailable,
    PciDevice,
)
from checks.hw.fixture import FixtureBackend, load_scenario, shipped
from checks.node import node_cli as cli
from checks.node import record
from checks.node.record import gpu_reads as record_gpus
from checks.node.record import host_reads as record_host
from checks.node.record import recorder

# Checks whose value moves on its own between two reads of a live GPU (not a hardware fact).
VOLATILE = {"gpu-temperature", "clock-throttle"}

# Scenarios beyond the shipped ones, for states the shipped ones do not show.
EXTRA = {
    "lost-gpu": """
extends: h100-sxm-8x-healthy
description: GPU 3 answers GPU_IS_LOST at handle lookup
gpu_overrides: {3: {lost: true}}
""",
    "kernel-log-unreadable": """
extends: cpu-only-healthy
description: kernel log, /dev/shm and the module list cannot be read
host: {kernel_log: {error: "cannot read the kernel log"}, shm_bytes: {error: "statvfs failed"},
       modules: {error: "/proc/modules unreadable"}, device_nodes: []}
""",
    "nvlink-errors-and-field-errors": """
extends: h100-sxm-8x-healthy
description: noisy and down links, failed and unsupported queries, no /dev listing
host: {device_nodes: null}
nvswitches: [{address: "0000:05:00.0", pci_device_id: 0x1af1, numa_node: 0,
              link: {speed: "8.0 GT/s PCIe", width: 4}, pci_path: ["0000:00:01.0"]}]
gpu_overrides:
  1: {nvlink: {links: 18, inactive: [4, 9], errors: {2: {replay: 900}}}}
  2: {temperature_c: {error: "Unknown Error"}, power_default_limit_w: not_supported}
  4: {nvlink: [{link: 0, active: true, errors: {replay: 3}}]}
""",
    "cuda-visible-devices": """
extends: h100-sxm-8x-healthy
description: CUDA_VISIBLE_DEVICES set, torch sees 2 of 8
host: {env: {CUDA_VISIBLE_DEVICES: "2,5", NCCL_DEBUG: WARN, HOME: /root}}
torch: {device_count: 2}
""",
}


def _scenario_path(name: str, tmp_path: Path) -> str:
    if name in EXTRA:
        path = tmp_path / f"{name}.yaml"
        path.write_text(EXTRA[name])
        return str(path)
    return name


def _call(fn: Callable[[], Any]) -> Any:
    try:
        return ("ok", fn())
    except HardwareError as exc:
        return ("raises", type(exc).__name__)


HOST_METHODS = ("pci_devices", "proc_driver_version", "loaded_modules", "os_release",
                "kernel_release", "secure_boot", "shm", "memlock_limit", "cpu_count", "numa_nodes",
                "torch", "virtualization", "container", "gpu_device_nodes",
                "fabric_manager_version")


def view(hw: Backend) -> dict[str, Any]:
    """Every answer the checks can get from a backend (kernel log and environment as recorded)."""
    seen: dict[str, Any] = {name: _call(getattr(hw, name)) for name in HOST_METHODS}
    seen["module_signer"] = _call(lambda: hw.module_signer("nvidia"))
    seen["services"] = {u: _call(lambda u=u: hw.service_state(u)) for u in record_host.SERVICES}
    seen["kernel_log"] = _call(lambda: [ln for ln in hw.kernel_log()
                                        if record_host.kernel_log_wanted(ln)])
    seen["environ"] = record_host.environment(hw.environ())
    try:
        nvml = hw.nvml()
    except NvmlUnavailable as exc:
        seen["nvml"] = ("unavailable", exc.kind)
        return seen
    seen["nvml"] = ("ok", _call(nvml.driver_version), _call(nvml.cuda_driver_version),
                    nvml.device_count())
    for index in range(nvml.device_count()):
        try:
            gpu = nvml.gpu(index)
        except GpuLost:
            seen[f"gpu{index}"] = "lost"
            continue
        seen[f"gpu{index}"] = {f: _call(functools.partial(gpu.query, f)) for f in GPU_FIELDS}
    return seen


def quick(scenario: str | None, tmp_path: Path, *extra: str) -> dict[str, Any]:
    out = tmp_path / "report.json"
    out.unlink(missing_ok=True)
    argv = ["--level", "quick", "--json", str(out), "--quiet", *extra]
    cli.main([*argv, "--simulate", scenario] if scenario else argv)
    return json.loads(out.read_text())


def verdict(report: dict[str, Any], identity: bool = True) -> dict[str, Any]:
    """Status per check id, and each result's value and device (hardware facts). Without
    `identity`, a device is its index and PCI address (no serial or UUID)."""

    def device(d: dict[str, Any] | None) -> Any:
        return d if identity or d is None else (d["index"], d["pci"])

    return {c["id"]: (c["status"], [(r["status"], device(r["device"]),
                                     None if c["id"] in VOLATILE else r["value"])
                                    for r in c["results"]])
            for c in report["checks"]}


def write_recording(hw: Backend, path: Path, **kw: Any) -> recorder.Recording:
    rec = record.record(hw, host=kw.pop("host", "node-a"), **kw)
    path.write_text(record.render(rec, path.suffix))
    return rec


# -- round trips ----------------------------------------------------------------------------------
def test_recording_of_this_machine_gives_the_live_verdict(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]
                                                           ) -> None:
    path = tmp_path / "this-host.yaml"
    assert record.main([str(path)]) == 0, capsys.readouterr().err
    assert "recorded" in capsys.readouterr().err
    live = quick(None, tmp_path)
    simulated = quick(str(path), tmp_path)
    assert verdict(simulated) == verdict(live)
    assert simulated["system"] == live["system"]
    assert simulated["environment"] == live["environment"]
    assert simulated["backend"] == "fixture" and live["backend"] == "linux"
    data = yaml.safe_load(path.read_text())
    assert data["description"].startswith("Recording of ")
    assert "nodecert" in data["description"] and "record" in data["description"]


@pytest.mark.parametrize("name", [*shipped(), *EXTRA])
def test_recorded_scenario_answers_every_question_the_same(name: str, tmp_path: Path) -> None:
    source = _scenario_path(name, tmp_path)
    original = FixtureBackend.from_file(source)
    path = tmp_path / "recorded.yaml"
    rec = write_recording(original, path)
    assert rec.gaps == []
    assert view(FixtureBackend.from_file(str(path))) == view(original)
    assert verdict(quick(str(path), tmp_path)) == verdict(quick(source, tmp_path))


def test_lost_and_hidden_gpus_keep_their_spelling_and_place(tmp_path: Path) -> None:
    lost = FixtureBackend.from_file(_scenario_path("lost-gpu", tmp_path))
    data = record.record(lost, host="h").scenario
    assert data["gpus"][3] == {"pci_bus_id": "0000:5d:00.0", "numa_node": 0, "lost": True}
    hidden = record.record(FixtureBackend.from_file("fault-gpu-missing-from-nvml"), host="h")
    entry = hidden.scenario["gpus"][5]
    assert entry == {"pci_bus_id": "0000:ab:00.0", "numa_node": 1, "nvml_visible": False}
    assert hidden.scenario["gpu_defaults"]["pci_device_id"] == 0x2330
    assert "pci_device_id: 0x2330" in record.render(hidden, ".yaml")


def test_nvlink_is_written_short_only_when_it_expands_back_exactly() -> None:
    links = [{"link": i, "active": i != 3,
              "errors": {"replay": 7 if i == 1 else 0, "recovery": 0, "crc_flit": 0}}
             for i in range(4)]
    assert record_gpus._compact_nvlink(links) == {"links": 4, "inactive": [3],
                                                "errors": {1: {"replay": 7}}}
    partial = [{"link": 0, "active": True, "errors": {"replay": 0}}]  # counters not supported
    assert record_gpus._compact_nvlink(partial) == partial


def test_kernel_log_keeps_the_lines_that_matter_latest_last(tmp_path: Path) -> None:
    lines = [f"[{i}.0] NVRM: Xid (PCI:0000:18:00): 13, pid={i}" for i in range(1000)]
    lines[10:10] = ["[0.1] EXT4-fs (sda1): mounted", "[0.2] e1000: link up"]
    lines.append("[2000.0] mlx5_core 0000:c1:00.0: PCIe bandwidth limited by 8.0 GT/s x8 link")
    hw = FixtureBackend({"host": {"kernel_log": lines}, "gpus": []})
    rec = write_recording(hw, tmp_path / "k.yaml")
    kept = rec.scenario["host"]["kernel_log"]
    assert len(kept) == record_host.KERNEL_LOG_MAX
    assert kept[-1].startswith("[2000.0] mlx5_core") and kept[-2].endswith("pid=999")
    assert not any("EXT4" in ln or "e1000" in ln for ln in kept)
    assert rec.notes and "of 1001 matching lines" in rec.notes[0]
    assert "# note: kernel log" in (tmp_path / "k.yaml").read_text()



def test_one_megabyte_kernel_log_lines_are_read_in_linear_time(tmp_path: Path) -> None:
    """A kernel-log line can be 1 MB (a driver dumping a buffer). The line filter and every
    redaction pattern run in time linear in it: "mlx5 " a million times over took > 120 s
    with the former mlx5.*(bandwidth|PCIe) alternative (quadratic)."""
    mb = 1 << 20
    lines = ["mlx5 " * (mb // 5),                                   # no bandwidth/PCIe after it
             "[1.0] mlx5_core " + "x" * mb + " PCIe bandwidth limited",  # kept: about its link
             "[2.0] NVRM: " + "a:" * (mb // 2),                     # kept; IPv6/MAC-like runs
             "[3.0] nvidia " + "1." * (mb // 2)]                    # kept; IPv4-like runs
    hw = FixtureBackend({"host": {"kernel_log": lines}, "gpus": []})
    start = time.perf_counter()
    rec = record.record(hw, host="node-a", redact=True)
    elapsed = time.perf_counter() - start
    kept = rec.scenario["host"]["kernel_log"]
    assert [ln[:5] for ln in kept] == ["[1.0]", "[2.0]", "[3.0]"]
    assert elapsed < 20, f"recording four 1 MB kernel-log lines took {elapsed:.1f} s"


UNKNOWN_PARAMS = ('[0.05] Unknown kernel command line parameters "BOOT_IMAGE=/vmlinuz-6.8 '
                  'vault_token=s3cr3t-t0ken nvidia-drm.modeset=1 site_secret_path=/x", '
                  'will be passed to user space.')


def test_the_kernels_unknown_parameters_line_is_redacted(tmp_path: Path) -> None:
    """The kernel echoes the command line parameters it did not recognise on a line of its own:
    --redact keeps only the GPU-relevant ones there too, and every recording masks secrets."""
    hw = FixtureBackend({"host": {"kernel_log": [UNKNOWN_PARAMS]}, "gpus": []})
    plain = record.record(hw, host="node-a").scenario["host"]["kernel_log"]
    assert len(plain) == 1 and "s3cr3t-t0ken" not in plain[0] and "vault_token=<masked>" in plain[0]
    redacted = record.record(hw, host="node-a", redact=True).scenario["host"]["kernel_log"]
    assert redacted == ['[0.05] Unknown kernel command line parameters "nvidia-drm.modeset=1", '
                        'will be passed to user space. [3 parameters removed by --redact]']


# -- what the format cannot say, hung and broken reads --------------------------------------------
class Hanging(FixtureBackend):
    """NVML's temperature query on GPU 1 never returns (a hung GPU)."""

    def __init__(self, release: threading.Event) -> None:
        super().__init__(load_scenario("h100-sxm-8x-healthy"))
        self.release = release

    def nvml(self) -> Any:
        real, release = super().nvml(), self.release

        class Handle(GpuHandle):
            def __init__(self, inner: GpuHandle) -> None:
                self.index, self.inner = inner.index, inner

            def query(self, field_name: str) -> Any:
                if self.index == 1 and field_name == "temperature_c":
                    release.wait()
                if field_name == "ecc_by_location":
                    raise KeyError(field_name)  # a backend that has not implemented the field
                return self.inner.query(field_name)

        class Nvml(type(real)):  # type: ignore[misc]
            def gpu(self, index: int) -> GpuHandle:
                return Handle(real.gpu(index))

        return Nvml(real._driver, real._gpus)


def test_a_hung_nvml_call_is_bounded_and_recorded_as_an_error(tmp_path: Path) -> None:
    release = threading.Event()
    try:
        start = time.monotonic()
        rec = write_recording(Hanging(release), tmp_path / "hung.yaml", timeout_s=0.3)
        assert time.monotonic() - start < 5
    finally:
        release.set()
    gpus = rec.scenario["gpus"]
    assert gpus[1]["temperature_c"] == {"error": "no answer within 0.3 s"}
    assert "earlier NVML call hung" in gpus[1]["power_w"]["error"]
    assert "earlier NVML call hung" in gpus[7]["name"]["error"]
    assert "not implemented" in gpus[0]["ecc_by_location"]["error"]
    report = quick(str(tmp_path / "hung.yaml"), tmp_path)
    statuses = {c["id"]: c["status"] for c in report["checks"]}
    assert statuses["gpu-temperature"] == "ERROR"  # could not measure: never a PASS


class NoPciBus(FixtureBackend):
    def __init__(self) -> None:
        super().__init__(load_scenario("cpu-only-healthy"))

    def pci_devices(self) -> list[PciDevice]:
        raise HardwareError("/sys/bus/pci/devices is missing: is sysfs mounted?")


def test_a_fact_the_format_cannot_express_is_named_and_exits_1(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(record, "_backend", lambda simulate: (NoPciBus(), "node-b"))
    path = tmp_path / "gap.yaml"
    assert record.main([str(path)]) == 1
    err = capsys.readouterr().err
    assert "not expressible: pci_devices: /sys/bus/pci/devices is missing" in err
    assert "# NOT EXPRESSIBLE (left out or approximated): pci_devices" in path.read_text()


# -- redaction ------------------------------------------------------------------------------------
SECRET_UUID = "GPU-a3c91e2f-5b7d-4e10-9c2a-7f3e8d1b6a42"
CLUSTER_UUID = "9a0c2e14-7b3d-4f6a-8e21-5c4d3b2a1f00"
MIG_UUID = "MIG-5c1d3e2f-1a2b-4c3d-8e4f-0a1b2c3d4e5f"
HOST = "gpu-node-17.cluster.example"
REDACTION_SOURCE = f"""
extends: h100-sxm-8x-healthy
description: identities in every place a recording carries them
host:
  env: {{CUDA_VISIBLE_DEVICES: "GPU-a3c9,1", NVIDIA_VISIBLE_DEVICES: "{SECRET_UUID},{MIG_UUID}"}}
  kernel_log:
    - "[    6.100] gpu-node-17 kernel: NVRM: loading NVIDIA UNIX Open Kernel Module  550.90.07"
    - "[  812.400] gpu-node-17 kernel: NVRM: Xid (PCI:0000:3a:00): 13, pid=4411, name=python"
    - "[  812.401] gpu-node-17 kernel: NVRM: GPU Board Serial Number: 1650123000002"
    - "[  812.402] gpu-node-17 kernel: NVRM: GPU {SECRET_UUID} MIG {MIG_UUID} on gpu-node-17.cluster.example"
gpu_defaults:
  fabric_info: {{state: completed, status: success, cluster_uuid: "{CLUSTER_UUID}", clique_id: 1}}
gpu_overrides: {{2: {{uuid: "{SECRET_UUID}"}}}}
torch: {{device_count: 2}}
"""
PLACEHOLDERS = ("00000000-0000-0000-0000-", "REDACTED-SERIAL-", recorder.REDACTED_HOST)


def _leaves(value: Any, where: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in _leaves(item, f"{where}/{key}").items()}
    if isinstance(value, list):
        return {k: v for i, item in enumerate(value) for k, v in _leaves(item, f"{where}/{i}").items()}
    return {where: value}


def test_redacted_recording_keeps_no_identity_and_the_same_verdict(tmp_path: Path) -> None:
    source_path = tmp_path / "source.yaml"
    source_path.write_text(REDACTION_SOURCE)
    source = FixtureBackend.from_file(str(source_path))
    plain, redacted = tmp_path / "plain.yaml", tmp_path / "redacted.yaml"
    write_recording(source, plain, host=HOST)
    write_recording(source, redacted, host=HOST, redact=True)
    text = redacted.read_text().lower()
    gpus = source.scenario["gpus"]
    secrets = [*(g["uuid"] for g in gpus), *(g["uuid"][4:] for g in gpus),
               *(g["serial"] for g in gpus), CLUSTER_UUID, MIG_UUID, MIG_UUID[4:], "gpu-a3c9",
               HOST, "gpu-node-17"]
    for secret in secrets:
        assert secret.lower() not in text, f"{secret} survived redaction"
    # Same verdict as the unredacted recording and as the source (CUDA_VISIBLE_DEVICES by UUID
    # prefix still picks GPU 2 and GPU 1, so gpu-count still warns that 2 of 8 are verified).
    expected = verdict(quick(str(source_path), tmp_path))
    assert expected["gpu-count"][0] == "WARN" and expected["xid-events"][0] == "WARN"
    assert verdict(quick(str(plain), tmp_path)) == expected
    assert verdict(quick(str(redacted), tmp_path), identity=False) == verdict(
        quick(str(source_path), tmp_path), identity=False)
    # Placeholders are stable, distinct and keep a UUID's shape; nothing else changed.
    data = yaml.safe_load(redacted.read_text())
    uuids = [g["uuid"] for g in data["gpus"]]
    assert len(set(uuids)) == 8
    assert all(len(u) == len(SECRET_UUID) and u.startswith("GPU-") for u in uuids)
    assert data["host"]["env"]["NVIDIA_VISIBLE_DEVICES"].startswith(uuids[2] + ",MIG-")
    assert data["host"]["env"]["CUDA_VISIBLE_DEVICES"] == f"{uuids[2]},1"
    assert uuids[2] in data["host"]["kernel_log"][3]
    assert data["gpu_defaults"]["fabric_info"]["cluster_uuid"].startswith("00000000-")
    before, after = _leaves(yaml.safe_load(plain.read_text())), _leaves(data)
    assert before.keys() == after.keys()
    changed = {k for k in before if before[k] != after[k]} - {"/description"}
    assert changed, "nothing was redacted"
    for key in changed:
        assert any(p in str(after[key]) for p in PLACEHOLDERS), f"{key} changed: {after[key]}"
    assert "redacted-host" in data["description"] and "gpu-node" not in data["description"]


# -- the command line -----------------------------------------------------------------------------
def test_existing_file_is_kept_unless_force_then_backed_up(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]
                                                           ) -> None:
    path = tmp_path / "node.yaml"
    args = [str(path), "--simulate", "cpu-only-healthy"]
    assert record.main(args) == 0
    first = path.read_text()
    path.write_text(first + "# edited by hand\n")
    capsys.readouterr()
    assert record.main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "exists; pass --force" in err and len(err.splitlines()) == 1
    assert path.read_text().endswith("# edited by hand\n")
    assert record.main([*args, "--force"]) == 0
    assert (tmp_path / "node.yaml.bak").read_text().endswith("# edited by hand\n")
    assert not path.read_text().endswith("# edited by hand\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["node.yaml", "node.yaml.bak"]


@pytest.mark.parametrize("target,extra,needle", [
    ("missing-dir/node.yaml", [], "no such directory"),
    (".", [], "must end in .yaml"),
    ("adir.yaml", [], "is a directory"),
    ("node.txt", [], "must end in .yaml, .yml, .json"),
    ("node.yaml", ["--simulate", "/nonexistent.yaml"], "no such file or shipped scenario"),
    ("node.yaml", ["--timeout", "0"], "--timeout must be positive"),
    ("node.yaml", ["--bogus"], "unrecognized arguments"),
])
def test_bad_usage_is_one_line_and_exit_2(target: str, extra: list[str], needle: str,
                                          tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "adir.yaml").mkdir()
    assert cli.main(["record", target, *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "Traceback" not in err
    assert not (tmp_path / "node.yaml").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_unwritable_directory_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    assert record.main([str(locked / "n.yaml"), "--simulate", "cpu-only-healthy"]) == 2
    assert "not writable" in capsys.readouterr().err


def test_json_recording_and_module_entry_point(tmp_path: Path) -> None:
    path = tmp_path / "node.json"
    proc = subprocess.run([sys.executable, "-m", "checks", "record", str(path), "--simulate",
                           "fault-xid-79", "--redact"], capture_output=True, text=True,
                          timeout=120, check=False,
                          env={**os.environ, "PYTHONPATH": str(Path(cli.__file__).parents[1])})
    assert proc.returncode == 0, proc.stderr
    assert "recorded 8 GPU(s), 4 NVSwitch(es), NVML ok" in proc.stderr
    data = json.loads(path.read_text())
    assert data["description"].startswith("Recording of redacted-host")
    report = quick(str(path), tmp_path)
    assert {c["id"]: c["status"] for c in report["checks"]}["xid-events"] == "FAIL"


def test_help_names_the_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["record", "--help"]) == 0
    out = capsys.readouterr().out
    for option in ("--redact", "--force", "--simulate", "--timeout", "docs/recording.md"):
        assert option in out
    assert cli.main(["--help"]) == 0
    assert "python -m checks record FILE" in capsys.readouterr().out
