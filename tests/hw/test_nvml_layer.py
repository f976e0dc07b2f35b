"""checks/hw/nvml.py through the real pynvml over a fake C library: what each query returns,
how each NVML error is translated, and how the structs pynvml hands over are read."""

from __future__ import annotations

import time
from typing import Any

import fakenvml
import pynvml as n
import pytest
from fakenvml import HANDLE_BASE, HANG, FakeFabric, FakeGpu, FakeNvmlLibrary

from checks.hw import nvml
from checks.hw.base import (
    GPU_FIELDS,
    GpuLost,
    HardwareError,
    NoPermission,
    NotSupported,
    NvmlUnavailable,
)
from checks.hw.linux import LinuxBackend
from checks.node.context import Context, Options
from checks.profiles import load as load_profile

UNC, COR = n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_MEMORY_ERROR_TYPE_CORRECTED
VOL, AGG = n.NVML_VOLATILE_ECC, n.NVML_AGGREGATE_ECC
SRAM, DRAM = n.NVML_MEMORY_LOCATION_SRAM, n.NVML_MEMORY_LOCATION_DRAM


def open_gpu(fake_nvml: Any, gpu: FakeGpu, **library: Any) -> nvml.RealGpu:
    fake_nvml(FakeNvmlLibrary([gpu], **library))
    handle = nvml.open_nvml().gpu(0)
    assert isinstance(handle, nvml.RealGpu)
    return handle


# A GPU whose every counter differs, so a swapped argument or struct field shows.
DISTINCT = dict(
    name="NVIDIA H100 80GB HBM3", uuid="GPU-5b1c2d3e-0000-4000-8000-00000000abcd",
    bus_id="00000000:B3:00.0", serial="1654123456789", memory_total=85_520_809_984,
    recovery_action=n.NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET,
    compute_capability=(9, 0), persistence=n.NVML_FEATURE_DISABLED,
    ecc_mode=(n.NVML_FEATURE_ENABLED, n.NVML_FEATURE_DISABLED),
    ecc_total={(UNC, VOL): 1, (COR, VOL): 2, (UNC, AGG): 3, (COR, AGG): 4},
    ecc_locations={SRAM: {(UNC, VOL): 11, (COR, VOL): 12, (UNC, AGG): 13, (COR, AGG): 14},
                   DRAM: {(UNC, VOL): 21, (COR, VOL): 22, (UNC, AGG): 23, (COR, AGG): 24}},
    retired_pages={n.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS: [0x1000, 0x2000],
                   n.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR: [0x3000, 0x4000, 0x5000]},
    retired_pending=n.NVML_FEATURE_ENABLED, remapped_rows=(5, 6, 1, 0), pcie=(3, 5, 8, 16),
    pcie_replay=7, clock_reasons=0x48, temperature=41, temperature_slowdown=87,
    temperature_shutdown=92, power_mw=123_456, power_limit_mw=650_000,
    power_default_limit_mw=700_000, nvlinks=[True, False, True],
    nvlink_errors={(1, n.NVML_NVLINK_ERROR_DL_REPLAY): 31, (1, n.NVML_NVLINK_ERROR_DL_RECOVERY): 32,
                   (1, n.NVML_NVLINK_ERROR_DL_CRC_FLIT): 33},
    mig=(1, 0), sm_clock=1755, sm_clock_max=1980, utilization=64,
    compute_mode=n.NVML_COMPUTEMODE_PROHIBITED, minor_number=5,
    fabric=FakeFabric(state=n.NVML_GPU_FABRIC_STATE_COMPLETED, status=n.NVML_SUCCESS,
                      cluster_uuid=bytes.fromhex("8d3f5a7e1c2b4e6f9a0b1c2d3e4f5061"), clique_id=32766),
    memory_used=4_194_304_000, processes=[(4242, 1_073_741_824), (777, 2_097_152)],
    vbios="96.00.74.00.11", inforom_image="G520.0200.00.05",
)

