"""The quick-level suite through checks.node.node_cli.main, reading the GPUs through the real
checks/hw/nvml.py and pynvml over the fake C library, and the PCI bus from a fake sysfs tree.

The rest of the host (driver module, torch, services, kernel log) is answered by the backend
below as a healthy GPU node would, so each verdict here follows from what NVML answered."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import fakesys
import pynvml as n
import pytest
from fakenvml import FakeFabric, FakeGpu, FakeNvmlLibrary

from checks.hw.base import TorchInfo
from checks.hw.linux import LinuxBackend
from checks.node import node_cli as cli
from checks.node import registry

DRIVER = "580.65.06"
ADDRESSES = ("0000:18:00.0", "0000:2a:00.0")
# The quick checks that give one result per GPU (@check scope="gpu"), and what each says for a
# healthy fake H100: SKIP where it reads a field FakeGpu's defaults leave NOT_SUPPORTED (no
# retired pages on Hopper, a driver before the recovery-action field), else PASS.
UNANSWERED = {"retired_pages_sbe", "retired_pages_dbe", "retired_pages_pending", "recovery_action"}
GPU_CHECKS = {c.id: "SKIP" if UNANSWERED & set(c.nvml) else "PASS"
              for c in registry.select("quick") if c.scope == "gpu"}


class FakeNodeBackend(LinuxBackend):
    """LinuxBackend (so nvml() is the real RealNvml) on a fake PCI tree; host facts healthy."""

    def __init__(self, sys_pci: Path, gpus: int) -> None:
        super().__init__(sys_pci=sys_pci)
        self._gpus = gpus

    def proc_driver_version(self) -> str | None:
        return f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {DRIVER}  Release Build"

    def loaded_modules(self) -> set[str]:
        return {"nvidia", "nvidia_uvm", "nvidia_modeset"}

    def module_signer(self, module: str) -> str | None:
        return None

    def kernel_log(self) -> list[str]:
        return []

    def service_state(self, unit: str) -> str:
        return "active"

    def torch(self) -> TorchInfo:
        return TorchInfo(version="2.13.0", cuda="12.8", cuda_available=True,
                         device_count=self._gpus, arch_list=["sm_80", "sm_90"], nccl="2.27.3",
                         capabilities=[(9, 0)] * self._gpus,
                         device_names=["NVIDIA H100 80GB HBM3"] * self._gpus)

    def environ(self) -> Mapping[str, str]:
        return {}


def h100(index: int, **overrides: Any) -> FakeGpu:
    values: dict[str, Any] = dict(bus_id=f"0000{ADDRESSES[index].upper()}",
                                  uuid=f"GPU-{index:08x}-0000-4000-8000-000000000000",
                                  minor_number=index, fabric=FakeFabric())
    return FakeGpu(**{**values, **overrides})


@pytest.fixture
def quick_run(fake_nvml: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
              capsys: pytest.CaptureFixture[str]):
    """quick_run(library) -> (exit code, {check id: [(status, pci, message)]}, library)."""

    runs = [0]

    def run(library: FakeNvmlLibrary) -> tuple[int, dict[str, list[tuple[str, str | None, str]]], Any]:
        runs[0] += 1
        sys_pci = tmp_path / f"sys-pci-{runs[0]}"
        for address in ADDRESSES:
            fakesys.gpu(sys_pci, address, 0x2330)
        fake_nvml(library)
        monkeypatch.setattr(cli, "make_backend",
                            lambda simulate: FakeNodeBackend(sys_pci, len(ADDRESSES)))
        out = tmp_path / f"report-{runs[0]}.json"
        code = cli.main(["--level", "quick", "--json", str(out), "--quiet"])
        err = capsys.readouterr().err
        assert "Traceback" not in err
        report = json.loads(out.read_text())
        verdicts = {c["id"]: [(r["status"], (r.get("device") or {}).get("pci"), r["message"])
                              for r in c["results"]] for c in report["checks"]}
        return code, verdicts, library

    return run


def statuses(verdicts: dict[str, list[tuple[str, str | None, str]]], check_id: str
             ) -> dict[str | None, str]:
    return {pci: status for status, pci, _ in verdicts[check_id]}


def test_healthy_gpus_pass(quick_run: Any) -> None:
    _code, verdicts, _ = quick_run(FakeNvmlLibrary([h100(0), h100(1)], driver=DRIVER))
    for check_id in ("driver-loaded", "gpu-count", "driver-version", "cuda-compat"):
        assert [v[0] for v in verdicts[check_id]] == ["PASS"], (check_id, verdicts[check_id])
    for check_id, healthy in GPU_CHECKS.items():
        assert statuses(verdicts, check_id) == dict.fromkeys(ADDRESSES, healthy), \
            (check_id, verdicts[check_id])


def test_gpu_lost_at_handle_lookup_fails_that_gpu_only(quick_run: Any) -> None:
    code, verdicts, _ = quick_run(FakeNvmlLibrary([h100(0), h100(1, lost=True)], driver=DRIVER))
    assert code == 1
    for check_id, healthy in GPU_CHECKS.items():
        # gpu-count fails the lost GPU by name; the per-GPU checks could not measure it.
        assert statuses(verdicts, check_id) == {ADDRESSES[0]: healthy, ADDRESSES[1]: "ERROR"}, \
            (check_id, verdicts[check_id])
    lost = [m for s, pci, m in verdicts["persistence-mode"] if pci == ADDRESSES[1]]
    assert "GPU_IS_LOST" in lost[0]
    named = [(s, pci) for s, pci, m in verdicts["gpu-count"] if s == "FAIL"]
    assert ("FAIL", ADDRESSES[1]) in named


def test_nvlink_unknown_error_at_link_3_is_that_gpus_error(quick_run: Any) -> None:
    broken = h100(1, errors={"nvmlDeviceGetNvLinkState:3": n.NVML_ERROR_UNKNOWN})
    code, verdicts, _ = quick_run(FakeNvmlLibrary([h100(0), broken], driver=DRIVER))
    assert code == 1
    assert statuses(verdicts, "nvlink") == {ADDRESSES[0]: "PASS", ADDRESSES[1]: "ERROR"}
    message = next(m for s, pci, m in verdicts["nvlink"] if pci == ADDRESSES[1])
    assert "link 3" in message and "Unknown Error" in message


def test_nvlink_unknown_error_on_every_gpu_profile_without_link_count(
        quick_run: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the profile gives no link count ("every link NVML lists"), stopping at the error
    would have listed 3 healthy links and passed."""
    from checks import profiles

    def generic(ids: list[int], names: list[str]) -> profiles.Profile:
        return profiles.load("generic")

    monkeypatch.setattr(profiles, "detect", generic)
    errors = {"nvmlDeviceGetNvLinkState:3": n.NVML_ERROR_UNKNOWN}
    _, verdicts, _ = quick_run(FakeNvmlLibrary([h100(0, errors=errors), h100(1, errors=errors)],
                                               driver=DRIVER))
    assert statuses(verdicts, "nvlink") == dict.fromkeys(ADDRESSES, "ERROR")


