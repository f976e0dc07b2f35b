"""The torch pin and the CUDA build of torch each node gets, written once.

The pytorch role pins pytorch_torch_version and, with pytorch_cuda_version "auto", picks the torch
build from PyTorch's release matrix (playbooks/roles/pytorch/vars/torch_releases.json): the newest
CUDA build the driver branch runs that carries every GPU of the node. These tests render the role's
own variables with Ansible's templating and its filter plugin, as a play does. `make verify`
(checks/devtools/torchbuild.py) makes the same choice from the same plugin and table for the host
it runs on; a test here holds the two to each other.
"""

from __future__ import annotations

import pytest
import yaml
from e2elib import roletemplate

from checks.devtools import torchbuild

pytestmark = pytest.mark.e2e

ROLES = roletemplate.ROLES
GENERIC_PROFILE = ROLES.parents[1] / "checks" / "profiles" / "generic.yaml"
MATRIX = torchbuild.plugin().release_matrix()

# The python3 of each release the playbooks provision or the node checks verify
# (shared/notes/releases.md: jammy 3.10, noble 3.12, resolute 3.14.3; Debian 12 ships 3.11).
RELEASE_PYTHON = {"ubuntu 22.04": "3.10", "ubuntu 24.04": "3.12", "ubuntu 26.04": "3.14", "debian 12": "3.11"}


@pytest.fixture(scope="module", autouse=True)
def role_filters() -> None:
    from ansible.plugins.loader import filter_loader

    filter_loader.add_directory(str(ROLES / "pytorch" / "filter_plugins"))


def cuda(gpus: list[str], branch: str | None = "580", machine: str = "x86_64", **variables) -> str:
    facts = {"nodecert_node": {"gpus": [{"architecture": a} for a in gpus]},
             "ansible_facts": {"architecture": machine}, **variables}
    if branch is not None:
        facts["nvidia_driver_branch"] = branch
    return roletemplate.render("_pytorch_cuda", "pytorch", **facts)


def test_every_release_the_node_checks_know_has_a_python_the_pin_has_wheels_for() -> None:
    pin = str(roletemplate.role_variables("pytorch")["pytorch_torch_version"])
    row = MATRIX["releases"][".".join(pin.split(".")[:2])]
    known = yaml.safe_load(GENERIC_PROFILE.read_text())["host"]["supported_os"]
    for os_id, versions in known.items():
        for version in versions:
            python = RELEASE_PYTHON[f"{os_id} {version}"]
            assert python in row["python"], f"torch {pin}: no wheel for {os_id} {version} ({python})"


def test_the_pin_has_a_build_for_the_default_driver_and_every_architecture_but_the_oldest() -> None:
    branch = roletemplate.render("nvidia_driver_branch", "nvidia_driver")
    for gpus in (["Volta"], ["Ampere"], ["Ada Lovelace"], ["Hopper"], ["Blackwell"]):
        assert cuda(gpus, branch=branch) in ("12.6", "13.0"), gpus


@pytest.mark.parametrize(
    ("gpus", "branch", "machine", "expected"),
    [
        (["Hopper"] * 8, "580", "x86_64", "13.0"),      # HGX H100/H200 on the default branch
        (["Blackwell"] * 8, "580", "x86_64", "13.0"),   # HGX B200/B300: 12.6 has no Blackwell
        (["Volta"] * 8, "580", "x86_64", "12.6"),       # V100: CUDA 13 dropped Volta
        (["Ampere", "Volta"], "580", "x86_64", "12.6"),  # mixed: the build that has both
        (["Hopper"], "570", "x86_64", "12.6"),          # a 570 driver runs CUDA 12 builds only
        (["Ampere"], "535", "x86_64", "12.6"),          # 12.6 on 535: minor version compatibility
        (["Grace Hopper"], "580", "aarch64", "13.0"),   # GH200
        (["Blackwell"] * 4, "580", "aarch64", "13.0"),  # GB200/GB300 trays
        (["Ada Lovelace"], "580", "x86_64", "13.0"),    # L4/L40S run the 8.6 kernels
        ([], "580", "x86_64", "13.0"),                  # a GPU-less image with the driver role
        ([], None, "x86_64", "13.0"),                   # a GPU-less image without it
    ],
)
def test_auto_picks_the_newest_build_the_driver_runs_with_every_gpu(gpus, branch, machine, expected) -> None:
    assert cuda(gpus, branch=branch, machine=machine) == expected