EXPECTED = {
    "name": "NVIDIA H100 80GB HBM3",
    "uuid": "GPU-5b1c2d3e-0000-4000-8000-00000000abcd",
    "pci_bus_id": "0000:b3:00.0",
    "serial": "1654123456789",
    "memory_total_bytes": 85_520_809_984,
    "compute_capability": (9, 0),
    "persistence_mode": False,
    "ecc_mode": True,
    "ecc_volatile_uncorrected": 1,
    "ecc_volatile_corrected": 2,
    "ecc_aggregate_uncorrected": 3,
    "ecc_aggregate_corrected": 4,
    "retired_pages_sbe": 2,
    "retired_pages_dbe": 3,
    "retired_pages_pending": True,
    "remapped_rows": {"correctable": 5, "uncorrectable": 6, "pending": True, "failed": False},
    "pcie_gen_current": 3,
    "pcie_gen_max": 5,
    "pcie_width_current": 8,
    "pcie_width_max": 16,
    "pcie_replay_counter": 7,
    "clock_event_reasons": 0x48,
    "temperature_c": 41,
    "temperature_slowdown_c": 87,
    "temperature_shutdown_c": 92,
    "power_w": 123.456,
    "power_limit_w": 650.0,
    "power_default_limit_w": 700.0,
    "nvlink": [
        {"link": 0, "active": True, "errors": {"replay": 0, "recovery": 0, "crc_flit": 0}},
        {"link": 1, "active": False, "errors": {"replay": 31, "recovery": 32, "crc_flit": 33}},
        {"link": 2, "active": True, "errors": {"replay": 0, "recovery": 0, "crc_flit": 0}},
    ],
    "mig_mode": True,
    "sm_clock_mhz": 1755,
    "sm_clock_max_mhz": 1980,
    "utilization_gpu": 64,
    "ecc_by_location": {
        "sram": {"volatile_uncorrected": 11, "volatile_corrected": 12,
                 "aggregate_uncorrected": 13, "aggregate_corrected": 14},
        "dram": {"volatile_uncorrected": 21, "volatile_corrected": 22,
                 "aggregate_uncorrected": 23, "aggregate_corrected": 24},
    },
    "fabric_info": {"state": "completed", "status": "success",
                    "cluster_uuid": "8d3f5a7e-1c2b-4e6f-9a0b-1c2d3e4f5061", "clique_id": 32766},
    "compute_mode": "prohibited",
    "minor_number": 5,
    "memory_used_bytes": 4_194_304_000,
    # pid 777 has no name: NVML answers NOT_FOUND for it (another PID namespace)
    "compute_processes": [{"pid": 4242, "name": "python3", "used_memory_bytes": 1_073_741_824},
                          {"pid": 777, "name": None, "used_memory_bytes": 2_097_152}],
    "vbios_version": "96.00.74.00.11",
    "inforom_image_version": "G520.0200.00.05",
    "recovery_action": "drain_and_reset",
    "nvlink_p2p_peers": ["0000:c3:00.0"],
}


def test_expected_values_cover_every_gpu_field() -> None:
    assert set(EXPECTED) == set(GPU_FIELDS)


@pytest.mark.parametrize("field_name", GPU_FIELDS)
def test_every_field_reads_through_pynvml(fake_nvml: Any, field_name: str) -> None:
    # a second GPU, the NVLink peer of the first by the driver's P2P status
    fake_nvml(FakeNvmlLibrary([FakeGpu(**DISTINCT, nvlink_p2p=(1,)),
                               FakeGpu(bus_id="00000000:C3:00.0", nvlink_p2p=(0,))],
                              process_names={4242: "python3"}))
    gpu = nvml.open_nvml().gpu(0)
    assert gpu.query(field_name) == EXPECTED[field_name]


