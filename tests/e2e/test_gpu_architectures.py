"""The preflight role's GPU architecture table (playbooks/roles/preflight/vars/main.yml) as the
nodecert_node_facts module reads it: every named model resolves to its architecture and the
kernel-module flavour it needs, and no two ranges overlap (first match wins, so an overlap once
made H100/H200/GH200 come out "Ampere" and let GH200 through with proprietary modules).

Fast (no root, no e2e marker): imports the module and feeds it a planted sysfs tree.
"""

from __future__ import annotations

import importlib.util
import itertools
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "playbooks" / "roles" / "preflight"
TABLES = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())
ARCHITECTURES = TABLES["_preflight_gpu_architectures"]
MODELS = TABLES["_preflight_gpu_models"]

# Expected architecture of every model the table names. Device IDs and names: the "Compatible
# GPUs" table of NVIDIA's open-gpu-kernel-modules README (and pci.ids for the pre-Turing parts
# the open modules do not list); open modules required for Grace Hopper and Blackwell, not
# supported before Turing (NVIDIA driver installation guide, "Kernel modules").
EXPECTED = {
    "15f8": "Pascal",
    "1b38": "Pascal",
    "1db1": "Volta",
    "1db4": "Volta",
    "1db5": "Volta",
    "1df6": "Volta",
    "1eb8": "Turing",
    "20b0": "Ampere",
    "20b2": "Ampere",
    "20b5": "Ampere",
    "20b7": "Ampere",
    "20f1": "Ampere",
    "2235": "Ampere",
    "2236": "Ampere",
    "26b5": "Ada Lovelace",
    "26b9": "Ada Lovelace",
    "27b8": "Ada Lovelace",
    "2321": "Hopper",
    "2330": "Hopper",
    "2331": "Hopper",
    "2335": "Hopper",
    "233b": "Hopper",
    "2342": "Grace Hopper",
    "2348": "Grace Hopper",
    "2901": "Blackwell",
    "2941": "Blackwell",
    # Blackwell Ultra: the b300 / gb300-nvl72 profiles' IDs (pci.ids as quoted there).
    "3182": "Blackwell",
    "31c2": "Blackwell",
    "31c3": "Blackwell",
}
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
    assert set(MODELS) - NVSWITCHES == set(EXPECTED)


def test_ranges_do_not_overlap():
    spans = sorted((int(a["first"], 16), int(a["last"], 16), a["name"]) for a in ARCHITECTURES)
    for (first, last, name), (next_first, _, next_name) in itertools.pairwise(spans):
        assert first <= last, name
        assert last < next_first, f"{name} (..{last:04x}) overlaps {next_name} ({next_first:04x}..)"


@pytest.mark.parametrize("device_id", sorted(EXPECTED))
def test_model_resolves_to_its_architecture(node_facts, tmp_path, device_id):
    plant(tmp_path, "0000:3b:00.0", device_id)
    gpus, nvswitches = node_facts.pci_devices(str(tmp_path), ARCHITECTURES, MODELS)
    assert nvswitches == []
    (gpu,) = gpus
    assert gpu["model"] == MODELS[device_id]
    assert gpu["architecture"] == EXPECTED[device_id], MODELS[device_id]
    assert gpu["kernel_modules"] == MODULES[EXPECTED[device_id]], MODELS[device_id]


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
