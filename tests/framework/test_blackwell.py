"""Blackwell nodes: profiles, the GPU03x checks (units and through main(argv)), the backend
additions (IMEX node list, DMI product) and the shipped Blackwell scenarios."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from checks import profiles
from checks.hw import linux
from checks.hw.base import Backend
from checks.hw.fixture import FixtureBackend, ScenarioError, load_scenario
from checks.model import Status
from checks.node.context import Context, Options
from checks.node.suite import blackwell
from checks.report_schema import schema

BLACKWELL = ["b200", "b300", "gb200-nvl72", "gb300-nvl72"]


# --- profiles -------------------------------------------------------------------------------

@pytest.mark.parametrize("device_ids,names,expected", [
    ([0x2901] * 8, [], "b200"),
    ([0x3182] * 8, [], "b300"),
    ([0x2941] * 4, [], "gb200-nvl72"),
    ([0x31C2] * 4, [], "gb300-nvl72"),
    ([], ["NVIDIA B200"], "b200"),
    ([], ["NVIDIA B300 SXM6 AC"], "b300"),
    ([], ["NVIDIA GB200"], "gb200-nvl72"),
    ([], ["NVIDIA GB300"], "gb300-nvl72"),
])
def test_blackwell_models_are_detected(device_ids: list[int], names: list[str], expected: str) -> None:
    assert profiles.detect(device_ids, names).name == expected


@pytest.mark.parametrize("name", BLACKWELL)
def test_blackwell_profiles_carry_platform_and_figures(name: str) -> None:
    p = profiles.load(name)
    platform = p.require("blackwell.platform")
    assert platform in ("hgx", "nvl72")
    assert p.get("blackwell.open_module_required") is True
    assert p.require("gpus_per_node") == (8 if platform == "hgx" else 4)
    assert p.require("nvlink.links") == 18 and p.require("nvlink.link_gbs_per_direction") == 50
    for key in ("peaks.bf16_tflops", "peaks.fp8_tflops", "peaks.mem_bw_gbs",
                "thresholds.allreduce_busbw_gbs", "thresholds.allreduce_busbw_ring_gbs",
                "thresholds.p2p_bw_gbs"):
        assert float(p.require(key)) > 0, f"{name} lacks {key}"
    # a floor below the spec: thresholds are measured figures with a margin, not the datasheet
    assert p.require("thresholds.allreduce_busbw_gbs") < 18 * 50
    if platform == "hgx":
        assert p.require("blackwell.fabric.modules") == ["ib_umad"]
    else:
        assert p.require("blackwell.nvl72.imex_unit") == "nvidia-imex"


@pytest.mark.parametrize("name", BLACKWELL)
def test_every_figure_has_a_source_comment(name: str) -> None:
    """Each numeric line of a Blackwell profile names its source in a comment (or is covered by
    the comment block of its mapping)."""
    text = (profiles.PROFILE_DIR / f"{name}.yaml").read_text()
    header = [ln for ln in text.splitlines() if ln.startswith("#")]
    assert any("http" in ln or "#" in ln[1:] or "datasheet" in ln for ln in header)
    for line in text.splitlines():
        body = line.split("#", 1)[0]
        value = body.split(":", 1)[-1]
        if ":" in body and re.search(r"(?<![A-Za-z_\d])\d", value) \
                and not body.strip().startswith("-") and "description" not in body:
            key = body.split(":", 1)[0].strip()
            if key in ("extends", "match", "names"):
                continue
            # the figure's line or its mapping's opening line carries a comment
            assert "#" in line or key in ("bf16_tflops", "fp16_tflops", "fp8_tflops",
                                          "mem_bw_gbs"), f"{name}: no source on {line!r}"


# --- scenarios through main(argv) -----------------------------------------------------------

# scenario -> the checks that must flag it; every other check PASS or SKIP.
CASES = {
    "blackwell-b200-8x-healthy": {},
    "blackwell-gb200-tray-healthy": {},
    "blackwell-gb200-tray-other-domain": {},   # only the fleet can tell (tests/fleet/test_nvl72)
    "blackwell-b200-proprietary-module": {"blackwell-open-module": "FAIL", "gpu-count": "FAIL",
                                          "nvlink5-fabric": "ERROR"},
    "blackwell-gb200-fabric-registration-failed": {"nvl72-fabric": "FAIL"},
    "blackwell-gb200-imex-down": {"imex-service": "FAIL"},
}


@pytest.mark.parametrize("scenario,expected", sorted(CASES.items()))
def test_blackwell_scenario_verdicts(run_cli, scenario: str, expected: dict[str, str]) -> None:
    code, report, err = run_cli("--simulate", scenario, "--level", "quick")
    assert report is not None, err
    jsonschema.validate(report, schema())
    problems = {c["id"]: c["status"] for c in report["checks"]
                if c["status"] not in ("PASS", "SKIP")}
    assert problems == expected
    assert code == (1 if expected else 0)
    for chk in report["checks"]:
        for result in chk["results"]:
            if result["status"] in ("FAIL", "WARN"):
                assert result["fault_code"] == chk["code"] and result["remedy"]


def test_shipped_blackwell_scenarios_cite_a_source() -> None:
    for path in sorted(Path(load_scenario("blackwell-b200-8x-healthy")["_path"]).parent
                       .glob("blackwell-*.yaml")):
        text = load_scenario(str(path))["description"]
        assert "#" in text or "guide" in text or "README" in text, path.name


def test_fabric_registration_failure_names_every_gpu(run_cli) -> None:
    _, report, _ = run_cli("--simulate", "blackwell-gb200-fabric-registration-failed",
                           "--level", "quick")
    (chk,) = [c for c in report["checks"] if c["id"] == "nvl72-fabric"]
    assert sorted(r["device"]["pci"] for r in chk["results"] if r["status"] == "FAIL") == [
        "0000:01:00.0", "0008:01:00.0", "0010:01:00.0", "0018:01:00.0"]


def test_healthy_tray_publishes_its_domain_for_the_fleet(run_cli) -> None:
    _, report, _ = run_cli("--simulate", "blackwell-gb200-tray-healthy", "--level", "quick")
    checks = {c["id"]: c for c in report["checks"]}
    fabric = checks["nvl72-fabric"]["results"][0]["details"]
    assert fabric["cluster_uuid"] == "9c6f5af3-53bf-49b5-a436-b66766c413c3"
    assert fabric["clique_id"] == 4026
    assert len(checks["imex-service"]["results"][0]["details"]["nodes"]) == 18
    platform = checks["blackwell-platform"]["results"][0]
    assert platform["details"]["dmi_product"] == "GB200 NVL72 Compute Tray"
    assert platform["details"]["pci_device_ids"] == ["0x2941"]


def test_hopper_node_skips_every_blackwell_check(run_cli) -> None:
    _, report, _ = run_cli("--simulate", "h100-sxm-8x-healthy", "--level", "quick")
    statuses = {c["id"]: c["status"] for c in report["checks"] if c["code"].startswith("GPU03")}
    assert statuses == dict.fromkeys(["blackwell-open-module", "blackwell-platform",
                                      "nvlink5-fabric", "nvl72-fabric", "imex-service"], "SKIP")


# --- units over in-memory scenarios ---------------------------------------------------------

def _ctx(scenario: str, profile: str, **patch: Any) -> Context:
    data = load_scenario(scenario)
    for section, values in patch.items():
        if isinstance(values, dict) and isinstance(data.get(section), dict):
            data[section] = {**data[section], **values}
        else:
            data[section] = values
    return Context(FixtureBackend(data), profiles.load(profile), Options(level="quick"))


def _statuses(results) -> list[Status]:
    return [r.status for r in results]


@pytest.mark.parametrize("text,status", [
    ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.03  Release Build", "PASS"),
    ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.03  Release Build", "FAIL"),
    ("NVRM version: NVIDIA UNIX Kernel Module for aarch64  570.133.20  Release Build", "FAIL"),
    (None, "FAIL"),
    ("garbage", "ERROR"),
    ("", "ERROR"),
])
def test_open_module_flavour(text: str | None, status: str) -> None:
    ctx = _ctx("blackwell-b200-8x-healthy", "b200", driver={"proc_version": text})
    (result,) = blackwell.open_module(ctx)
    assert result.status == Status(status)
    if status == "FAIL":
        assert "open" in result.remedy


def test_open_module_not_required_off_blackwell() -> None:
    ctx = _ctx("blackwell-b200-8x-healthy", "h100-sxm",
               driver={"proc_version": "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.90"})
    assert _statuses(blackwell.open_module(ctx)) == [Status.SKIP]


def test_platform_fails_with_a_gpu_missing_from_the_bus() -> None:
    data = load_scenario("blackwell-b200-8x-healthy")
    data["gpus"][3] = {**data["gpus"][3], "on_pci": False}
    ctx = Context(FixtureBackend(data), profiles.load("b200"), Options())
    (result,) = blackwell.platform(ctx)
    assert result.status is Status.FAIL and result.value == 7 and result.expected == "8"



def test_platform_of_a_model_without_a_gpu_count_says_so() -> None:
    """A Blackwell profile that names no gpus_per_node (a PCIe model's) must not read
    "expected: None GPUs"."""
    b200 = profiles.load("b200")
    profile = dataclasses.replace(b200, data={k: v for k, v in b200.data.items() if k != "gpus_per_node"})
    assert profile.get("gpus_per_node") is None and profile.get("blackwell")
    ctx = Context(FixtureBackend(load_scenario("blackwell-b200-8x-healthy")), profile, Options())
    (result,) = blackwell.platform(ctx)
    assert result.status is Status.PASS and "None" not in str(result.expected)
    assert result.expected == "a Blackwell GPU on the bus (no fixed count)"

def test_platform_reports_without_dmi() -> None:
    ctx = _ctx("blackwell-b200-8x-healthy", "b200", host={"dmi_product": None})
    (result,) = blackwell.platform(ctx)
    assert result.status is Status.PASS and "no DMI product name" in result.message


def test_nvlink5_fabric_needs_ib_umad() -> None:
    ctx = _ctx("blackwell-b200-8x-healthy", "b200",
               host={"modules": ["nvidia", "nvidia_uvm", "mlx5_core"]})
    results = list(blackwell.nvlink5_fabric(ctx))
    assert _statuses(results) == [Status.FAIL] and "ib_umad" in results[0].message


def test_nvlink5_fabric_fm_down_and_gpus_stuck_in_progress() -> None:
    ctx = _ctx("blackwell-b200-8x-healthy", "b200",
               host={"services": {"nvidia-fabricmanager": "failed", "nvlsm": "inactive"}},
               gpu_defaults={**load_scenario("blackwell-b200-8x-healthy")["gpu_defaults"],
                             "fabric_info": {"state": "in_progress",
                                             "status": "NVML_ERROR_NOT_READY",
                                             "cluster_uuid": "", "clique_id": 0}})
    results = list(blackwell.nvlink5_fabric(ctx))
    assert _statuses(results) == [Status.FAIL] * 9
    assert "nvidia-fabricmanager is failed" in results[0].message
    assert all("NVLSM not running" in r.message for r in results[1:])
    assert {r.device.index for r in results[1:]} == set(range(8))


def test_nvlink5_fabric_passes_with_nvlsm_run_inside_fm() -> None:
    ctx = _ctx("blackwell-b200-8x-healthy", "b200",
               host={"services": {"nvidia-fabricmanager": "active", "nvlsm": "inactive"}})
    (result,) = blackwell.nvlink5_fabric(ctx)
    assert result.status is Status.PASS and "run by nvidia-fabricmanager" in result.message


def test_nvlink5_fabric_without_fabric_info_is_an_error() -> None:
    data = load_scenario("blackwell-b200-8x-healthy")
    del data["gpu_defaults"]["fabric_info"]
    ctx = Context(FixtureBackend(data), profiles.load("b200"), Options())
    results = list(blackwell.nvlink5_fabric(ctx))
    assert _statuses(results) == [Status.ERROR] * 8


def test_nvl72_tray_split_across_cliques_fails() -> None:
    data = load_scenario("blackwell-gb200-tray-healthy")
    data["gpus"][2] = {**data["gpus"][2], "fabric_info": {
        "state": "completed", "status": "success",
        "cluster_uuid": "9c6f5af3-53bf-49b5-a436-b66766c413c3", "clique_id": 4030}}
    ctx = Context(FixtureBackend(data), profiles.load("gb200-nvl72"), Options())
    results = list(blackwell.nvl72_fabric(ctx))
    assert _statuses(results) == [Status.FAIL] and "2 different" in results[0].message


def test_nvl72_registered_without_clique_fails() -> None:
    base = load_scenario("blackwell-gb200-tray-healthy")["gpu_defaults"]
    ctx = _ctx("blackwell-gb200-tray-healthy", "gb200-nvl72", gpu_defaults={
        **base, "fabric_info": {"state": "completed", "status": "success",
                                "cluster_uuid": "00000000-0000-0000-0000-000000000000",
                                "clique_id": 0}})
    assert _statuses(blackwell.nvl72_fabric(ctx)) == [Status.FAIL] * 4


@pytest.mark.parametrize("host,status,needle", [
    ({"imex_nodes": None}, "FAIL", "missing"),
    ({"imex_nodes": []}, "FAIL", "empty"),
    ({"imex_nodes": {"error": "Permission denied"}}, "ERROR", "Permission denied"),
    ({"services": {"nvidia-imex": "unknown"}, "container": "docker"}, "ERROR", "docker"),
    ({"services": {"nvidia-imex": "inactive"}}, "FAIL", "inactive"),
    ({"imex_nodes": ["10.0.0.1", "10.0.0.2"]}, "WARN", "2 nodes"),
])
def test_imex_service_outcomes(host: dict[str, Any], status: str, needle: str) -> None:
    ctx = _ctx("blackwell-gb200-tray-healthy", "gb200-nvl72", host=host)
    (result,) = blackwell.imex_service(ctx)
    assert result.status == Status(status) and needle in result.message


# --- backend additions ----------------------------------------------------------------------

def test_linux_reads_the_imex_node_list(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "nodes_config.cfg"
    cfg.write_text("# domain A\n10.40.1.1\n\n10.40.1.2   # tray 2\n  10.40.1.3\n")
    monkeypatch.setattr(linux, "IMEX_NODES_CONFIG", cfg)
    assert linux.LinuxBackend().imex_nodes_config() == ["10.40.1.1", "10.40.1.2", "10.40.1.3"]
    monkeypatch.setattr(linux, "IMEX_NODES_CONFIG", tmp_path / "absent.cfg")
    assert linux.LinuxBackend().imex_nodes_config() is None


def test_linux_dmi_product(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "product_name").write_text("HGX B200 8-GPU\n")
    monkeypatch.setattr(linux, "DMI", tmp_path)
    assert linux.LinuxBackend().dmi_product() == "HGX B200 8-GPU"
    monkeypatch.setattr(linux, "DMI", tmp_path / "none")
    assert linux.LinuxBackend().dmi_product() is None


def test_base_backend_defaults_are_none() -> None:
    assert Backend.imex_nodes_config(None) is None  # type: ignore[arg-type]
    assert Backend.dmi_product(None) is None  # type: ignore[arg-type]


def test_fixture_rejects_a_misspelt_host_key(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("extends: blackwell-gb200-tray-healthy\nhost: {imex_node: [1.2.3.4]}\n")
    with pytest.raises(ScenarioError, match="imex_node"):
        load_scenario(str(bad))


def test_nvl72_lost_gpu_is_not_passed() -> None:
    data = load_scenario("blackwell-gb200-tray-healthy")
    data["gpus"][1] = {**data["gpus"][1], "lost": True}
    ctx = Context(FixtureBackend(data), profiles.load("gb200-nvl72"), Options())
    results = list(blackwell.nvl72_fabric(ctx))
    # the lost GPU is not measured (gpu-count fails it); the three others are judged
    assert _statuses(results) == [Status.SKIP, Status.PASS]
    assert "lost" in results[0].message and results[0].device.index == 1
    assert results[1].message.startswith("3/4 GPUs registered")