def test_system_queries(fake_nvml: Any) -> None:
    fake_nvml(FakeNvmlLibrary([FakeGpu(), FakeGpu(bus_id="00000000:19:00.0")],
                              driver="570.133.20", cuda=12080))
    handle = nvml.open_nvml()
    assert (handle.driver_version(), handle.cuda_driver_version(), handle.device_count()) == \
        ("570.133.20", 12080, 2)
    assert handle.gpu(1).query("pci_bus_id") == "0000:19:00.0"
    assert nvml.open_nvml() is handle  # initialised once


def test_unknown_field_is_a_key_error(fake_nvml: Any) -> None:
    with pytest.raises(KeyError, match="no_such_field"):
        open_gpu(fake_nvml, FakeGpu()).query("no_such_field")


# --- error translation ---------------------------------------------------------------------

@pytest.mark.parametrize("code,kind,text", [
    (n.NVML_ERROR_NOT_SUPPORTED, NotSupported, "Not Supported"),
    (n.NVML_ERROR_GPU_IS_LOST, GpuLost, "GPU is lost"),
    (n.NVML_ERROR_NO_PERMISSION, NoPermission, "Insufficient Permissions"),
    (n.NVML_ERROR_UNKNOWN, HardwareError, "Unknown Error"),
    (n.NVML_ERROR_CORRUPTED_INFOROM, HardwareError, "Corrupted infoROM"),
    (n.NVML_ERROR_INSUFFICIENT_SIZE, HardwareError, "Insufficient Size"),
    (n.NVML_ERROR_RESET_REQUIRED, HardwareError, "GPU requires restart"),
    (12345, HardwareError, "fake NVML error 12345"),  # text from nvmlErrorString
])
def test_query_errors_are_translated(fake_nvml: Any, code: int, kind: type, text: str) -> None:
    gpu = open_gpu(fake_nvml, FakeGpu(errors={"nvmlDeviceGetPersistenceMode": code}))
    with pytest.raises(HardwareError) as info:
        gpu.query("persistence_mode")
    assert type(info.value) is kind
    assert "nvmlDeviceGetPersistenceMode" in str(info.value) and text in str(info.value)
    assert nvml.nvml_code(info.value) == code


def test_missing_symbol_is_not_supported_naming_the_function(fake_nvml: Any) -> None:
    gpu = open_gpu(fake_nvml, FakeGpu(), missing=("nvmlDeviceGetMinorNumber",))
    with pytest.raises(NotSupported, match=r"nvmlDeviceGetMinorNumber: .*no such function"):
        gpu.query("minor_number")


@pytest.mark.parametrize("code,kind", [
    (n.NVML_ERROR_DRIVER_NOT_LOADED, "driver_not_loaded"),
    (n.NVML_ERROR_NO_PERMISSION, "no_permission"),
    (n.NVML_ERROR_LIB_RM_VERSION_MISMATCH, "driver_library_mismatch"),
    (n.NVML_ERROR_UNKNOWN, "init_failed"),
])
def test_init_errors_are_nvml_unavailable(fake_nvml: Any, code: int, kind: str) -> None:
    library = fake_nvml(FakeNvmlLibrary([FakeGpu()], init_error=code))
    with pytest.raises(NvmlUnavailable) as info:
        nvml.open_nvml()
    assert info.value.kind == kind
    with pytest.raises(NvmlUnavailable) as again:  # the same answer, without a second init
        nvml.open_nvml()
    assert again.value is info.value
    assert len(library.calls_to("nvmlInitWithFlags")) == 1


def test_no_library_is_library_missing(fake_nvml: Any) -> None:
    fake_nvml(None)
    with pytest.raises(NvmlUnavailable) as info:
        nvml.open_nvml()
    assert info.value.kind == "library_missing"
    assert "NVML Shared Library Not Found" in str(info.value)


def test_system_query_error(fake_nvml: Any) -> None:
    fake_nvml(FakeNvmlLibrary([FakeGpu()], system_errors={
        "nvmlSystemGetDriverVersion": n.NVML_ERROR_UNKNOWN}))
    with pytest.raises(HardwareError, match="nvmlSystemGetDriverVersion: Unknown Error"):
        nvml.open_nvml().driver_version()


