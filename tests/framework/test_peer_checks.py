"""Node checks operators' suites run (gpu-occupied, gpu-firmware, disk-space, swap, bmc-sensors,
dcgm-diag): each shipped scenario through `python -m checks --simulate`, and the rules of each
check over in-memory variations of those scenarios."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from checks import profiles
from checks.hw.fixture import FixtureBackend, load_scenario
from checks.model import Status
from checks.node.context import Context, Options
from checks.node.suite import firmware, occupancy

MIB = 1 << 20


def problems(report: dict[str, Any]) -> dict[str, str]:
    return {c["id"]: c["status"] for c in report["checks"] if c["status"] not in ("PASS", "SKIP")}


def results_of(report: dict[str, Any], check_id: str) -> list[dict[str, Any]]:
    (chk,) = [c for c in report["checks"] if c["id"] == check_id]
    return chk["results"]


def ctx_for(data: dict[str, Any], profile: str = "generic", **profile_over: Any) -> Context:
    prof = profiles.load(profile)
    for dotted, value in profile_over.items():
        section, key = dotted.split("__")
        prof.data.setdefault(section, {})[key] = value
    return Context(FixtureBackend(data), prof, Options(level="quick"))


# --- gpu-occupied -----------------------------------------------------------------------------

def test_memory_held_by_an_unreachable_pid_fails_that_gpu_alone(run_cli) -> None:
    code, report, _ = run_cli("--simulate", "peer-a100-pcie-memory-held-visedit5",
                              "--level", "quick")
    assert code == 1 and problems(report) == {"gpu-occupied": "FAIL"}
    by_gpu = {r["device"]["index"]: r for r in results_of(report, "gpu-occupied")}
    assert {i: r["status"] for i, r in by_gpu.items()} == {**dict.fromkeys(range(8), "PASS"),
                                                           6: "FAIL"}
    assert "pid 1733842 (name unknown, 10151 MiB)" in by_gpu[6]["message"]
    assert by_gpu[6]["fault_code"] == "GPU050" and by_gpu[6]["remedy"]


def _occupancy(gpu6: dict[str, Any], *, container: str | None = None,
               **profile_over: Any) -> Any:
    data = load_scenario("peer-a100-pcie-memory-held-visedit5")
    data["gpus"][6] = {**data["gpus"][6], **gpu6}
    if container:
        data["host"] = {**data["host"], "container": container}
    results = list(occupancy.gpu_occupied(ctx_for(data, **profile_over)))
    return results[6]


@pytest.mark.parametrize("used_mib,status", [
    (512, Status.PASS),       # below occupancy.memory_used_warn_bytes (1 GiB)
    (2048, Status.WARN),      # above it, below 5 % of 80 GiB (4096 MiB)
    (10151, Status.FAIL),     # the report's 10151 MiB: above 5 % of the GPU
])
def test_memory_held_with_no_process_listed_is_judged_by_the_profile(used_mib: int,
                                                                    status: Status) -> None:
    result = _occupancy({"compute_processes": [], "memory_used_bytes": used_mib * MIB})
    assert result.status is status, result.message
    if status is not Status.PASS:
        assert "no compute process listed" in result.message


def test_process_status_comes_from_the_profile() -> None:
    result = _occupancy({}, occupancy__process_status="warn")
    assert result.status is Status.WARN


def test_in_a_container_the_message_says_pids_may_be_invisible() -> None:
    result = _occupancy({}, container="docker")
    assert result.status is Status.FAIL and "host PIDs" in result.message


def test_gpu_without_a_process_list_is_judged_by_memory() -> None:
    result = _occupancy({"compute_processes": "not_supported"})
    assert result.status is Status.FAIL
    assert "NVML does not list processes" in result.message


def test_gpu_whose_memory_cannot_be_read_is_an_error_not_a_pass() -> None:
    result = _occupancy({"memory_used_bytes": {"error": "Unknown Error"}})
    assert result.status is Status.ERROR


# --- gpu-firmware -----------------------------------------------------------------------------

def test_one_gpu_with_another_vbios_is_named(run_cli) -> None:
    code, report, _ = run_cli("--simulate", "peer-h100-sxm-vbios-mixed-nvtrust101",
                              "--level", "quick")
    assert code == 0 and problems(report) == {"gpu-firmware": "WARN"}
    results = results_of(report, "gpu-firmware")
    odd = [r for r in results if r["status"] == "WARN"]
    assert [r["device"]["index"] for r in odd] == [5]
    assert "96.00.74.00.1C" in odd[0]["message"] and "96.00.A5.00.16" in odd[0]["message"]
    # Every GPU's versions are in the report for the fleet to compare.
    assert {r["details"]["vbios"] for r in results} == {"96.00.A5.00.16", "96.00.74.00.1C"}
    assert {r["details"]["inforom"] for r in results} == {"G520.0202.00.05"}


def _firmware(patch: dict[int, dict[str, Any]], **profile_over: Any) -> list[Any]:
    data = copy.deepcopy(load_scenario("peer-h100-sxm-vbios-mixed-nvtrust101"))
    for index, fields in patch.items():
        data["gpus"][index] = {**data["gpus"][index], **fields}
    return list(firmware.gpu_firmware(ctx_for(data, **profile_over)))


def test_inforom_mismatch_follows_the_profile() -> None:
    results = _firmware({2: {"inforom_image_version": "G520.0200.00.05"}},
                        firmware__inforom_mismatch="fail")
    assert {r.device.index: r.status for r in results if r.status is not Status.PASS} == \
        {2: Status.FAIL, 5: Status.WARN}


def test_a_tie_has_no_usual_version_and_flags_every_gpu() -> None:
    # GPUs 0-2 join GPU 5 on 96.00.74.00.1C: four against four.
    results = _firmware({i: {"vbios_version": "96.00.74.00.1C"} for i in range(3)})
    assert {r.status for r in results} == {Status.WARN}
    assert "no version is shared by most" in results[0].message


def test_models_are_compared_only_with_their_own_kind() -> None:
    results = _firmware({5: {"name": "NVIDIA H100 PCIe"}})
    assert {r.status for r in results} == {Status.PASS}


def test_unreadable_version_is_an_error() -> None:
    results = _firmware({3: {"vbios_version": {"error": "Unknown Error"}}})
    assert [r.status for r in results if r.device.index == 3] == [Status.ERROR]
