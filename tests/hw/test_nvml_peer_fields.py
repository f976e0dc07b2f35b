"""The NVML reads behind gpu-occupied and gpu-firmware, through the real pynvml over the fake
C library: compute processes (the _v3 entry point, _v2 on an older driver), names NVML cannot
give, memory in use, and firmware versions."""

from __future__ import annotations

from typing import Any

import pynvml as nvml_codes
from fakenvml import FakeGpu, FakeNvmlLibrary

from checks.hw import nvml
from checks.hw.linux import LinuxBackend
from checks.node.context import Context, Options
from checks.node.suite import occupancy
from checks.profiles import load as load_profile


def test_processes_fall_back_to_v2_on_a_driver_without_v3(fake_nvml: Any) -> None:
    lib = fake_nvml(FakeNvmlLibrary([FakeGpu(processes=[(31794, 5_627_707_392)])],
                                    missing=("nvmlDeviceGetComputeRunningProcesses_v3",),
                                    process_names={31794: "python"}))
    gpu = nvml.open_nvml().gpu(0)
    assert gpu.query("compute_processes") == [
        {"pid": 31794, "name": "python", "used_memory_bytes": 5_627_707_392}]
    assert lib.calls_to("nvmlDeviceGetComputeRunningProcesses_v2")
    assert not lib.calls_to("nvmlDeviceGetComputeRunningProcesses_v3")


def test_no_process_is_an_empty_list(fake_nvml: Any) -> None:
    fake_nvml(FakeNvmlLibrary([FakeGpu()]))
    assert nvml.open_nvml().gpu(0).query("compute_processes") == []


def test_the_check_over_the_real_layer_names_the_process_and_excludes_its_own(
        fake_nvml: Any, monkeypatch: Any) -> None:
    """gpu-occupied through LinuxBackend -> nvml.py -> pynvml: another process fails the GPU,
    this tool's own PID (a CUDA context torch may have made) does not."""
    monkeypatch.setattr(LinuxBackend, "own_pids", lambda self: {4242})
    monkeypatch.setattr(LinuxBackend, "container", lambda self: None)
    fake_nvml(FakeNvmlLibrary(
        [FakeGpu(processes=[(4242, 600 << 20)], memory_used=700 << 20),
         FakeGpu(bus_id="00000000:19:00.0", processes=[(4242, 600 << 20), (13386, 1205 << 20)],
                 memory_used=1900 << 20)],
        process_names={4242: "python3", 13386: "/xx/xxx/caffe"}))
    ctx = Context(LinuxBackend(), load_profile("generic"), Options(level="quick"))
    results = list(occupancy.gpu_occupied(ctx))
    assert [str(r.status) for r in results] == ["PASS", "FAIL"]
    assert "pid 13386 (/xx/xxx/caffe, 1205 MiB)" in results[1].message
    assert "4242" not in results[1].message


def test_memory_used_and_firmware_versions(fake_nvml: Any) -> None:
    fake_nvml(FakeNvmlLibrary([FakeGpu(memory_used=10_644_094_976, vbios="96.00.74.00.1C",
                                       inforom_image="G520.0202.00.05")]))
    gpu = nvml.open_nvml().gpu(0)
    assert gpu.query("memory_used_bytes") == 10_644_094_976
    assert (gpu.query("vbios_version"), gpu.query("inforom_image_version")) == \
        ("96.00.74.00.1C", "G520.0202.00.05")


def test_mig_parent_without_privileges_skips_instead_of_error(fake_nvml: Any, monkeypatch: Any
                                                              ) -> None:
    """A MIG-enabled GPU read without root: NVML refuses the parent handle's aggregate memory
    as well as its process list (nvmlDeviceGetMemoryInfo_v2: "In MIG mode, if device handle is
    provided, the API returns aggregate information, only if the caller has appropriate
    privileges", cuda-python's NVML reference). gpu-occupied SKIPs it as not judgeable; reading
    the memory before the NO_PERMISSION guard made it an ERROR ("could not measure")."""
    monkeypatch.setattr(LinuxBackend, "container", lambda self: None)
    refused = {"nvmlDeviceGetMemoryInfo_v2": nvml_codes.NVML_ERROR_NO_PERMISSION,
               "nvmlDeviceGetComputeRunningProcesses_v3": nvml_codes.NVML_ERROR_NO_PERMISSION}
    fake_nvml(FakeNvmlLibrary([FakeGpu(mig=(1, 1), errors=dict(refused)),
                               FakeGpu(bus_id="00000000:19:00.0")]))
    ctx = Context(LinuxBackend(), load_profile("generic"), Options(level="quick"))
    results = list(occupancy.gpu_occupied(ctx))
    assert [str(r.status) for r in results] == ["SKIP", "PASS"]
    assert "privileges" in results[0].message


def test_a_mig_uuid_names_its_gpu(fake_nvml: Any) -> None:
    """CUDA_VISIBLE_DEVICES=MIG-...: the launch's GPU is the one holding the instance
    (nvmlDeviceGetHandleByUUID -> nvmlDeviceGetDeviceHandleFromMigDeviceHandle -> index)."""
    from checks.hw.visible import launch_gpus

    mig = "MIG-feee0c61-26ec-5616-bb59-b6d777cc4f34"
    fake_nvml(FakeNvmlLibrary([FakeGpu(), FakeGpu(bus_id="00000000:19:00.0", mig=(1, 1),
                                                  uuid="GPU-00000000-0000-0000-0000-000000000001",
                                                  mig_instances=(mig,))]))
    real = nvml.open_nvml()
    assert real.mig_parent(mig) == 1
    assert real.mig_parent("MIG-00000000-dead-beef-0000-000000000000") is None
    assert launch_gpus(real, mig) == (1,)
    assert launch_gpus(real, "GPU-00000000-0000-0000-0000-000000000001,0") == (1, 0)