# --- handle lookup -------------------------------------------------------------------------

def test_lost_gpu_at_handle_lookup_is_gpu_lost(fake_nvml: Any) -> None:
    fake_nvml(FakeNvmlLibrary([FakeGpu(), FakeGpu(lost=True)]))
    handle = nvml.open_nvml()
    assert handle.gpu(0).query("name") == "NVIDIA H100 80GB HBM3"
    with pytest.raises(GpuLost, match=r"nvmlDeviceGetHandleByIndex\(1\): GPU is lost"):
        handle.gpu(1)


def test_context_places_the_lost_gpu_at_its_sysfs_address(fake_nvml: Any, tmp_path: Any) -> None:
    import fakesys

    for address in ("0000:18:00.0", "0000:2a:00.0", "0000:3b:00.0"):
        fakesys.gpu(tmp_path, address, 0x2330)
    fake_nvml(FakeNvmlLibrary([FakeGpu(bus_id="00000000:18:00.0"), FakeGpu(lost=True),
                               FakeGpu(bus_id="00000000:3B:00.0")]))
    ctx = Context(LinuxBackend(sys_pci=tmp_path), load_profile("generic"), Options())
    gpus = ctx.gpus
    assert [(g.lost, g.device.pci) for g in gpus] == [
        (False, "0000:18:00.0"), (True, "0000:2a:00.0"), (False, "0000:3b:00.0")]
    with pytest.raises(GpuLost):
        gpus[1].handle.query("temperature_c")


# --- NVLink --------------------------------------------------------------------------------

def test_nvlink_enumeration_ends_at_invalid_argument(fake_nvml: Any) -> None:
    library = FakeNvmlLibrary([FakeGpu(nvlinks=[True] * 12)])
    fake_nvml(library)
    links = nvml.open_nvml().gpu(0).query("nvlink")
    assert [lk["link"] for lk in links] == list(range(12))
    asked = [args[1] for args in library.calls_to("nvmlDeviceGetNvLinkState")]
    assert asked == list(range(13))  # link 12 answered INVALID_ARGUMENT: the end


@pytest.mark.parametrize("code,kind", [
    (n.NVML_ERROR_UNKNOWN, HardwareError),
    (n.NVML_ERROR_NO_PERMISSION, NoPermission),
    (n.NVML_ERROR_GPU_IS_LOST, GpuLost),
    (n.NVML_ERROR_TIMEOUT, HardwareError),
])
def test_nvlink_error_mid_list_is_the_gpus_error(fake_nvml: Any, code: int, kind: type) -> None:
    gpu = open_gpu(fake_nvml, FakeGpu(errors={"nvmlDeviceGetNvLinkState:3": code}))
    with pytest.raises(HardwareError) as info:
        gpu.query("nvlink")
    assert type(info.value) is kind and not isinstance(info.value, NotSupported)
    assert "link 3" in str(info.value)


def test_nvlink_remote_end_switch_or_bridged_peer(fake_nvml: Any) -> None:
    """The far end of each active link: a switch (HGX B200, no NVSwitch on the PCI bus) or the
    bridged peer's bus id in sysfs spelling; none for an inactive link."""
    links = open_gpu(fake_nvml, FakeGpu(nvlinks=[True, False],
                                        nvlink_remote_type=n.NVML_NVLINK_DEVICE_TYPE_SWITCH)
                     ).query("nvlink")
    assert [(lk.get("remote_type"), lk.get("remote_pci")) for lk in links] == [
        ("switch", None), (None, None)]
    links = open_gpu(fake_nvml, FakeGpu(nvlinks=[True] * 2,
                                        nvlink_remote_type=n.NVML_NVLINK_DEVICE_TYPE_GPU,
                                        nvlink_remote_bus="00000000:8B:00.0")).query("nvlink")
    assert {(lk["remote_type"], lk["remote_pci"]) for lk in links} == {("gpu", "0000:8b:00.0")}


