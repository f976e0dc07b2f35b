"""The preflight role's GPU architecture table (playbooks/roles/preflight/vars/main.yml) as the
nodecert_node_facts module reads it: every named model resolves to its architecture and the
kernel-module flavour it needs, and no two ranges overlap (first match wins, so an overlap once
made H100/H200/GH200 come out "Ampere" and let GH200 through with proprietary modules).

Fast (no root): imports the module and feeds it a planted sysfs tree; filed with the framework
tests (it was under tests/e2e/ though nothing in it is end to end).
"""

from __future__ import annotations

import importlib.util
import itertools
from pathlib import Path

import pytest
import yaml

from checks import profiles
from checks.docgen import preflight_models

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "playbooks" / "roles" / "preflight"
TABLES = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())
ARCHITECTURES = TABLES["_preflight_gpu_architectures"]
MODELS = TABLES["_preflight_gpu_models"]

# The model rows of a profile are generated from it (checks.docgen.preflight_models): their
# expected architecture follows from the profile's compute capability, by NVIDIA's compute
# capability table (preflight_models.ARCHITECTURES, cited there), which is independent of the
# architecture ranges under test. A new GPU model needs no row here.
PROFILES = [p for p in map(profiles.load, profiles.available()) if p.get("match.pci_device_ids")]
FROM_PROFILES = {f"{int(i):04x}": (p.name, preflight_models.ARCHITECTURES[str(p.get("compute_capability"))])
                 for p in PROFILES for i in p.get("match.pci_device_ids")}
# The hand-kept rows of the vars file (GPUs no profile describes) and their architecture. Device
# IDs and names: the "Compatible GPUs" table of NVIDIA's open-gpu-kernel-modules README (and
# pci.ids for the pre-Turing parts the open modules do not list).
HAND_ROWS = {
    "15f8": "Pascal",
    "1b38": "Pascal",
    "1db4": "Volta",
    "1df6": "Volta",
    "1eb8": "Turing",
    "20b7": "Ampere",
    "2235": "Ampere",
    "26b5": "Ada Lovelace",
}
# Open modules required for Grace Hopper and Blackwell, not supported before Turing (NVIDIA
# driver installation guide, "Kernel modules").
MODULES = {
    "Pascal": "proprietary_only",
    "Volta": "proprietary_only",
    "Turing": "open_recommended",
    "Ampere": "open_recommended",
    "Ada Lovelace": "open_recommended",
    "Hopper": "open_recommended",
    "Grace Hopper": "open_required",
    "Blackwell": "open_required",
}
NVSWITCHES = {"1af1", "22a3"}


@pytest.fixture(scope="module")
def node_facts():
    path = ROLE / "library" / "nodecert_node_facts.py"
    spec = importlib.util.spec_from_file_location("nodecert_node_facts", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def plant(sysfs: Path, address: str, device_id: str, pci_class: str = "0x030200") -> None:
    device = sysfs / address
    device.mkdir(parents=True)
    (device / "vendor").write_text("0x10de\n")
    (device / "device").write_text(f"0x{device_id}\n")
    (device / "class").write_text(f"{pci_class}\n")


def test_every_named_gpu_has_an_expected_architecture():
    assert set(MODELS) - NVSWITCHES == set(FROM_PROFILES) | set(HAND_ROWS)
    assert not set(FROM_PROFILES) & set(HAND_ROWS), "a profile's ID is also a hand-kept row"


def expected(device_id: str) -> frozenset[str]:
    return FROM_PROFILES[device_id][1] if device_id in FROM_PROFILES else frozenset({HAND_ROWS[device_id]})


def test_ranges_do_not_overlap():
    spans = sorted((int(a["first"], 16), int(a["last"], 16), a["name"]) for a in ARCHITECTURES)
    for (first, last, name), (next_first, _, next_name) in itertools.pairwise(spans):
        assert first <= last, name
        assert last < next_first, f"{name} (..{last:04x}) overlaps {next_name} ({next_first:04x}..)"


@pytest.mark.parametrize("device_id", sorted(set(FROM_PROFILES) | set(HAND_ROWS)))
def test_model_resolves_to_its_architecture(node_facts, tmp_path, device_id):
    plant(tmp_path, "0000:3b:00.0", device_id)
    gpus, nvswitches = node_facts.pci_devices(str(tmp_path), ARCHITECTURES, MODELS)
    assert nvswitches == []
    (gpu,) = gpus
    assert gpu["model"] == MODELS[device_id]
    assert gpu["architecture"] in expected(device_id), MODELS[device_id]
    assert gpu["kernel_modules"] == MODULES[gpu["architecture"]], MODELS[device_id]


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: p.name)
def test_grace_hopper_profiles_resolve_to_grace_hopper(node_facts, tmp_path, profile):
    """Compute capability 9.0 is Hopper or Grace Hopper; the Grace Hopper superchips need the
    open modules, so which one a profile is matters: its NVML names say (GH200)."""
    grace = any("GH200" in n for n in profile.get("match.names") or [])
    for i, device_id in enumerate(profile.get("match.pci_device_ids")):
        plant(tmp_path, f"0000:{i + 1:02x}:00.0", f"{int(device_id):04x}")
    gpus, _ = node_facts.pci_devices(str(tmp_path), ARCHITECTURES, MODELS)
    assert all((g["architecture"] == "Grace Hopper") == grace for g in gpus), profile.name


def test_gh200_requires_open_modules_and_h100_only_recommends_them(node_facts, tmp_path):
    plant(tmp_path, "0000:01:00.0", "2342")
    plant(tmp_path, "0000:02:00.0", "2330")
    gpus, _ = node_facts.pci_devices(str(tmp_path), ARCHITECTURES, MODELS)
    assert [(g["model"], g["kernel_modules"]) for g in gpus] == [
        ("GH200 480GB", "open_required"),
        ("H100 80GB HBM3", "open_recommended"),
    ]


def test_nvswitch_and_unknown_ids(node_facts, tmp_path):
    plant(tmp_path, "0000:c0:00.0", "22a3", "0x068000")
    plant(tmp_path, "0000:3b:00.0", "3fff")
    gpus, nvswitches = node_facts.pci_devices(str(tmp_path), ARCHITECTURES, MODELS)
    assert [s["model"] for s in nvswitches] == ["NVSwitch (3rd generation)"]
    # An ID outside every range is named as unknown, never guessed.
    assert [(g["model"], g["architecture"]) for g in gpus] == [("NVIDIA device 3fff", "unknown")]