def test_the_default_index_is_the_chosen_build() -> None:
    facts = {"nodecert_node": {"gpus": [{"architecture": "Hopper"}]}, "nvidia_driver_branch": "580",
             "ansible_facts": {"architecture": "x86_64"}}
    assert roletemplate.render("pytorch_index_url", "pytorch", **facts) == "https://download.pytorch.org/whl/cu130"


def test_an_explicit_build_wins() -> None:
    assert cuda(["Hopper"], pytorch_cuda_version="12.6") == "12.6"


@pytest.mark.parametrize(
    ("gpus", "branch", "machine", "words"),
    [
        (["Blackwell"], "570", "x86_64",
         ["cu126 no Blackwell kernels on x86_64", "cu130 needs driver branch 580+"]),
        (["Kepler"], "580", "x86_64", ["no Kepler kernels"]),
        (["Volta"], "580", "aarch64", ["no Volta kernels on aarch64"]),
    ],
)
def test_no_build_for_the_node_is_one_error_naming_why(gpus, branch, machine, words) -> None:
    from ansible.errors import AnsibleError

    with pytest.raises(AnsibleError) as raised:
        cuda(gpus, branch=branch, machine=machine)
    message = str(raised.value)
    assert "has no CUDA build for this node" in message and "set pytorch_cuda_version" in message
    for word in words:
        assert word in message, message


def test_a_release_outside_the_table_says_so() -> None:
    from ansible.errors import AnsibleError

    with pytest.raises(AnsibleError, match="not in the pytorch role's release table"):
        cuda(["Hopper"], pytorch_torch_version="2.99.0")


def test_the_driver_minimums_are_the_node_checks_own() -> None:
    table = yaml.safe_load(GENERIC_PROFILE.read_text())["cuda"]["minor_compat_min_driver"]
    for major, branch in MATRIX["cuda_major_min_driver"].items():
        assert int(str(table[major]).split(".")[0]) == int(branch), major


def test_every_architecture_in_the_table_is_one_preflight_names() -> None:
    names = {a["name"] for a in roletemplate.role_variables("preflight")["_preflight_gpu_architectures"]}
    for release, row in MATRIX["releases"].items():
        for build in row["cuda"]:
            for machine in ("x86_64", "aarch64"):
                assert set(build[machine]) <= names, (release, build["cuda"], machine)




# The compute capability of a GPU of each architecture the table names (Grace Hopper's is Hopper's).
CAPABILITY = {"Maxwell": "5.2", "Pascal": "6.0", "Volta": "7.0", "Turing": "7.5", "Ampere": "8.0",
              "Ada Lovelace": "8.9", "Hopper": "9.0", "Grace Hopper": "9.0", "Blackwell": "10.0"}


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
@pytest.mark.parametrize("branch", ["535", "550", "570", "580", "590"])
def test_make_verify_chooses_the_build_the_role_chooses(branch: str, machine: str) -> None:
    """For every architecture the table names, driver branch and machine: the role's choice for a
    node and `make verify`'s for a host with that driver and GPU are the same build, or both none."""
    from ansible.errors import AnsibleError

    for architecture, capability in CAPABILITY.items():
        if architecture == "Grace Hopper" and machine != "aarch64":
            continue  # the Grace CPU is aarch64
        host = torchbuild.Host(machine, driver=f"{branch}.10.01", capabilities=(capability,))
        try:
            role = "cu" + cuda([architecture], branch=branch, machine=machine).replace(".", "")
        except AnsibleError:
            role = None
        try:
            ours: str | None = torchbuild.choose(host, "2.13.0").build
        except torchbuild.ChoiceError:
            ours = None
        assert ours == role, (architecture, branch, machine)