def test_nvlink_p2p_peers_from_the_drivers_p2p_status(fake_nvml: Any) -> None:
    """nvmlDeviceGetP2PStatus with the NVLink caps index names the peers by bus id (sysfs
    spelling), asked of every other GPU; a driver that answers for no pair: NotSupported."""
    gpus = [FakeGpu(bus_id="00000000:33:00.0", nvlink_p2p=(1,)),
            FakeGpu(bus_id="00000000:8B:00.0", nvlink_p2p=(0,)),
            FakeGpu(bus_id="00000000:B3:00.0", nvlink_p2p=())]
    library = fake_nvml(FakeNvmlLibrary(gpus))
    handles = [nvml.open_nvml().gpu(i) for i in range(3)]
    assert [h.query("nvlink_p2p_peers") for h in handles] == [["0000:8b:00.0"],
                                                              ["0000:33:00.0"], []]
    asked = {(a - HANDLE_BASE, b - HANDLE_BASE, idx)
             for a, b, idx, _ in library.calls_to("nvmlDeviceGetP2PStatus")}
    assert asked == {(i, j, n.NVML_P2P_CAPS_INDEX_NVLINK)
                     for i in range(3) for j in range(3) if i != j}
    with pytest.raises(NotSupported, match="no pair"):
        open_gpu(fake_nvml, FakeGpu()).query("nvlink_p2p_peers")  # one GPU: no pair to ask
    fake_nvml(FakeNvmlLibrary([FakeGpu(), FakeGpu(bus_id="00000000:8B:00.0")]))
    with pytest.raises(NotSupported):  # nvlink_p2p None: NOT_SUPPORTED for every pair
        nvml.open_nvml().gpu(0).query("nvlink_p2p_peers")


def test_recovery_action_field_not_supported_is_not_supported(fake_nvml: Any) -> None:
    # the field's own return code (the call succeeds): a driver before the field
    with pytest.raises(NotSupported, match="RECOVERY_ACTION"):
        open_gpu(fake_nvml, FakeGpu()).query("recovery_action")


@pytest.mark.parametrize("reset, drain, action", [
    (0, 0, "none"), (1, 0, "gpu_reset"), (0, 1, "drain_and_reset"), (1, 1, "drain_and_reset"),
    (1, None, "gpu_reset"), (None, 0, "none")])
def test_driver_before_recovery_action_reads_the_reset_status_fields(
        fake_nvml: Any, reset: int | None, drain: int | None, action: str) -> None:
    """A driver with NVML_FI_DEV_RESET_STATUS / DRAIN_AND_RESET_STATUS but not the recovery
    action field still says a GPU needs a reset (it SKIPped before)."""
    gpu = FakeGpu(reset_status=reset, drain_and_reset_status=drain)
    assert open_gpu(fake_nvml, gpu).query("recovery_action") == action


def test_recovery_action_field_wins_over_the_reset_status_fields(fake_nvml: Any) -> None:
    gpu = FakeGpu(recovery_action=0, reset_status=1)
    assert open_gpu(fake_nvml, gpu).query("recovery_action") == "none"


def test_memory_used_leaves_out_the_drivers_reservation(fake_nvml: Any) -> None:
    """An idle B200: the driver reserves ~700 MiB, no process allocated anything. v1's `used`
    (reserved + allocated) would read 700 MiB as someone's memory; v2's `used` is 0."""
    idle = dict(memory_total=192_265_846_784, memory_used=0, memory_reserved=700 << 20)
    assert open_gpu(fake_nvml, FakeGpu(**idle)).query("memory_used_bytes") == 0
    # a driver without v2: v1 is all there is
    assert open_gpu(fake_nvml, FakeGpu(**idle, memory_v2=False)).query(
        "memory_used_bytes") == 700 << 20


def test_no_permission_is_its_own_error(fake_nvml: Any) -> None:
    # a MIG parent handle's process list for an unprivileged caller
    gpu = open_gpu(fake_nvml, FakeGpu(errors={
        "nvmlDeviceGetComputeRunningProcesses_v3": n.NVML_ERROR_NO_PERMISSION}))
    with pytest.raises(NoPermission):
        gpu.query("compute_processes")


