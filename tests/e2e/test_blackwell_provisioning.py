"""Blackwell and Grace provisioning as data: which platform the preflight module detects from a
planted PCI bus and DMI product name, and what the roles then choose for it (Fabric Manager with
NVLSM and libnvsdm on HGX B200/B300, IMEX on GB200/GB300 NVL72 trays, the CUDA repository's sbsa
path and an aarch64 torch wheel on Grace, open kernel modules forced on Blackwell), through the
roles' own variables and preflight tasks run by ansible-playbook on planted hosts (local
connection, nothing installed). Fast: no root, no e2e marker.

Grace (aarch64) is tested here as data and not by a check-mode run on an arm64 root: that needs
qemu-user-static registered through binfmt_misc (not mounted on the machines the tests run on)
and an arm64 root debootstrapped under emulation, minutes per run that CI's budget has not got.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ROLES = REPO / "playbooks" / "roles"
PLAY = Path(__file__).resolve().parent / "plays" / "platform_selection.yml"
VENV_BIN = REPO / ".venv" / "bin"
TABLES = yaml.safe_load((ROLES / "preflight" / "vars" / "main.yml").read_text())

UBUNTU_2404 = {"distribution": "Ubuntu", "distribution_version": "24.04", "distribution_major_version": "24"}
X86 = {**UBUNTU_2404, "architecture": "x86_64"}
GRACE = {**UBUNTU_2404, "architecture": "aarch64"}
DOMAIN = [f"10.0.7.{n}" for n in range(1, 19)]  # an NVL72 rack's 18 compute trays
# Wheel names as PyTorch's per-CUDA index lists them (manylinux_2_28 for both machines): the
# CUDA 13.0 build, the one the pytorch role picks for these GPUs on branch 580.
WHEELS = (
    "torch-2.13.0+cu130-cp312-cp312-manylinux_2_28_x86_64.whl",
    "torch-2.13.0+cu130-cp312-cp312-manylinux_2_28_aarch64.whl",
)

# name: (GPUs as (device ID, count), NVSwitches, facts, DMI product, settings)
NODES = {
    "hgx-b200": ([("2901", 8)], 0, X86, "HGX B200 stand-in board", {}),
    "hgx-b300": ([("3182", 8)], 0, X86, None, {}),
    "gb200-tray": ([("2941", 4)], 0, GRACE, None, {"imex_nodes": DOMAIN}),
    "gb300-tray": ([("31c2", 4)], 0, GRACE, None, {"imex_nodes": DOMAIN}),
    "b200-vm-slice": ([("2901", 1)], 0, X86, None, {}),
    "b200-board-forced": ([("2901", 7)], 0, X86, None, {"preflight_platform": "hgx-b200"}),
    "hgx-h100": ([("2330", 8)], 4, X86, None, {}),
    "gh200": ([("2342", 1)], 0, GRACE, None, {}),
    "l40s": ([("26b9", 2)], 0, X86, None, {}),
    # Faults, each stopped with its message.
    "b300-proprietary": ([("3182", 8)], 0, X86, None, {"nvidia_driver_kernel_modules": "proprietary"}),
    "gb200-no-nodes": ([("2941", 4)], 0, GRACE, None, {}),
    "gb200-bad-nodes": ([("2941", 4)], 0, GRACE, None, {"imex_nodes": ["10.0.7.1", "rack-a-tray-2"]}),
    "bogus-platform": ([("2901", 8)], 0, X86, None, {"preflight_platform": "dgx-b9000"}),
}


def _plant(base: Path, name: str) -> dict:
    gpus, nvswitches, facts, dmi, settings = NODES[name]
    sysfs = base / name / "pci"
    index = 0
    for device_id, count in gpus:
        for _ in range(count):
            _device(sysfs, f"0000:{0x18 + index:02x}:00.0", device_id, "0x030200")
            index += 1
    for n in range(nvswitches):
        _device(sysfs, f"0000:{0xC0 + n:02x}:00.0", "22a3", "0x068000")
    sysfs.mkdir(parents=True, exist_ok=True)
    dmi_file = base / name / "product_name"
    if dmi is not None:
        dmi_file.write_text(dmi + "\n")
    return {
        "ansible_connection": "local",
        "ansible_python_interpreter": str(VENV_BIN / "python"),
        "planted_sysfs": str(sysfs),
        "planted_dmi": str(dmi_file),
        "planted_wheels": str(base / "wheels"),
        "planted_facts": facts,
        "planted_settings": settings,
    }


def _device(sysfs: Path, address: str, device_id: str, pci_class: str) -> None:
    device = sysfs / address
    device.mkdir(parents=True)
    (device / "vendor").write_text("0x10de\n")
    (device / "device").write_text(f"0x{device_id}\n")
    (device / "class").write_text(f"{pci_class}\n")


@pytest.fixture(scope="module")
def selection(tmp_path_factory) -> tuple[dict[str, dict], dict[str, str], str]:
    """One ansible-playbook run over every planted node: what each selected, or its failure."""
    playbook = VENV_BIN / "ansible-playbook"
    if not playbook.exists():
        pytest.fail(f"{playbook} is missing: pip install -e '.[dev]'")
    base = tmp_path_factory.mktemp("planted")
    (base / "wheels").mkdir()
    for wheel in WHEELS:
        (base / "wheels" / wheel).write_bytes(b"")
    hosts = {name: _plant(base, name) for name in NODES}
    inventory = base / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    env = {
        "PATH": f"{VENV_BIN}:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": str(base),
        "LANG": "C.UTF-8",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_FORKS": "4",
        "ANSIBLE_LOCAL_TEMP": str(base / "ansible-tmp"),
        "ANSIBLE_LIBRARY": f"{ROLES / 'preflight' / 'library'}:{ROLES / 'pytorch' / 'library'}",
        # The pytorch role's choice of torch's CUDA build (pytorch_index_url follows it).
        "ANSIBLE_FILTER_PLUGINS": str(ROLES / "pytorch" / "filter_plugins"),
    }
    proc = subprocess.run(
        [str(playbook), "-i", str(inventory), str(PLAY)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )
    output = proc.stdout + proc.stderr
    chosen: dict[str, dict] = {}
    for host, blob in re.findall(r'^ok: \[(\S+)\] => \{\n\s+"msg": "SELECTION (.*)"\n\}', output, re.M):
        chosen[host] = json.loads(json.loads(f'"{blob}"'))
    failures = {
        host: json.loads(blob).get("msg", "")
        for host, blob in re.findall(r"^fatal: \[(\S+)\]: FAILED! => (\{.*\})$", output, re.M)
    }
    return chosen, failures, output


@pytest.mark.parametrize(
    ("host", "platform", "fabric"),
    [
        ("hgx-b200", "hgx-b200", "nvlink5"),
        ("hgx-b300", "hgx-b300", "nvlink5"),
        ("gb200-tray", "gb200-nvl72-tray", "imex"),
        ("gb300-tray", "gb300-nvl72-tray", "imex"),
        # One B200 passed through to a VM: no full board, no Fabric Manager inside the VM.
        ("b200-vm-slice", "pcie", "none"),
        ("b200-board-forced", "hgx-b200", "nvlink5"),
        ("hgx-h100", "hgx-hopper", "nvswitch"),
        ("gh200", "grace-hopper", "none"),
        ("l40s", "pcie", "none"),
    ],
)
def test_platform_is_detected_from_the_pci_bus(selection, host, platform, fabric):
    chosen, failures, output = selection
    assert host in chosen, failures.get(host) or output[-3000:]
    assert (chosen[host]["platform"], chosen[host]["fabric"]) == (platform, fabric)


def test_dmi_product_is_reported(selection):
    chosen, _, _ = selection
    assert chosen["hgx-b200"]["dmi_product"] == "HGX B200 stand-in board"
    assert chosen["hgx-b300"]["dmi_product"] is None  # no DMI file: not guessed


@pytest.mark.parametrize("host", ["hgx-b200", "hgx-b300"])
def test_nvlink5_baseboard_gets_fabric_manager_nvlsm_and_libnvsdm(selection, host):
    node = selection[0][host]
    assert node["fabric_manager"] and node["nvlink5"] and not node["imex"]
    assert node["nvlink5_packages"] == ["nvlsm", "infiniband-diags"]
    # Ubuntu's versioned name first, then NVIDIA's unversioned one (branch 580).
    assert node["nvsdm_candidates"] == ["libnvsdm-580", "libnvsdm"]
    assert node["driver_flavour"] == "open"


@pytest.mark.parametrize("host", ["gb200-tray", "gb300-tray"])
def test_nvl72_tray_gets_imex_and_no_fabric_manager(selection, host):
    node = selection[0][host]
    assert node["imex"] and not node["fabric_manager"]
    assert node["imex_candidates"] == ["nvidia-imex-580", "nvidia-imex"]
    assert node["driver_flavour"] == "open"


@pytest.mark.parametrize("host", ["gb200-tray", "gb300-tray", "gh200"])
def test_grace_host_uses_sbsa_arm64_packages_and_an_aarch64_wheel(selection, host):
    node = selection[0][host]
    assert node["cuda_repo"].endswith("/ubuntu2404/sbsa/"), node["cuda_repo"]
    assert node["nvsdm_candidates"] == []  # NVIDIA publishes no libnvsdm for arm64
    assert node["torch_index"] == "https://download.pytorch.org/whl/cu130"
    assert node["torch_wheels"] == ["torch-2.13.0+cu130-cp312-cp312-manylinux_2_28_aarch64.whl"]


def test_x86_hosts_use_the_x86_64_repository_and_wheel(selection):
    node = selection[0]["hgx-b200"]
    assert node["cuda_repo"].endswith("/ubuntu2404/x86_64/")
    assert node["torch_index"] == "https://download.pytorch.org/whl/cu130"
    assert node["torch_wheels"] == ["torch-2.13.0+cu130-cp312-cp312-manylinux_2_28_x86_64.whl"]


@pytest.mark.parametrize("host", ["b200-vm-slice", "hgx-h100", "gh200", "l40s"])
def test_no_nvlink5_packages_or_imex_elsewhere(selection, host):
    node = selection[0][host]
    assert not node["nvlink5"] and not node["imex"]
    assert node["fabric_manager"] == (host == "hgx-h100")


@pytest.mark.parametrize(
    ("host", "message"),
    [
        ("b300-proprietary", "nvidia_driver_kernel_modules=proprietary cannot drive B300 SXM6 AC"),
        ("gb200-no-nodes", "imex_nodes is empty: list the IP addresses of every compute tray"),
        ("gb200-bad-nodes", "imex_nodes has entries that are not IP addresses: rack-a-tray-2."),
        # every platform rule the preflight table has, in its order (generated from the profiles)
        ("bogus-platform", "unknown platform 'dgx-b9000'; known: auto, "
         + ", ".join(r["name"] for r in TABLES["_preflight_platforms"])),
    ],
)
def test_bad_input_stops_with_one_line(selection, host, message):
    chosen, failures, output = selection
    assert host not in chosen
    assert message in failures.get(host, ""), output[-3000:]
    assert "\n" not in failures[host].strip() and "Traceback" not in failures[host]


# The module's rules, without Ansible: the order of the table matters (first match wins).
@pytest.fixture(scope="module")
def node_facts():
    path = ROLES / "preflight" / "library" / "nodecert_node_facts.py"
    spec = importlib.util.spec_from_file_location("nodecert_node_facts", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _gpus(device_id: str, count: int, architecture: str) -> list[dict]:
    return [{"device_id": device_id, "architecture": architecture}] * count


def test_rules_need_every_gpu_and_read_dmi(node_facts):
    rules = TABLES["_preflight_platforms"]
    mixed = _gpus("2901", 8, "Blackwell") + _gpus("2330", 1, "Hopper")
    assert node_facts.platform(rules, mixed, [], None)["name"] == "pcie"
    assert node_facts.platform(rules, [], [], None) == {"name": "none", "fabric": "none"}
    site = [{"name": "my-b200-box", "dmi": "^SYS-B200", "fabric": "nvlink5"}, *rules]
    one_b200 = _gpus("2901", 1, "Blackwell")
    assert node_facts.platform(site, one_b200, [], "SYS-B200-X\n")["name"] == "my-b200-box"
    assert node_facts.platform(site, one_b200, [], "Other")["name"] == "pcie"


def test_every_blackwell_profile_id_has_a_platform():
    """The device IDs of the b200/b300/gb200/gb300 profiles are the platform table's."""
    ids = {}
    for profile in ("b200", "b300", "gb200-nvl72", "gb300-nvl72"):
        data = yaml.safe_load((REPO / "checks" / "profiles" / f"{profile}.yaml").read_text())
        ids[profile] = {f"{i:04x}" for i in data["match"]["pci_device_ids"]}
    rules = {r["name"]: set(r.get("device_ids", [])) for r in TABLES["_preflight_platforms"]}
    assert rules["hgx-b200"] == ids["b200"]
    assert rules["hgx-b300"] == ids["b300"]
    assert rules["gb200-nvl72-tray"] == ids["gb200-nvl72"]
    assert rules["gb300-nvl72-tray"] == ids["gb300-nvl72"]


def test_platform_choices_match_the_table():
    spec = yaml.safe_load((ROLES / "preflight" / "meta" / "argument_specs.yml").read_text())
    choices = spec["argument_specs"]["main"]["options"]["preflight_platform"]["choices"]
    assert sorted(choices) == sorted(["auto"] + [r["name"] for r in TABLES["_preflight_platforms"]])
