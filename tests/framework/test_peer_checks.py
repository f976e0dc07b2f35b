"""Node checks operators' suites run (gpu-occupied, gpu-firmware, disk-space, swap, bmc-sensors,
dcgm-diag): each shipped scenario through `python -m checks --simulate`, and the rules of each
check over in-memory variations of those scenarios."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import pytest

from checks import profiles
from checks.hw.base import slurm_job_of_cgroup
from checks.hw.fixture import FixtureBackend, load_scenario
from checks.hw.linux import LinuxBackend
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


# A training job's process as slurmstepd places it (cgroup v2) and the same under cgroup v1.
JOB_CGROUP_V2 = "0::/system.slice/slurmstepd.scope/job_123/step_0/user/task_0\n"
JOB_CGROUP_V1 = "12:devices:/slurm/uid_1000/job_77/step_batch\n4:memory:/slurm/uid_1000/job_77/step_batch\n"


@pytest.mark.parametrize("text,job", [
    (JOB_CGROUP_V2, "123"),
    (JOB_CGROUP_V1, "77"),
    ("0::/slurm_node-a/uid_0/job_9/step_extern\n", "9"),     # several slurmd on one host
    ("0::/user.slice/user-1000.slice/session-4.scope\n", None),
    ("0::/system.slice/docker-0123abcd.scope\n", None),
    ("0::/system.slice/slurmstepd.scope/system\n", None),   # slurmstepd itself, no job
    ("0::/system.slice/myjob_12.service\n", None),
    ("", None),
])
def test_the_slurm_job_is_read_from_the_cgroup(text: str, job: str | None) -> None:
    assert slurm_job_of_cgroup(text) == job


def _busy(gpu6: dict[str, Any], cgroups: dict[int, str]) -> Any:
    data = load_scenario("peer-a100-pcie-memory-held-visedit5")
    data["gpus"][6] = {**data["gpus"][6], **gpu6}
    data["host"] = {**data["host"], "process_cgroups": cgroups}
    return list(occupancy.gpu_occupied(ctx_for(data)))


def test_a_gpu_only_a_slurm_job_holds_is_busy_not_failed() -> None:
    results = _busy({}, {1733842: JOB_CGROUP_V2})
    assert results[6].status is Status.SKIP, results[6].message
    assert "busy: in use by Slurm job 123 (pid 1733842" in results[6].message
    assert "not judged while a job runs" in results[6].message
    assert results[6].details["slurm_jobs"] == {"1733842": "123"}
    assert {r.status for i, r in enumerate(results) if i != 6} == {Status.PASS}


def test_a_stray_beside_a_job_still_fails_and_the_job_is_named_apart() -> None:
    procs = [{"pid": 1733842, "name": "python", "used_memory_bytes": 8 << 30},
             {"pid": 555, "name": "zombie", "used_memory_bytes": 2 << 30}]
    result = _busy({"compute_processes": procs}, {1733842: JOB_CGROUP_V1, 555: ""})[6]
    assert result.status is Status.FAIL and result.value == 1
    assert result.message.startswith("1 other process(es) hold a compute context: pid 555 (zombie")
    assert "besides, in use by Slurm job 77 (pid 1733842 (python" in result.message


def test_a_process_outside_any_job_cgroup_still_fails() -> None:
    result = _busy({}, {1733842: "0::/user.slice/user-0.slice/session-1.scope\n"})[6]
    assert result.status is Status.FAIL and "1733842" in result.message


def test_a_busy_node_exits_clean_through_the_cli(run_cli, tmp_path) -> None:
    scenario = tmp_path / "busy.yaml"
    scenario.write_text("extends: peer-a100-pcie-memory-held-visedit5\n"
                        "host: {process_cgroups: {1733842: '0::/system.slice/slurmstepd.scope/"
                        "job_4242/step_0/user/task_0'}}\n")
    code, report, _ = run_cli("--simulate", str(scenario), "--level", "quick", "--only", "gpu-occupied")
    assert code == 0 and problems(report) == {}
    (busy,) = [r for r in results_of(report, "gpu-occupied") if r["status"] == "SKIP"]
    assert busy["device"]["index"] == 6 and "Slurm job 4242" in busy["message"]


def test_the_real_backend_reads_its_own_cgroup() -> None:
    """This test process is in no Slurm job (unless the suite itself runs in one); an ended PID
    is None, not an error."""
    backend = LinuxBackend()
    own = Path(f"/proc/{os.getpid()}/cgroup").read_text()
    assert backend.process_slurm_job(os.getpid()) == slurm_job_of_cgroup(own)
    assert backend.process_slurm_job(2**22 + 1) is None


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


def test_the_report_carries_every_gpus_firmware_for_the_fleet(run_cli) -> None:
    _, report, _ = run_cli("--simulate", "peer-h100-sxm-vbios-mixed-nvtrust101", "--only",
                           "gpu-firmware")
    firmware_facts = report["system"]["gpu_firmware"]
    assert [f["index"] for f in firmware_facts] == list(range(8))
    assert firmware_facts[5]["vbios"] == "96.00.74.00.1C"
    assert {f["inforom"] for f in firmware_facts} == {"G520.0202.00.05"}
    assert firmware_facts[0]["name"] == "NVIDIA H100 80GB HBM3"


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


def test_versions_nvml_does_not_report_are_not_a_pass() -> None:
    results = _firmware({4: {"vbios_version": "not_supported",
                             "inforom_image_version": "not_supported"}})
    assert [r.status for r in results if r.device.index == 4] == [Status.SKIP]


def test_unreadable_version_is_an_error() -> None:
    results = _firmware({3: {"vbios_version": {"error": "Unknown Error"}}})
    assert [r.status for r in results if r.device.index == 3] == [Status.ERROR]


# --- disk-space and swap ----------------------------------------------------------------------

def test_full_root_volume_fails_before_any_job(run_cli) -> None:
    code, report, _ = run_cli("--simulate", "peer-aws-p3-disk-full-dolly139", "--level", "quick")
    assert code == 1 and problems(report) == {"disk-space": "FAIL"}
    (result,) = results_of(report, "disk-space")
    assert result["details"]["path"] == "/" and result["value"] == 3.1
    assert "torch /opt/conda/lib/python3.7/site-packages/torch" in result["message"]
    assert {r["status"] for r in results_of(report, "swap")} == {"PASS"}


def test_swap_on_warns_and_names_the_area(run_cli) -> None:
    code, report, _ = run_cli("--simulate", "peer-gpu-node-swap-on-pai4611", "--level", "quick")
    assert code == 0 and problems(report) == {"swap": "WARN"}
    (result,) = results_of(report, "swap")
    assert "/swap.img (file, 2.0 GiB)" in result["message"]
    assert result["details"]["areas"][0]["used_bytes"] == 12288 * 1024


def _storage(check: Any, scenario: str, host: dict[str, Any], extra_paths: tuple[str, ...] = (),
             **profile_over: Any) -> list[Any]:
    data = load_scenario(scenario)
    data["host"] = {**data["host"], **host}
    ctx = ctx_for(data, **profile_over)
    ctx.options.extra["storage_paths"] = list(extra_paths)
    produced = check(ctx)
    return [produced] if not isinstance(produced, list) and hasattr(produced, "status") \
        else list(produced)


@pytest.mark.parametrize("free_gib,status", [(3.1, Status.FAIL), (20, Status.WARN),
                                             (60, Status.PASS)])
def test_free_space_thresholds_come_from_the_profile(free_gib: float, status: Status) -> None:
    from checks.node.suite import storage

    disks = {"/": {"total_bytes": 200 << 30, "free_bytes": int(free_gib * (1 << 30))}}
    (result,) = _storage(storage.disk_space, "peer-aws-p3-disk-full-dolly139", {"disks": disks})
    assert result.status is status


def test_a_checkpoint_volume_is_judged_on_its_own_mount() -> None:
    from checks.node.suite import storage

    disks = {"/": {"total_bytes": 200 << 30, "free_bytes": 150 << 30},
             "/data": {"total_bytes": 2 << 40, "free_bytes": 4 << 30}}
    results = _storage(storage.disk_space, "peer-aws-p3-disk-full-dolly139", {"disks": disks},
                       extra_paths=("/data/run7/checkpoints",))
    assert {r.details["path"]: r.status for r in results} == {"/": Status.PASS,
                                                              "/data": Status.FAIL}


def test_no_known_path_skips_and_an_unreadable_one_is_an_error() -> None:
    from checks.node.suite import storage

    (skipped,) = _storage(storage.disk_space, "peer-aws-p3-disk-full-dolly139",
                          {"python_paths": {}})
    assert skipped.status is Status.SKIP
    disks = {"/": {"error": "Input/output error"}}
    failed = _storage(storage.disk_space, "peer-aws-p3-disk-full-dolly139", {"disks": disks})
    assert [r.status for r in failed] == [Status.ERROR, Status.ERROR]  # venv and torch


@pytest.mark.parametrize("setting,status", [("warn", Status.WARN), ("fail", Status.FAIL),
                                            ("pass", Status.PASS)])
def test_swap_status_follows_the_profile(setting: str, status: Status) -> None:
    from checks.node.suite import storage

    (result,) = _storage(storage.swap, "peer-gpu-node-swap-on-pai4611", {},
                         swap__active_status=setting)
    assert result.status is status


def test_real_statvfs_and_proc_swaps(tmp_path: Any) -> None:
    """The Linux backend on this machine: statvfs of a path not created yet lands on its
    parent; /proc/swaps parses (whatever this host's swap state is)."""
    import os

    from checks.hw.linux import LinuxBackend, parse_proc_swaps

    du = LinuxBackend().disk_usage(str(tmp_path / "not" / "yet"))
    st = os.statvfs(tmp_path)
    assert os.path.ismount(du.path) and str(tmp_path.resolve()).startswith(du.path)
    assert du.total_bytes == st.f_blocks * st.f_frsize
    assert isinstance(LinuxBackend().swaps(), list)
    (area,) = parse_proc_swaps("Filename\tType\tSize\tUsed\tPriority\n"
                               "/dev/nvme0n1p3                          partition\t"
                               "8388604\t\t0\t\t-2\n")
    assert (area.name, area.kind, area.size_bytes, area.priority) == \
        ("/dev/nvme0n1p3", "partition", 8388604 * 1024, -2)


# --- bmc-sensors ------------------------------------------------------------------------------

def test_failed_fans_are_named_from_the_sdr(run_cli) -> None:
    code, report, _ = run_cli("--simulate", "peer-dell-r320-fans-failed-haipmi52",
                              "--level", "quick")
    assert code == 1 and problems(report) == {"bmc-sensors": "FAIL"}
    failed = [r for r in results_of(report, "bmc-sensors") if r["status"] == "FAIL"]
    assert [r["details"]["sensor"] for r in failed] == ["Fan3B", "Fan4B"]
    assert all(r["details"]["kind"] == "fan" and r["fault_code"] == "BMC001" for r in failed)


def test_psu_failure_only_in_the_event_log_fails(run_cli) -> None:
    code, report, _ = run_cli("--simulate", "peer-psu-failed-sel-checkipmi66", "--level", "quick")
    assert code == 1 and problems(report) == {"bmc-sensors": "FAIL"}
    results = results_of(report, "bmc-sensors")
    assert [r["status"] for r in results] == ["PASS", "FAIL"]  # sensors ok, SEL not
    assert results[1]["details"]["rule"] == "psu-failure" and "#3" in results[1]["message"]


def test_every_sel_rule_matches_its_own_example() -> None:
    from checks.node.suite import bmc

    assert len(bmc.rules()) >= 5
    for rule in bmc.rules():
        assert rule.source, rule.id
        (event,) = bmc.parse_sel(rule.example)
        ((matched, _, asserted),) = bmc.judge_sel([event])
        assert matched.id == rule.id and asserted, rule.id


def test_sel_from_sos2015_warns_on_the_fan_and_ignores_power_cycles() -> None:
    from checks.node.suite import bmc

    text = (bmc.RULES.parent.parent / "scenarios" / "data" / "ipmitool" /
            "sel-elist-power-unit-and-fan.txt").read_text()
    events = bmc.parse_sel(text)
    assert len(events) == 4 and not events[1].asserted
    ((rule, event, asserted),) = bmc.judge_sel(events)
    assert (rule.id, rule.status, event.record, asserted) == \
        ("fan-noncritical", Status.WARN, "33", True)


def test_a_cleared_psu_event_is_only_a_warning() -> None:
    from checks.node.suite import bmc

    events = bmc.parse_sel(
        "   3 | 12/09/2024 | 21:12:29 | Power Supply PS2 Status | Failure detected | Asserted\n"
        "   4 | 12/09/2024 | 21:40:02 | Power Supply PS2 Status | Failure detected | Deasserted\n")
    ((rule, _, asserted),) = bmc.judge_sel(events)
    assert rule.id == "psu-failure" and not asserted


def _bmc(ipmitool: Any) -> list[Any]:
    from checks.node.suite import bmc

    data = load_scenario("peer-psu-failed-sel-checkipmi66")
    data["host"] = {**data["host"], "ipmitool": ipmitool}
    if ipmitool is None:
        del data["host"]["ipmitool"]
    return list(bmc.bmc_sensors(ctx_for(data)))


@pytest.mark.parametrize("ipmitool,status,words", [
    (None, Status.SKIP, "not installed"),
    ({"device": None}, Status.SKIP, "/dev/ipmi0"),
    ({"device": "/dev/ipmi0", "sdr": {"timed_out": True}, "sel_elist": ""}, Status.ERROR,
     "no answer within 30 s"),
    ({"device": "/dev/ipmi0", "sel_elist": "",
      "sdr": {"rc": 1, "stderr": "Could not open device at /dev/ipmi0 or /dev/ipmi/0 or "
                                 "/dev/ipmidev/0: No such file or directory\n"}},
     Status.ERROR, "exited 1: Could not open device"),
])
def test_no_bmc_or_no_answer_is_never_a_pass(ipmitool: Any, status: Status, words: str) -> None:
    first = _bmc(ipmitool)[0]
    assert first.status is status and words in first.message


def test_noncritical_sensor_follows_the_profile() -> None:
    results = _bmc({"device": "/dev/ipmi0", "sel_elist": "",
                    "sdr": "PSU2 Status      | 11.2 Volts        | nc\n"})
    assert results[0].status is Status.WARN and results[0].details["kind"] == "psu"


def test_a_tool_that_hangs_is_killed_at_its_deadline(tmp_path: Any) -> None:
    """run_tool on a real process that never ends by itself: killed, and the run says so."""
    import sys

    from checks.hw.linux import run_tool

    run = run_tool((sys.executable, "-c", "import time; print('started', flush=True); "
                                          "time.sleep(600)"), timeout_s=2)
    assert run.timed_out and run.returncode is None and run.stdout.startswith("started")


# --- dcgm-diag --------------------------------------------------------------------------------

def _dcgm_data(name: str) -> str:
    from checks.node.suite import dcgm

    return (dcgm.TABLE.parent.parent / "scenarios" / "data" / "dcgm" / name).read_text()


@pytest.mark.parametrize("scenario,status,flagged", [
    ("peer-dcgm31-8gpu-r1-pass-dcgm-jsonresult", "PASS", []),
    ("peer-t400-dcgm-skipped-dcgm139", "WARN", ["PCIe", "GPU Memory"]),
    ("peer-h100-dcgm-memory-alloc-pass-dcgm284", "FAIL", ["memory"]),
])
def test_dcgm_json_from_public_reports(run_cli, scenario: str, status: str,
                                       flagged: list[str]) -> None:
    code, report, _ = run_cli("--simulate", scenario, "--only", "dcgm-diag")
    assert problems(report) == ({} if status == "PASS" else {"dcgm-diag": status})
    assert code == (1 if status == "FAIL" else 0)
    results = results_of(report, "dcgm-diag")
    assert [r["details"]["test"] for r in results if r["status"] != "PASS"] == flagged
    for r in results:
        if r["status"] != "PASS":
            assert r["device"]["index"] == 0 and r["fault_code"] == "DCGM001" and r["remedy"]


def test_both_layouts_and_their_quirks_parse() -> None:
    from checks.node.suite import dcgm

    v31 = dcgm.parse_diag(_dcgm_data("dcgm31-8gpu-r1-pass-dcgm-jsonresult.txt"))
    assert v31.version == "3.1.0" and {r.status for r in v31.results} == {Status.PASS}
    assert v31.results[0].gpus == tuple(range(8))  # "0,1,...,7"
    assert [r.gpus for r in v31.results if r.name == "software"] == [(i,) for i in range(8)]
    assert {r.key for r in v31.results} == {"software"}  # 3.x names folded as 4.x does
    t400 = dcgm.parse_diag(_dcgm_data("dcgm3-t400-r3-skipped-dcgm139.json"))
    assert [(r.key, r.status) for r in t400.results] == [
        (k, Status.SKIP) for k in ("pcie", "memory", "diagnostic", "eud", "targeted_stress")]
    v45 = dcgm.parse_diag(_dcgm_data("dcgm45-memory-alloc-pass-dcgm284.json"))
    (memory,) = [r for r in v45.results if r.key == "memory"]
    assert memory.status is Status.PASS and dcgm.judge(memory)[0] is Status.FAIL
    assert "error id 56" in memory.warnings[0]


def test_tests_at_the_top_level_and_summaries_parse() -> None:
    """Some 4.x builds put "tests" beside the categories and give only a test_summary."""
    from checks.node.suite import dcgm

    doc = ('{"DCGM Diagnostic": {"version": "4.2.3", "tests": [{"name": "pcie", '
           '"test_summary": {"status": "Fail"}}, {"name": "nvlink_bw", "results": '
           '[{"entity_group": "GPU", "entity_id": 3, "status": "Warn", "warnings": '
           '"link 5 slow"}, {"entity_group": "NvSwitch", "entity_id": 0, "status": "Fail"}]}]}}')
    diag = dcgm.parse_diag(doc)
    assert [(r.key, r.status, r.gpus, r.warnings) for r in diag.results] == [
        ("pcie", Status.FAIL, None, []), ("nvlink_bw", Status.WARN, (3,), ["link 5 slow"])]


def test_the_test_table_is_consistent() -> None:
    from checks.node.suite import dcgm

    tab = dcgm.table()
    owners: dict[str, set[str]] = {}
    for key, spec in tab["tests"].items():
        for name in spec["names"]:
            owners.setdefault(dcgm._norm(name), set()).add(key)
    assert all(len(keys) == 1 for keys in owners.values()), "a DCGM name maps to two keys"
    for key, spec in tab["tests"].items():
        assert 1 <= int(spec["level"]) <= 4 and spec["action"], key
        assert tab["aliases"][key] == key
    for rule in tab["false_positives"]:
        assert rule["test"] in tab["tests"] and rule["source"] and rule["status"] in ("fail",
                                                                                      "warn")


def _dcgm(diag: Any, level: str = "standard") -> list[Any]:
    from checks.node.suite import dcgm

    data = load_scenario("peer-h100-dcgm-memory-alloc-pass-dcgm284")
    data["host"] = {**data["host"], "dcgm": {"diag": diag}} if diag is not None else \
        {k: v for k, v in data["host"].items() if k != "dcgm"}
    ctx = ctx_for(data)
    ctx.options.level = level
    return list(dcgm.dcgm_diag(ctx))


@pytest.mark.parametrize("diag,level,status,words", [
    (None, "standard", Status.SKIP, "not installed"),
    ({"stdout": "{}"}, "quick", Status.SKIP, "no DCGM run configured for level quick"),
    ({"timed_out": True}, "standard", Status.ERROR, "did not finish within 300 s"),
    ({"rc": 255, "stdout": "Error: unable to establish a connection to the specified host: "
                           "localhost\n"}, "standard", Status.ERROR, "no JSON in the output"),
    ({"stdout": '{"DCGM Diagnostic": {"runtime_error": "Detected 1 NVLink error"}}'},
     "standard", Status.ERROR, "runtime error: Detected 1 NVLink error"),
    ({"rc": 226, "stdout": "", "stderr": "Error: NVVS error"}, "standard", Status.ERROR,
     "exited 226"),
])
def test_dcgm_that_cannot_answer_is_never_a_pass(diag: Any, level: str, status: Status,
                                                 words: str) -> None:
    (result,) = _dcgm(diag, level)
    assert result.status is status and words in result.message, result.message


def test_a_diag_that_hangs_is_killed_at_the_levels_deadline(tmp_path: Any,
                                                            monkeypatch: Any) -> None:
    """The real backend runs `dcgmi` from PATH: a dcgmi that never answers is killed at the
    profile's deadline and the check says ERROR."""
    from checks.hw.linux import LinuxBackend
    from checks.node.suite import dcgm

    fake = tmp_path / "dcgmi"
    fake.write_text("#!/bin/sh\necho \"$@\" > \"$0.args\"\nexec sleep 600\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    prof = profiles.load("generic")
    prof.data["dcgm"]["timeout_s_by_level"] = {"standard": 1.5}
    ctx = Context(LinuxBackend(), prof, Options(level="standard"))
    (result,) = list(dcgm.dcgm_diag(ctx))
    assert result.status is Status.ERROR and "was killed" in result.message
    assert (tmp_path / "dcgmi.args").read_text().split() == ["diag", "-r", "2", "-j"]