def test_nvlink_not_supported_device(fake_nvml: Any) -> None:
    with pytest.raises(NotSupported, match="no NVLink"):
        open_gpu(fake_nvml, FakeGpu(nvlinks=None)).query("nvlink")


def test_nvlink_invalid_argument_at_link_0_is_no_nvlink(fake_nvml: Any) -> None:
    with pytest.raises(NotSupported, match="Invalid Argument"):
        open_gpu(fake_nvml, FakeGpu(nvlinks=[])).query("nvlink")


def test_nvlink_not_supported_index_is_passed_over(fake_nvml: Any) -> None:
    gpu = open_gpu(fake_nvml, FakeGpu(nvlinks=[True] * 6,
                                      errors={"nvmlDeviceGetNvLinkState:2": n.NVML_ERROR_NOT_SUPPORTED}))
    assert [lk["link"] for lk in gpu.query("nvlink")] == [0, 1, 3, 4, 5]


def test_nvlink_counters_not_supported_keep_the_state(fake_nvml: Any) -> None:
    links = open_gpu(fake_nvml, FakeGpu(nvlinks=[True, False], nvlink_counters_supported=False)
                     ).query("nvlink")
    assert links == [{"link": 0, "active": True, "errors": {}},
                     {"link": 1, "active": False, "errors": {}}]


def test_nvlink_counter_error_is_the_gpus_error(fake_nvml: Any) -> None:
    gpu = open_gpu(fake_nvml, FakeGpu(errors={"nvmlDeviceGetNvLinkErrorCounter:4": n.NVML_ERROR_UNKNOWN}))
    with pytest.raises(HardwareError, match=r"ErrorCounter\(link 4, replay\): Unknown Error"):
        gpu.query("nvlink")


# --- retired pages (size query) ------------------------------------------------------------

def test_retired_pages_retried_when_pages_retire_between_the_two_calls(fake_nvml: Any) -> None:
    # 1st call (size): 10 pages; 2nd (buffer 25): 110 -> INSUFFICIENT_SIZE; 3rd/4th: settled.
    library = FakeNvmlLibrary([FakeGpu(retired_pages={}, retired_growth=[10, 100])])
    fake_nvml(library)
    assert nvml.open_nvml().gpu(0).query("retired_pages_sbe") == 110
    assert len(library.calls_to("nvmlDeviceGetRetiredPages")) == 4


def test_retired_pages_that_never_settle_are_an_error(fake_nvml: Any) -> None:
    gpu = open_gpu(fake_nvml, FakeGpu(retired_pages={}, retired_growth=[10 ** k for k in range(1, 8)]))
    with pytest.raises(HardwareError, match="changed during each of 3 reads") as info:
        gpu.query("retired_pages_dbe")
    assert not isinstance(info.value, NotSupported)


def test_retired_pages_none(fake_nvml: Any) -> None:
    gpu = open_gpu(fake_nvml, FakeGpu(retired_pages={}))
    assert (gpu.query("retired_pages_sbe"), gpu.query("retired_pages_pending")) == (0, False)


# --- ECC by location -----------------------------------------------------------------------

def test_ecc_location_not_supported_is_left_out(fake_nvml: Any) -> None:
    gpu = open_gpu(fake_nvml, FakeGpu(ecc_locations={DRAM: {(UNC, VOL): 0, (COR, VOL): 9,
                                                            (UNC, AGG): 0, (COR, AGG): 40}}))
    assert gpu.query("ecc_by_location") == {"dram": {
        "volatile_uncorrected": 0, "volatile_corrected": 9,
        "aggregate_uncorrected": 0, "aggregate_corrected": 40}}