def test_old_driver_without_fabric_info_v(quick_run: Any) -> None:
    """A driver older than the bindings: nvmlDeviceGetGpuFabricInfoV and the clock "event"
    reasons symbol are missing; the suite reads the older functions and gives the same verdicts
    as on a current driver."""
    missing = ("nvmlDeviceGetGpuFabricInfoV", "nvmlDeviceGetCurrentClocksEventReasons")
    _, healthy, _ = quick_run(FakeNvmlLibrary([h100(0), h100(1)], driver=DRIVER))
    _, old, library = quick_run(FakeNvmlLibrary([h100(0), h100(1)], driver=DRIVER,
                                                missing=missing))
    assert {k: [v[0] for v in r] for k, r in old.items()} == \
        {k: [v[0] for v in r] for k, r in healthy.items()}
    assert statuses(old, "clock-throttle") == dict.fromkeys(ADDRESSES, "PASS")
    assert library.calls_to("nvmlDeviceGetCurrentClocksThrottleReasons")
    from checks.hw import nvml

    info = nvml.open_nvml().gpu(0).query("fabric_info")
    assert info["state"] == "completed" and library.calls_to("nvmlDeviceGetGpuFabricInfo")


def test_driver_not_loaded_fails_driver_loaded(quick_run: Any) -> None:
    code, verdicts, _ = quick_run(FakeNvmlLibrary([], init_error=n.NVML_ERROR_DRIVER_NOT_LOADED))
    assert code == 1
    (status, _, message), = verdicts["driver-loaded"]
    assert status == "FAIL" and "the NVIDIA kernel driver is not loaded" in message
    assert {v[0] for v in verdicts["nvlink"]} == {"SKIP"}  # blocked by driver-loaded
