"""Thresholds are data: every profile loads, inherits generic, and detection picks the right one."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from checks import profiles
from checks.hw.measure import busbw

REQUIRED = ["host.shm_min_bytes", "host.memlock_min_bytes", "host.cpus_per_gpu_min",
            "driver.min_branch", "ecc.volatile_uncorrected_max", "ecc.volatile_corrected_warn",
            "ecc.aggregate_corrected_warn", "retired_pages.max", "row_remap.uncorrectable_warn",
            "sxid.nonfatal_warn", "pcie.min_gen", "pcie.replay_warn", "thermal.slowdown_margin_c",
            "power.min_limit_fraction", "nvlink.error_warn", "straggler_pct"]
# Every model profile shipped, from the directory itself (a new model is one new file there).
PROFILE_DIR = Path(__file__).resolve().parents[2] / "checks" / "profiles"
MODELS = sorted(p.stem for p in PROFILE_DIR.glob("*.yaml") if p.stem != profiles.GENERIC)


def test_every_profile_file_is_available() -> None:
    assert MODELS and set(profiles.available()) == {*MODELS, profiles.GENERIC}


@pytest.mark.parametrize("name", MODELS)
def test_each_model_is_detected_from_its_own_pci_ids_and_names(name: str) -> None:
    """A profile's match rules select it, and no other profile's rules steal its GPUs."""
    profile = profiles.load(name)
    for device_id in profile.get("match.pci_device_ids") or []:
        assert profiles.detect([int(device_id)] * 2, []).name == name, f"{name}: 0x{int(device_id):04x}"
    for pattern in profile.get("match.names") or []:
        if pattern.startswith("^") and pattern.endswith("$"):  # a plain anchored NVML name
            assert profiles.detect([], [pattern[1:-1]]).name == name, pattern


@pytest.mark.parametrize("name", profiles.available())
def test_profile_has_every_threshold(name: str) -> None:
    profile = profiles.load(name)
    for key in REQUIRED:
        assert profile.get(key) is not None, f"{name} lacks {key}"
    if name != "generic":
        # Volta has no bf16: its fastest tensor format (fp16) stands in.
        assert (profile.get("peaks.bf16_tflops") or profile.get("peaks.fp16_tflops")) \
            and profile.get("peaks.mem_bw_gbs")
        assert profile.get("match.pci_device_ids")


@pytest.mark.parametrize("device_id,names,expected", [
    ([0x2330] * 8, [], "h100-sxm"),
    ([0x2331], [], "h100-pcie"),
    ([0x2335], [], "h200"),
    ([0x233B], [], "h200-nvl"),
    ([0x2321], [], "h100-nvl"),
    ([0x20B2], [], "a100-80gb"),
    ([0x20B0], [], "a100-40gb"),
    ([0x20F1], [], "a100-pcie-40gb"),
    ([0x20B5], [], "a100-pcie-80gb"),
    ([0x26B9], [], "l40s"),
    ([0x27B8], [], "l4"),
    ([0x2236], [], "a10"),
    ([], ["NVIDIA H100 80GB HBM3"], "h100-sxm"),
    ([], ["NVIDIA A10"], "a10"),
    # NVML names of the PCIe parts contain the SXM part's name: matching is anchored.
    ([], ["NVIDIA H200"], "h200"),
    ([], ["NVIDIA H200 NVL"], "h200-nvl"),
    ([], ["NVIDIA H100 NVL"], "h100-nvl"),
    ([], ["NVIDIA H100 PCIe"], "h100-pcie"),
    ([], ["NVIDIA A100-PCIE-40GB"], "a100-pcie-40gb"),
    ([], ["NVIDIA A100 80GB PCIe"], "a100-pcie-80gb"),
    ([], ["NVIDIA A100-SXM4-80GB"], "a100-80gb"),
    ([], ["NVIDIA A10G"], "generic"),
])
def test_detection(device_id: list[int], names: list[str], expected: str) -> None:
    assert profiles.detect(device_id, names).name == expected


@pytest.mark.parametrize("name", [n for n in profiles.available() if n != "generic"])
def test_name_patterns_are_anchored(name: str) -> None:
    """An unanchored pattern lets one model's name claim another's ('H200' in 'H200 NVL')."""
    for pattern in profiles.load(name).get("match.names") or []:
        assert pattern.startswith("^") and pattern.endswith("$"), f"{name}: {pattern!r}"


def test_unknown_model_falls_back_to_generic_and_says_so() -> None:
    profile = profiles.detect([0x9999], ["NVIDIA Future GPU"])
    assert profile.name == "generic"
    assert profile.unknown_models == ["0x9999", "NVIDIA Future GPU"]


def test_unknown_profile_name_is_a_clear_error() -> None:
    with pytest.raises(profiles.ProfileError, match="unknown profile 'x'; available"):
        profiles.load("x")


@pytest.mark.parametrize("name", profiles.available())
def test_every_nvlink_model_has_a_per_link_rate(name: str) -> None:
    """A model with NVLinks gets a derived NVLink floor only when its compute capability has a
    per-link rate (collective.nvlink_link_gbs): B300/GB300 (10.3) had none."""
    profile = profiles.load(name)
    cc = profile.get("compute_capability")
    if cc is None or not (profile.get("nvlink.links") or profile.get("nvlink.bridge_links")):
        pytest.skip(f"{name}: no NVLink model")
    rates = profile.get("collective.nvlink_link_gbs") or {}
    assert rates.get(str(cc)) is not None, f"{name}: no NVLink rate for compute capability {cc}"
    if profile.get("nvlink.link_gbs_per_direction") is not None:
        assert rates[str(cc)] == profile.get("nvlink.link_gbs_per_direction")


def test_b200_hbm_peak_is_what_the_driver_reports() -> None:
    # 7680-bit bus x 3996 MHz DDR (pytorch/ao PR#4002), not the 8 TB/s of an 8192-bit bus
    assert profiles.load("b200").get("peaks.mem_bw_gbs") == pytest.approx(7680 / 8 * 3996 * 2 / 1000,
                                                                           abs=1)


# The size each all-reduce floor's source measured at (the profile comments cite them): Azure's
# NCCL gates (azurehpc-health-checks conf/*.conf, check_nccl_allreduce ... 16G / 8G) and Azure's
# GB200 benchmark (-e 8G); B200/B300's figure (NVIDIA/nccl#1807) states none.
FLOOR_SIZES = {"h100-sxm": 16 << 30, "h200": 16 << 30, "a100-80gb": 16 << 30,
               "a100-40gb": 8 << 30, "h100-nvl": 16 << 30, "gb200-nvl72": 8 << 30,
               "gb300-nvl72": 8 << 30, "b200": None, "b300": None}


@pytest.mark.parametrize("name", profiles.available())
def test_every_allreduce_floor_states_the_size_it_was_published_at(name: str) -> None:
    """A floor judged at a size its source did not measure at fails healthy nodes (h100-sxm's
    Azure figure is for 16 GiB; at the sweep's 256 MiB top busbw is lower): each profile file
    that sets thresholds.allreduce_busbw_gbs states collective.floor_bytes beside it, null only
    with floor_bytes_unstated saying why."""
    profile = profiles.load(name)
    if profile.get("thresholds.allreduce_busbw_gbs") is None:
        assert name not in FLOOR_SIZES  # no floor: nothing to state
        return
    assert profile.get("collective.floor_bytes") == FLOOR_SIZES[name], name
    raw = yaml.safe_load((profiles.PROFILE_DIR / f"{name}.yaml").read_text())
    if "allreduce_busbw_gbs" in (raw.get("thresholds") or {}):  # stated in this very file
        assert "floor_bytes" in (raw.get("collective") or {}), f"{name}: floor_bytes not stated"
    if FLOOR_SIZES[name] is None:
        assert "no message size" in profile.get("collective.floor_bytes_unstated"), name


@pytest.mark.parametrize("name", [n for n, size in FLOOR_SIZES.items() if size])
def test_every_floor_size_fits_an_idle_gpu_of_its_model(name: str) -> None:
    """A verified all-reduce of the floor's size fits the model's memory with 1 GiB taken by the
    CUDA context and NCCL: else every healthy node of the model would WARN 'could not reach'.
    (Why a100-40gb's is 8 GiB, as Azure's ND A100 v4 gate: 16 GiB would need 54 GiB.)"""
    profile = profiles.load(name)
    free = int((float(profile.get("memory_gib")) - 1) * (1 << 30))
    assert busbw.max_verified_bytes(free, "all_reduce") >= profile.get("collective.floor_bytes")


def test_a_floor_without_its_size_is_a_load_error_naming_the_key() -> None:
    with pytest.raises(profiles.ProfileError, match=r"x\.yaml: top level: 'collective' is a "
                                                     r"required property \(.*floor_bytes"):
        profiles.validate({"thresholds": {"allreduce_busbw_gbs": 400}}, "x.yaml")
    with pytest.raises(profiles.ProfileError, match=r"'floor_bytes_unstated' is a required"):
        profiles.validate({"thresholds": {"allreduce_busbw_gbs": 400},
                           "collective": {"floor_bytes": None}}, "x.yaml")
    with pytest.raises(profiles.ProfileError, match=r"collective\.floor_bytes: 17 is not a multiple"):
        profiles.validate({"collective": {"floor_bytes": 17}}, "x.yaml")
    profiles.validate({"thresholds": {"allreduce_busbw_gbs": 400},
                       "collective": {"floor_bytes": None,
                                      "floor_bytes_unstated": "the report gives no message size"}},
                      "x.yaml")