def test_ecc_by_location_unsupported_counter_is_left_out(fake_nvml: Any) -> None:
    gpu = open_gpu(fake_nvml, FakeGpu(ecc_locations={SRAM: {(UNC, VOL): 2, (COR, VOL): 3}}))
    assert gpu.query("ecc_by_location") == {"sram": {"volatile_uncorrected": 2,
                                                     "volatile_corrected": 3}}


def test_ecc_by_location_nothing_is_not_supported(fake_nvml: Any) -> None:
    with pytest.raises(NotSupported, match="no ECC counts by location"):
        open_gpu(fake_nvml, FakeGpu(ecc_locations={})).query("ecc_by_location")


def test_ecc_by_location_lost_gpu(fake_nvml: Any) -> None:
    gpu = open_gpu(fake_nvml, FakeGpu(errors={"nvmlDeviceGetMemoryErrorCounter": n.NVML_ERROR_GPU_IS_LOST}))
    with pytest.raises(GpuLost):
        gpu.query("ecc_by_location")


# --- fabric --------------------------------------------------------------------------------

@pytest.mark.parametrize("state,name", [
    (n.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED, "not_supported"),
    (n.NVML_GPU_FABRIC_STATE_NOT_STARTED, "not_started"),
    (n.NVML_GPU_FABRIC_STATE_IN_PROGRESS, "in_progress"),
    (n.NVML_GPU_FABRIC_STATE_COMPLETED, "completed"),
])
def test_fabric_states(fake_nvml: Any, state: int, name: str) -> None:
    gpu = open_gpu(fake_nvml, FakeGpu(fabric=FakeFabric(state=state)))
    assert gpu.query("fabric_info")["state"] == name


def test_fabric_registration_failure_names_the_nvml_error(fake_nvml: Any) -> None:
    gpu = open_gpu(fake_nvml, FakeGpu(fabric=FakeFabric(
        state=n.NVML_GPU_FABRIC_STATE_COMPLETED, status=n.NVML_ERROR_NOT_READY,
        cluster_uuid=bytes(16), clique_id=0)))
    assert gpu.query("fabric_info") == {"state": "completed", "status": "not_ready",
                                        "cluster_uuid": "00000000-0000-0000-0000-000000000000",
                                        "clique_id": 0}


def test_fabric_uses_the_versioned_struct(fake_nvml: Any) -> None:
    library = FakeNvmlLibrary([FakeGpu(**DISTINCT)])
    fake_nvml(library)
    assert nvml.open_nvml().gpu(0).query("fabric_info") == EXPECTED["fabric_info"]
    assert library.calls_to("nvmlDeviceGetGpuFabricInfoV") and \
        not library.calls_to("nvmlDeviceGetGpuFabricInfo")


def test_fabric_on_a_driver_without_the_v_function(fake_nvml: Any) -> None:
    library = FakeNvmlLibrary([FakeGpu(**DISTINCT)], missing=("nvmlDeviceGetGpuFabricInfoV",))
    fake_nvml(library)
    assert nvml.open_nvml().gpu(0).query("fabric_info") == EXPECTED["fabric_info"]
    assert len(library.calls_to("nvmlDeviceGetGpuFabricInfo")) == 1


def test_fabric_on_a_driver_without_either_function(fake_nvml: Any) -> None:
    gpu = open_gpu(fake_nvml, FakeGpu(**DISTINCT), missing=(
        "nvmlDeviceGetGpuFabricInfoV", "nvmlDeviceGetGpuFabricInfo"))
    with pytest.raises(NotSupported, match=r"nvmlDeviceGetGpuFabricInfo: .*no such function"):
        gpu.query("fabric_info")


def test_fabric_not_supported(fake_nvml: Any) -> None:
    with pytest.raises(NotSupported):
        open_gpu(fake_nvml, FakeGpu(fabric=None)).query("fabric_info")


def test_fabric_v_failure_is_not_retried_on_the_old_function(fake_nvml: Any) -> None:
    library = FakeNvmlLibrary([FakeGpu(fabric=FakeFabric(), errors={
        "nvmlDeviceGetGpuFabricInfoV": n.NVML_ERROR_UNKNOWN})])
    fake_nvml(library)
    with pytest.raises(HardwareError, match="Unknown Error"):
        nvml.open_nvml().gpu(0).query("fabric_info")
    assert not library.calls_to("nvmlDeviceGetGpuFabricInfo")


# --- compute mode, old-driver fallbacks ----------------------------------------------------

@pytest.mark.parametrize("mode,name", [
    (n.NVML_COMPUTEMODE_DEFAULT, "default"),
    (n.NVML_COMPUTEMODE_EXCLUSIVE_THREAD, "exclusive_process"),
    (n.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS, "exclusive_process"),
    (n.NVML_COMPUTEMODE_PROHIBITED, "prohibited"),
])
def test_compute_modes(fake_nvml: Any, mode: int, name: str) -> None:
    assert open_gpu(fake_nvml, FakeGpu(compute_mode=mode)).query("compute_mode") == name


def test_undocumented_compute_mode_is_an_error(fake_nvml: Any) -> None:
    with pytest.raises(HardwareError, match="compute mode 9"):
        open_gpu(fake_nvml, FakeGpu(compute_mode=9)).query("compute_mode")


def test_clock_reasons_on_a_driver_before_the_rename(fake_nvml: Any) -> None:
    library = FakeNvmlLibrary([FakeGpu(clock_reasons=0x20)],
                              missing=("nvmlDeviceGetCurrentClocksEventReasons",))
    fake_nvml(library)
    assert nvml.open_nvml().gpu(0).query("clock_event_reasons") == 0x20
    assert library.calls_to("nvmlDeviceGetCurrentClocksThrottleReasons")


def test_temperature_on_a_driver_without_the_deprecated_function(fake_nvml: Any) -> None:
    library = FakeNvmlLibrary([FakeGpu(temperature=55)], missing=("nvmlDeviceGetTemperature",))
    fake_nvml(library)
    assert nvml.open_nvml().gpu(0).query("temperature_c") == 55
    assert library.calls_to("nvmlDeviceGetTemperatureV")


# --- calls bounded in time -----------------------------------------------------------------

def test_a_hung_call_is_abandoned_and_only_that_gpu_is_affected(
        fake_nvml: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvml, "CALL_TIMEOUT_S", 0.3)
    library = FakeNvmlLibrary([FakeGpu(errors={"nvmlDeviceGetTemperature": HANG}),
                               FakeGpu(bus_id="00000000:19:00.0")])
    fake_nvml(library)
    handle = nvml.open_nvml()
    hung, healthy = handle.gpu(0), handle.gpu(1)
    start = time.monotonic()
    with pytest.raises(HardwareError, match=r"nvmlDeviceGetTemperature: no answer within 0.3 s"):
        hung.query("temperature_c")
    assert time.monotonic() - start < 5
    before = len(library.calls)
    with pytest.raises(HardwareError, match="never returned"):
        hung.query("power_w")  # not attempted: it would hang too
    assert len(library.calls) == before
    assert healthy.query("temperature_c") == 35


def test_a_gpu_whose_handle_lookup_hangs_is_lost(fake_nvml: Any,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvml, "CALL_TIMEOUT_S", 0.3)
    fake_nvml(FakeNvmlLibrary([FakeGpu(errors={"nvmlDeviceGetHandleByIndex_v2": HANG})]))
    with pytest.raises(GpuLost, match="no answer within"):
        nvml.open_nvml().gpu(0)


def test_fake_records_its_own_gaps(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fixture's safety net: a function the fake lacks is recorded, never silently 0."""
    library = FakeNvmlLibrary([FakeGpu()])
    fakenvml.install(monkeypatch, library)
    n.nvmlInit()
    with pytest.raises(n.NVMLError_FunctionNotFound):
        n.nvmlDeviceGetBoardId(n.nvmlDeviceGetHandleByIndex(0))
    assert library.problems == ["pynvml looked up nvmlDeviceGetBoardId, which the fake does not "
                                "implement"]
