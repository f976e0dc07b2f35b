"""The roles' package-name rules, evaluated by Ansible's own templating (e2elib.roletemplate) over
whole tables of real package names, and where a real consumer exists, by that consumer:
unattended-upgrades' own matching code reads the rendered blacklist through apt's config parser.

Fast (no root filesystem, no play): the e2e tests cover the same roles on real roots.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2elib import aptrepo, roletemplate

KERNEL = "6.8.0-90-generic"
NEXT_KERNEL = "6.8.0-94-generic"

# The CUDA toolkit's own versioned packages, as apt lists them when installing cuda-toolkit-12-x
# from NVIDIA's repository (an apt transcript of cuda-toolkit-12-5: libcublas-12-5 libcublas-dev-12-5
# libcufft-12-5 ... libnvfatbin-dev-12-5 libnvjitlink-12-5 libnvjpeg-dev-12-5; gds-tools-12-9 and
# nsight-compute/-systems come with cuda-toolkit too). Written for 12-8, the toolkit the roles pin.
CUDA_TOOLKIT_DEPENDENCIES = [
    f"lib{name}{dev}-12-8"
    for name in (
        "cublas",
        "cufft",
        "cufile",
        "curand",
        "cusolver",
        "cusparse",
        "npp",
        "nvfatbin",
        "nvjitlink",
        "nvjpeg",
    )
    for dev in ("", "-dev")
] + [
    "gds-tools-12-8",
    "nsight-compute-2025.1.1",
    "nsight-systems-2024.6.2",
    "cuda-keyring",
    "cuda-compat-12-8",
]

# Every NVIDIA/CUDA package the roles install or pull in, Canonical's and NVIDIA's names: the
# stand-in repository carries the names the roles ask for (driver branches 570/580/590, Fabric
# Manager, NSCQ, IMEX, NVLink5, toolkit, NCCL). Canonical's precompiled modules are not among them:
# they follow the kernel (see test_kernel_modules_follow_the_kernel_under_unattended_upgrades).
NVIDIA_PACKAGES = sorted(
    {
        package.name
        for package in aptrepo.stand_in_packages(KERNEL)
        if not package.name.startswith(("linux-headers-", "linux-modules-nvidia-"))
    }
    | set(CUDA_TOOLKIT_DEPENDENCIES)
    | {
        "libnvidia-nscq-580",
        "nvidia-fabricmanager-580",
        "nvidia-imex-580",
        "xserver-xorg-video-nvidia-535-server",
    }
)

# Packages whose names start like NVIDIA's and which get security updates of their own (noble's
# names): the blacklist must let them through.
OTHER_PACKAGES = [
    "curl",
    "libcurl4t64",
    "libcurl3t64-gnutls",
    "libcups2t64",
    "cups",
    "libcupsimage2t64",
    "libcue2",
    "libcunit1",
    "libcups2-dev",
    "libnpth0t64",
    "libnvme1t64",
    "libnss3",
    "cudf-tools",  # not a real noble package: a name merely starting with "cud"
    "nsight",  # likewise
    # The kernel and Canonical's NVIDIA modules for it move together (docs/provisioning.md).
    "linux-generic",
    "linux-image-virtual",
    f"linux-image-{NEXT_KERNEL}",
    "linux-modules-nvidia-580-server-open-generic",
    f"linux-modules-nvidia-580-server-open-{NEXT_KERNEL}",
]

# unattended-upgrades' own code: the Package-Blacklist as apt's config parser reads it, each name
# put through is_pkgname_in_blacklist from /usr/bin/unattended-upgrade (system Python, python3-apt).
MATCH_WITH_UNATTENDED_UPGRADES = r"""
import importlib.machinery, importlib.util, json, sys
import apt_pkg
loader = importlib.machinery.SourceFileLoader("uu", "/usr/bin/unattended-upgrade")
spec = importlib.util.spec_from_loader("uu", loader)
uu = importlib.util.module_from_spec(spec)
loader.exec_module(uu)
apt_pkg.init_config()
apt_pkg.read_config_file(apt_pkg.config, sys.argv[1])
blacklist = apt_pkg.config.value_list("Unattended-Upgrade::Package-Blacklist")
names = json.loads(sys.stdin.read())
blocked = [n for n in names if uu.is_pkgname_in_blacklist(n, blacklist)]
print(json.dumps({"blacklist": blacklist, "blocked": blocked}))
"""


@pytest.fixture(scope="module")
def blocked(tmp_path_factory) -> dict:
    if not Path("/usr/bin/unattended-upgrade").exists() or shutil.which("python3") is None:
        pytest.fail("unattended-upgrades is missing: apt-get install -y $(cat .ci/apt-packages.txt)")
    conf = tmp_path_factory.mktemp("uu") / "51nodecert-nvidia-blacklist"
    conf.write_text(
        roletemplate.render_file(
            roletemplate.ROLES / "nvidia_driver/templates/unattended-upgrades-nvidia.conf.j2", "nvidia_driver"
        )
    )
    proc = subprocess.run(
        ["/usr/bin/python3", "-c", MATCH_WITH_UNATTENDED_UPGRADES, str(conf)],
        input=json.dumps(NVIDIA_PACKAGES + OTHER_PACKAGES),
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
    )
    return json.loads(proc.stdout)


def test_the_rendered_file_carries_every_pattern(blocked):
    assert blocked["blacklist"] == roletemplate.render(
        "nvidia_driver_unattended_upgrades_blacklist", "nvidia_driver"
    )


@pytest.mark.parametrize("name", NVIDIA_PACKAGES)
def test_unattended_upgrades_keep_nvidia_and_cuda_packages(blocked, name):
    assert name in blocked["blocked"]


@pytest.mark.parametrize("name", OTHER_PACKAGES)
def test_unattended_upgrades_let_other_security_updates_through(blocked, name):
    assert name not in blocked["blocked"]


# --- Kernel updates: the kernel and Canonical's NVIDIA modules for it move together -------------

# Flavour meta packages of noble's archive (restricted, noble-updates): the kernel metas an image
# comes with and the NVIDIA modules metas Canonical builds for them ("Package:
# linux-modules-nvidia-580-server-open-aws-lts-24.04", "...-open-generic-hwe-24.04", "...-open-generic").
IMAGE_KERNEL_METAS = {
    # installed linux-image-* meta -> the NVIDIA modules meta that follows it
    "linux-image-virtual": "linux-modules-nvidia-580-server-open-generic",
    "linux-image-generic": "linux-modules-nvidia-580-server-open-generic",
    "linux-image-virtual-hwe-24.04": "linux-modules-nvidia-580-server-open-generic-hwe-24.04",
    "linux-image-aws-lts-24.04": "linux-modules-nvidia-580-server-open-aws-lts-24.04",
    "linux-image-gcp-lts-24.04": "linux-modules-nvidia-580-server-open-gcp-lts-24.04",
    "linux-image-azure": "linux-modules-nvidia-580-server-open-azure",
}
KERNEL_METAS = [
    "linux-generic",
    "linux-headers-generic",
    "linux-virtual",
    "linux-headers-virtual",
    *IMAGE_KERNEL_METAS,
]
MODULES_METAS = sorted(
    set(IMAGE_KERNEL_METAS.values()) | {"linux-modules-nvidia-580-server-open-generic-6.8"}
)
PER_KERNEL = [
    f"linux-{part}-{KERNEL}" for part in ("image", "image-unsigned", "headers", "modules", "modules-extra")
]
PER_KERNEL_MODULES = [
    f"linux-modules-nvidia-580-server-open-{KERNEL}",
    f"linux-objects-nvidia-580-server-{KERNEL}",
    # A kernel release without Ubuntu's ABI number (the e2e roots report the controller's kernel).
    "linux-modules-nvidia-580-server-open-6.18.44-fc-v1045",
]


def task_var(tasks_file: str, task_name: str, variable: str) -> str:
    """A set_fact expression exactly as a role's task file spells it."""
    import yaml

    tasks = yaml.safe_load((roletemplate.ROLES / tasks_file).read_text())
    (task,) = [t for t in tasks if t.get("name") == task_name]
    return task["ansible.builtin.set_fact"][variable]


def driver_facts(**extra) -> dict:
    return {
        "_nvidia_driver_kernel": KERNEL,
        "_nvidia_driver_kernel_flavours": ["generic", "aws-lts-24.04"],
        "_nvidia_driver_flavour": "open",
        **extra,
    }


def matching(regex_variable: str, names: list[str], **facts) -> list[str]:
    return roletemplate.render(
        f"names | select('match', {regex_variable}) | list",
        "nvidia_driver",
        names=names,
        **driver_facts(**facts),
    )


def test_every_image_kernel_meta_brings_its_modules_meta():
    expression = task_var(
        "nvidia_driver/tasks/kernel.yml",
        "Decide the kernel the modules are for",
        "_nvidia_driver_kernel_flavours",
    )
    for image_meta, modules_meta in IMAGE_KERNEL_METAS.items():
        metas = {
            "stdout_lines": [
                f"installed {image_meta}",
                f"installed linux-image-{KERNEL}",
                "installed linux-image-unsigned-6.8.0-90-generic",
            ]
        }
        flavours = roletemplate.render(
            expression.strip().removeprefix("{{").removesuffix("}}"),
            "nvidia_driver",
            _nvidia_driver_kernel_metas=metas,
        )
        candidates = roletemplate.render(
            "_nvidia_driver_meta_candidates",
            "nvidia_driver",
            **driver_facts(_nvidia_driver_kernel_flavours=flavours),
        )
        assert candidates == [modules_meta], image_meta


def test_neither_the_kernel_metas_nor_the_modules_metas_are_held():
    names = KERNEL_METAS + MODULES_METAS
    assert matching("_nvidia_driver_held_re", names) == []
    assert matching("_nvidia_driver_kernel_re", names) == []


def test_the_kernel_and_its_modules_are_held():
    assert matching("_nvidia_driver_kernel_re", PER_KERNEL + PER_KERNEL_MODULES) == PER_KERNEL
    assert matching("_nvidia_driver_held_re", PER_KERNEL + PER_KERNEL_MODULES) == PER_KERNEL_MODULES


def test_holds_earlier_runs_put_on_flavour_metas_are_lifted():
    # The image's flavours (driver_facts: generic and aws-lts-24.04, plus virtual): their kernel
    # metas; NVIDIA modules metas of any flavour and branch.
    installed = [name for name in KERNEL_METAS if "gcp" not in name and "azure" not in name]
    names = installed + MODULES_METAS + ["linux-modules-nvidia-535-server-generic"]
    assert matching("_nvidia_driver_flavour_meta_re", names) == names
    assert (
        matching(
            "_nvidia_driver_flavour_meta_re",
            PER_KERNEL + PER_KERNEL_MODULES + ["linux-firmware", "linux-base"],
        )
        == []
    )


@pytest.mark.parametrize("kernel", ["6.18.44-fc-v1045", "6.12.0", "6.1.0-28-cloud-amd64"])
def test_a_kernels_own_packages_are_never_its_flavour_metas(kernel):
    """A kernel built outside Ubuntu/Debian's <version>-<ABI>-<flavour> scheme (a cloud VM's own
    build, as the e2e roots report the controller's kernel) has no flavour: were its release taken
    for one, each run would hold its headers and the next lift that hold again."""
    own = [f"linux-{part}-{kernel}" for part in ("image", "headers", "modules")]
    facts = {"_nvidia_driver_kernel": kernel, "_nvidia_driver_kernel_flavours": []}
    assert matching("_nvidia_driver_kernel_re", own, **facts) == own
    assert matching("_nvidia_driver_flavour_meta_re", own, **facts) == []
    assert matching("_nvidia_driver_flavour_meta_re", ["linux-image-virtual"], **facts) == [
        "linux-image-virtual"]


@pytest.fixture(scope="module")
def kernel_guard(tmp_path_factory) -> Path:
    script = tmp_path_factory.mktemp("guard") / "nodecert-nvidia-kernel-guard"
    script.write_text(
        roletemplate.render_file(
            roletemplate.ROLES / "nvidia_driver/templates/nvidia-kernel-guard.sh.j2",
            "nvidia_driver",
            **driver_facts(),
        )
    )
    script.chmod(0o755)
    return script


def run_guard(script: Path, *debs: str) -> subprocess.CompletedProcess:
    # As apt runs a DPkg::Pre-Install-Pkgs hook (protocol version 1): one .deb path a line.
    lines = "".join(f"/var/cache/apt/archives/{deb}\n" for deb in debs)
    return subprocess.run(
        [str(script)], input=lines, capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"}
    )


def test_guard_lets_a_kernel_in_with_its_modules(kernel_guard):
    proc = run_guard(
        kernel_guard,
        f"linux-image-{NEXT_KERNEL}_6.8.0-94.96_amd64.deb",
        f"linux-modules-{NEXT_KERNEL}_6.8.0-94.96_amd64.deb",
        f"linux-modules-nvidia-580-server-open-{NEXT_KERNEL}_6.8.0-94.96_amd64.deb",
        "linux-modules-nvidia-580-server-open-generic_6.8.0-94.96_amd64.deb",
        "linux-generic_6.8.0-94.96_amd64.deb",
        "curl_8.5.0-2ubuntu10.7_amd64.deb",
    )
    assert (proc.returncode, proc.stderr) == (0, "")


def test_guard_refuses_a_kernel_without_its_modules_in_one_line(kernel_guard):
    # The modules meta kept back (its new modules need a newer driver than the held one).
    proc = run_guard(
        kernel_guard,
        f"linux-image-unsigned-{NEXT_KERNEL}_6.8.0-94.96_amd64.deb",
        f"linux-modules-{NEXT_KERNEL}_6.8.0-94.96_amd64.deb",
        "linux-generic_6.8.0-94.96_amd64.deb",
    )
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1
    assert (
        f"refusing kernel {NEXT_KERNEL}: apt brings no linux-modules-nvidia-580-server-open-{NEXT_KERNEL}"
        in proc.stderr
    )


def test_guard_lets_everything_else_through(kernel_guard):
    proc = run_guard(
        kernel_guard,
        "curl_8.5.0-2ubuntu10.7_amd64.deb",
        "linux-firmware_20240318.git3b128b60-0ubuntu2.5_amd64.deb",
    )
    assert (proc.returncode, proc.stderr) == (0, "")


@pytest.mark.parametrize("page", ["docs/provisioning.md", "docs/runbook.md"])
def test_pages_carry_no_merge_conflict_markers(page):
    text = (roletemplate.ROLES.parents[1] / page).read_text()
    assert not re.findall(r"^(<{7} |={7}$|>{7} )", text, re.M)


# --- Moving from Ubuntu's 535-server driver ---------------------------------------------------

# What `ubuntu-drivers install` (nvidia-driver-535-server) and Fabric Manager leave on a noble node,
# names from noble's restricted index (nvidia-driver-535-server 535.161.08-0ubuntu2 "Depends:
# libnvidia-gl-535-server, nvidia-dkms-535-server, nvidia-kernel-common-535-server,
# nvidia-kernel-source-535-server, libnvidia-compute-535-server, libnvidia-extra-535-server,
# nvidia-compute-utils-535-server, libnvidia-decode-535-server, libnvidia-encode-535-server,
# nvidia-utils-535-server, xserver-xorg-video-nvidia-535-server, libnvidia-cfg1-535-server,
# libnvidia-fbc1-535-server"; nvidia-firmware-535-server-535.161.08; the modules packages and their
# -generic meta package), plus multiverse's nvidia-fabricmanager-535 and libnvidia-nscq-535.
BRANCH_535_SERVER = [
    "nvidia-driver-535-server",
    "libnvidia-gl-535-server",
    "nvidia-dkms-535-server",
    "nvidia-kernel-common-535-server",
    "nvidia-kernel-source-535-server",
    "libnvidia-common-535-server",
    "libnvidia-compute-535-server",
    "libnvidia-extra-535-server",
    "nvidia-compute-utils-535-server",
    "libnvidia-decode-535-server",
    "libnvidia-encode-535-server",
    "nvidia-utils-535-server",
    "xserver-xorg-video-nvidia-535-server",
    "libnvidia-cfg1-535-server",
    "libnvidia-fbc1-535-server",
    "nvidia-firmware-535-server-535.161.08",
    "nvidia-headless-no-dkms-535-server",
    f"linux-modules-nvidia-535-server-{KERNEL}",
    f"linux-objects-nvidia-535-server-{KERNEL}",
    f"linux-signatures-nvidia-535-server-{KERNEL}",
    "linux-modules-nvidia-535-server-generic",
    "nvidia-fabricmanager-535",
    "libnvidia-nscq-535",
]
BRANCH_580_SERVER = [name.replace("535", "580") for name in BRANCH_535_SERVER] + ["nvidia-driver-pinning-580"]


def test_every_535_server_package_is_another_branch():
    assert matching("_nvidia_driver_other_branch_re", BRANCH_535_SERVER) == BRANCH_535_SERVER
    assert matching("_nvidia_driver_other_branch_re", BRANCH_580_SERVER) == []


def unknown_holds(selections: list[str]) -> list[str]:
    tasks = __import__("yaml").safe_load(
        (roletemplate.ROLES / "nvidia_driver/tasks/preflight.yml").read_text()
    )
    (task,) = [
        t for t in tasks if t.get("name") == "Check that every held NVIDIA package belongs to a driver branch"
    ]
    expression = task["vars"]["_nvidia_driver_unknown_holds"].strip().removeprefix("{{").removesuffix("}}")
    return roletemplate.render(
        expression,
        "nvidia_driver",
        _nvidia_driver_preflight_selections={"stdout_lines": selections},
        **driver_facts(),
    )


def test_a_535_server_node_with_the_admins_holds_passes_the_check():
    selections = [f"hold {name}" for name in BRANCH_535_SERVER] + [
        "install curl",
        "hold nvidia-fabricmanager",
        "hold linux-image-virtual",
    ]
    assert unknown_holds(selections) == []


def test_a_held_branch_package_of_an_unknown_name_stops_before_any_change():
    # A made-up name of another branch that no pattern knows (as xserver-xorg-video-nvidia-535-server
    # was before): named in preflight, not left to apt's "held packages" halfway through the run.
    held = ["hold vendor-tools-nvidia-535-server", "hold nvidia-utils-535-server"]
    assert unknown_holds(held) == ["vendor-tools-nvidia-535-server"]


# --- Check mode on a fresh Ubuntu 24.04 node: NCCL ----------------------------------------------

# `apt-cache madison libnccl2` lines: noble's own build (multiverse, "Package: libnccl2 / Version:
# 2.18.5-1-2 / Source: nvidia-nccl") and NVIDIA's, which carry +cuda<release>.
NOBLE_NCCL = "  libnccl2 | 2.18.5-1-2 | http://archive.ubuntu.com/ubuntu noble/multiverse amd64 Packages"
NVIDIA_NCCL = ("  libnccl2 | 2.26.2-1+cuda12.8 | "
               "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/x86_64  Packages")


def nccl_pending(check_mode: bool, madison: list[str]) -> bool:
    tasks = __import__("yaml").safe_load((roletemplate.ROLES / "nccl/tasks/preflight.yml").read_text())
    (task,) = [t for t in tasks if t.get("name") == "Note whether check mode can see NCCL"]
    expression = (
        task["ansible.builtin.set_fact"]["_nccl_pending"].strip().removeprefix("{{").removesuffix("}}")
    )
    return roletemplate.render(
        expression,
        "nccl",
        ansible_check_mode=check_mode,
        _nccl_madison={"stdout": "\n".join(madison), "stdout_lines": madison},
    )


@pytest.mark.parametrize(
    ("check_mode", "madison", "pending"),
    [
        (True, [NOBLE_NCCL], True),  # fresh noble node: only Ubuntu's libnccl2, the CUDA repo comes later
        (True, [], True),  # fresh Debian node
        (True, [NVIDIA_NCCL, NOBLE_NCCL], False),  # the CUDA repository is there: the pin is checked
        (False, [NOBLE_NCCL], False),  # a real run always checks
    ],
)
def test_check_mode_waits_for_nvidias_nccl_only_while_apt_has_none(check_mode, madison, pending):
    assert nccl_pending(check_mode, madison) is pending


# --- Where the modules come from, decided before any change -------------------------------------


def policy(*offered: str, listed: tuple[str, ...] = ()) -> str:
    """`apt-cache policy` output: each offered package with a candidate, each listed one without."""
    out = [
        f"{name}:\n  Installed: (none)\n  Candidate: 580.95.05-0ubuntu1\n  Version table:" for name in offered
    ]
    out += [f"{name}:\n  Installed: (none)\n  Candidate: (none)\n  Version table:" for name in listed]
    return "\n".join(out) + "\n"


HEADLESS = "nvidia-headless-no-dkms-580-server-open"
PRECOMPILED = f"linux-modules-nvidia-580-server-open-{KERNEL}"


def early_source(stdout: str, **settings) -> str:
    tasks = __import__("yaml").safe_load((roletemplate.ROLES / "nvidia_driver/tasks/source.yml").read_text())
    tasks = [t for task in tasks for t in [task, *task.get("block", [])]]  # source.yml's block too
    (task,) = [t for t in tasks if t.get("name") == "Decide early where the kernel modules come from"]
    expression = (
        task["ansible.builtin.set_fact"]["_nvidia_driver_early_source"]
        .strip()
        .removeprefix("{{")
        .removesuffix("}}")
    )
    from ansible.template import trust_as_template

    task_vars = {name: trust_as_template(value) for name, value in task["vars"].items()}
    return roletemplate.render(
        expression,
        "nvidia_driver",
        _nvidia_driver_early_policy={"stdout": stdout},
        **task_vars,
        **driver_facts(**settings),
    )


@pytest.mark.parametrize(
    ("stdout", "settings", "source"),
    [
        (policy(HEADLESS, PRECOMPILED), {}, "precompiled"),
        (policy(HEADLESS), {}, "dkms"),  # auto: Ubuntu's archive has no modules for this kernel
        (policy(HEADLESS), {"nvidia_driver_module_source": "precompiled"}, "missing"),
        (policy(HEADLESS, PRECOMPILED), {"nvidia_driver_module_source": "dkms"}, "dkms"),
        ("", {"nvidia_driver_repository": "nvidia"}, "dkms"),
        # The driver comes from a repository this play has not added yet: decided later.
        (policy(listed=(HEADLESS, PRECOMPILED)), {}, "unknown"),
        ("", {}, "unknown"),
    ],
)
def test_the_module_source_is_decided_before_any_change_where_apt_knows(stdout, settings, source):
    assert early_source(stdout, **settings) == source


# --- A malformed inventory --------------------------------------------------------------------


def test_a_malformed_inventory_is_reported_with_its_parse_error(tmp_path):
    """As `make provision` runs it (from the repository, with its ansible.cfg): the parse error
    itself, not "defines no hosts in the group gpu_nodes"."""
    inventory = tmp_path / "inventory"
    inventory.write_text("[gpu_nodes\nnode1 ansible_host=10.0.0.1\n")
    repo = roletemplate.ROLES.parents[1]
    proc = subprocess.run(
        [
            str(repo / ".venv/bin/ansible-playbook"),
            "-i",
            str(inventory),
            "playbooks/provision.yml",
            "--list-hosts",
        ],
        cwd=repo,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8"},
    )
    assert proc.returncode != 0
    assert "Failed to parse inventory with 'ini' plugin" in proc.stdout + proc.stderr
    assert "Completely failed to parse inventory source" in proc.stdout + proc.stderr
    assert "defines no hosts" not in proc.stdout + proc.stderr


# --- nvidia module options --------------------------------------------------------------------

# Azure's HPC images let users profile: NVreg_RestrictProfilingToAdminUsers=0.
PARAMS = {"NVreg_RestrictProfilingToAdminUsers": 0, "NVreg_EnableStreamMemOPs": 1}


def test_module_options_as_modprobe_reads_them(tmp_path):
    conf = tmp_path / "modprobe.d" / "nodecert-nvidia-options.conf"
    conf.parent.mkdir()
    conf.write_text(
        roletemplate.render_file(
            roletemplate.ROLES / "nvidia_driver/templates/nvidia-options.conf.j2",
            "nvidia_driver",
            nvidia_driver_module_params=PARAMS,
        )
    )
    # kmod's own parser over that directory alone.
    shown = subprocess.run(
        ["modprobe", "--config", str(conf.parent), "--showconfig"], capture_output=True, text=True, check=True
    ).stdout
    assert (
        "options nvidia NVreg_EnableStreamMemOPs=1 NVreg_RestrictProfilingToAdminUsers=0"
        in shown.splitlines()
    )


def bad_params(params) -> list[str]:
    tasks = __import__("yaml").safe_load(
        (roletemplate.ROLES / "nvidia_driver/tasks/preflight.yml").read_text()
    )
    (task,) = [t for t in tasks if t.get("name") == "Check the nvidia module options"]
    return roletemplate.render(
        "_nvidia_driver_bad_params",
        "nvidia_driver",
        nvidia_driver_module_params=params,
        _nvidia_driver_bad_params=__import__(
            "ansible.template", fromlist=["trust_as_template"]
        ).trust_as_template(task["vars"]["_nvidia_driver_bad_params"]),
    )


@pytest.mark.parametrize(
    ("params", "bad"),
    [
        (PARAMS, []),
        ({}, []),
        ({"RestrictProfiling": 0}, ["RestrictProfiling=0"]),
        ({"NVreg_RegistryDwords": "a=1 b=2"}, ["NVreg_RegistryDwords=a=1 b=2"]),
        ({"NVreg_X": ""}, ["NVreg_X="]),
        ("NVreg_RestrictProfilingToAdminUsers=0", ["NVreg_RestrictProfilingToAdminUsers=0"]),
    ],
)
def test_module_options_are_checked_before_any_change(params, bad):
    assert bad_params(params) == bad


# --- NVIDIA's repository from branch 590: names without the branch ---------------------------

UNBRANCHED_590 = ["nvidia-utils", "libnvidia-compute", "nvidia-kernel-common", "nvidia-compute-utils",
                  "nvidia-headless-no-dkms-open", "nvidia-dkms-open", "nvidia-headless-open"]


def _driver_packages(repository: str, branch: str) -> list[str]:
    return roletemplate.render(
        "_nvidia_driver_packages", "nvidia_driver", **driver_facts(
            nvidia_driver_repository=repository, nvidia_driver_branch=branch, _nvidia_driver_source="dkms"))


def test_nvidias_590_and_later_are_installed_under_their_unbranched_names():
    """NVIDIA Driver Installation Guide r590, "Ubuntu 590 package renames": the branch leaves the
    names (libnvidia-compute-580 -> libnvidia-compute); the pinning package keeps it."""
    headers = f"linux-headers-{KERNEL}"
    assert _driver_packages("nvidia", "590") == ["nvidia-utils", "nvidia-headless-open", headers,
                                                 "nvidia-driver-pinning-590"]
    assert _driver_packages("nvidia", "580") == ["nvidia-utils-580", "nvidia-headless-580-open", headers,
                                                 "nvidia-driver-pinning-580"]
    # Canonical's archive keeps the branch in its names.
    assert _driver_packages("ubuntu", "590")[:2] == ["nvidia-utils-590-server",
                                                     "nvidia-headless-590-server-open"]
    others = ["nvidia-utils-580", "nvidia-fabricmanager", "libnvidia-nscq", "nvidia-driver-pinning-590",
              "libnvidia-compute-580"]
    assert matching("_nvidia_driver_unbranched_re", [*UNBRANCHED_590, *others]) == UNBRANCHED_590


def _other_branches(branch: str, installed: dict[str, str]) -> list[str]:
    expression = task_var("nvidia_driver/tasks/install.yml", "Find driver packages of other branches",
                          "_nvidia_driver_other_branches")
    packages = {name: [{"version": version}] for name, version in installed.items()}
    return roletemplate.render(
        expression.strip().removeprefix("{{").removesuffix("}}"), "nvidia_driver",
        **driver_facts(nvidia_driver_branch=branch, nvidia_driver_repository="nvidia",
                       ansible_facts={"packages": packages}))


def test_an_unbranched_package_of_another_branch_is_told_by_its_version():
    on_590 = dict.fromkeys(UNBRANCHED_590, "590.48.01-0ubuntu1") | {
        "nvidia-driver-pinning-590": "590-1ubuntu1", "nvidia-fabricmanager": "590.48.01-1", "curl": "8.5.0"}
    assert _other_branches("570", on_590) == sorted([*UNBRANCHED_590, "nvidia-driver-pinning-590"])
    assert _other_branches("590", on_590) == []
    on_580 = {"nvidia-utils-580": "580.126.09-0ubuntu1", "libnvidia-compute-580": "580.126.09-0ubuntu1",
              "nvidia-driver-pinning-580": "580-1ubuntu1"}
    assert _other_branches("590", on_580) == sorted(on_580)


# --- regular expressions in Jinja ------------------------------------------------------------

def test_no_regex_in_the_playbooks_doubles_its_backslashes():
    """ansible-core 2.19 keeps a Jinja string literal's backslashes as written: '\\\\.' in a folded
    block is two backslashes and a dot, a regex that matches no version or file name (it left
    vmlinuz-*.old among the kernels and NVreg values with spaces through). Regexes here use one
    backslash or a class ([.], [|])."""
    doubled = [f"{path.relative_to(roletemplate.ROLES.parent)}:{n}"
               for path in sorted(roletemplate.ROLES.parent.rglob("*.yml"))
               for n, line in enumerate(path.read_text().splitlines(), 1)
               if "\\\\" in line and not line.lstrip().startswith("#")]
    assert doubled == []


def test_the_kernels_found_in_boot_leave_out_old_and_signed_copies():
    import yaml

    tasks = yaml.safe_load((roletemplate.ROLES / "nvidia_driver/tasks/kernel.yml").read_text())
    (task,) = [t for t in tasks if t.get("name") == "Decide the kernel the modules are for"]
    expression = task["vars"]["_nvidia_driver_installed_kernels"]
    files = [{"path": f"/boot/vmlinuz-{k}"} for k in (KERNEL, f"{KERNEL}.old", f"{NEXT_KERNEL}.efi.signed")]
    kernels = roletemplate.render(expression.strip().removeprefix("{{").removesuffix("}}"), "nvidia_driver",
                                  _nvidia_driver_boot_kernels={"files": files})
    assert kernels == [KERNEL]


# --- Supported operating systems -------------------------------------------------------------------

GENERIC_PROFILE = roletemplate.ROLES.parents[1] / "checks/profiles/generic.yaml"
PROVISIONED = {"Ubuntu": ["22.04", "24.04", "26.04"], "Debian": ["12"]}


def os_supported(distribution: str, version: str, **overrides) -> tuple[bool, str]:
    """The preflight OS assertion as the play evaluates it: (passes, its message on one line)."""
    tasks = __import__("yaml").safe_load((roletemplate.ROLES / "preflight/tasks/preflight.yml").read_text())
    (task,) = [t for t in tasks if t.get("name") == "Check that the operating system is supported"]
    facts = {
        "ansible_facts": {
            "distribution": distribution,
            "distribution_version": version,
            "distribution_major_version": version.split(".")[0],
        },
        "inventory_hostname": "node1",
        **overrides,
    }
    versions = task["vars"]["_preflight_versions"]
    facts["_preflight_versions"] = roletemplate.render_text(versions, "preflight", **facts)
    passes = roletemplate.render(task["ansible.builtin.assert"]["that"], "preflight", **facts)
    message = roletemplate.render_text(task["ansible.builtin.assert"]["fail_msg"], "preflight", **facts)
    return bool(passes), " ".join(message.split())


def test_the_playbooks_provision_ubuntu_lts_in_standard_support_and_debian_12_only():
    assert roletemplate.render("preflight_supported_distributions", "preflight") == PROVISIONED


def test_every_provisioned_release_is_one_the_node_checks_know():
    """The node checks (host.supported_os) verify a wider list than the playbooks provision (20.04
    nodes are verified, not provisioned); never a narrower one."""
    known = __import__("yaml").safe_load(GENERIC_PROFILE.read_text())["host"]["supported_os"]
    for name, versions in PROVISIONED.items():
        assert set(versions) <= set(known[name.lower()]), name


@pytest.mark.parametrize(
    ("distribution", "version", "supported"),
    [("Ubuntu", "24.04", True), ("Debian", "12.11", True), ("Ubuntu", "22.04", True),
     ("Ubuntu", "26.04", True), ("Ubuntu", "20.04", False), ("Ubuntu", "25.10", False),
     ("Rocky", "9.4", False)],
)
def test_the_os_check_follows_the_list(distribution, version, supported):
    passes, message = os_supported(distribution, version)
    assert passes is supported
    listed = "these roles support Ubuntu 22.04/24.04/26.04, Debian 12."
    assert message.startswith(f"node1 runs {distribution} {version}; {listed}")


def test_ubuntu_2004_is_refused_with_the_reason_and_the_way_out():
    _, message = os_supported("Ubuntu", "20.04")
    assert "python3 is 3.8" in message and "Upgrade to 22.04" in message
    assert "python3" not in os_supported("Ubuntu", "25.10")[1]


def test_an_operator_may_add_a_release_at_their_own_risk():
    override = {"preflight_supported_distributions": {"Ubuntu": ["24.04", "25.10"], "Debian": [12]}}
    assert os_supported("Ubuntu", "25.10", **override)[0]
    assert not os_supported("Ubuntu", "22.04", **override)[0]
    assert os_supported("Debian", "12.11", **override)[0]
    assert not os_supported("Debian", "11.9", **override)[0]


def test_every_roles_galaxy_platforms_are_the_provisioned_releases():
    """Galaxy metadata must be literal: it is held to the preflight list instead."""
    yaml = __import__("yaml")
    codenames = {("Ubuntu", "22.04"): "jammy", ("Ubuntu", "24.04"): "noble", ("Ubuntu", "26.04"): "resolute",
                 ("Debian", "12"): "bookworm"}
    wanted = {name: sorted(codenames[(name, v)] for v in versions) for name, versions in PROVISIONED.items()}
    for meta in sorted(roletemplate.ROLES.glob("*/meta/main.yml")):
        platforms = yaml.safe_load(meta.read_text())["galaxy_info"]["platforms"]
        assert {p["name"]: sorted(p["versions"]) for p in platforms} == wanted, meta


def test_no_role_repeats_another_roles_pin_as_a_fallback():
    """The driver branch and the CUDA release are set by their own roles only; the roles that follow
    them name the variable, never a copy of its value."""
    roles = roletemplate.ROLES
    files = [*roles.glob("*/defaults/main.yml"), *roles.glob("*/meta/argument_specs.yml")]
    fallback = re.compile(r"(nvidia_driver_branch|cuda_toolkit_version) \| default\(")
    for path in sorted(files):
        assert not fallback.search(path.read_text()), path


# --- Check mode: apt's own simulation without its planner log -------------------------------------


def test_no_apt_install_runs_in_check_mode():
    """apt writes /var/log/apt/eipp.log.xz even when the apt module simulates, so every apt task
    that installs or removes packages is for real runs only; check mode includes the preflight
    role's apt_simulate.yml with the same request (a YAML alias of the real task's list)."""
    from checks.docgen.roles import tasks_of

    found = 0
    for path in sorted(roletemplate.ROLES.glob("*/tasks/*.yml")):
        text = path.read_text()
        for task in tasks_of(path):
            apt = task.get("ansible.builtin.apt")
            if not isinstance(apt, dict) or "name" not in apt:
                continue  # update_cache only
            found += 1
            assert "not ansible_check_mode" in str(task.get("when", "")), f"{path}: {task['name']}"
        for alias in re.findall(r"_preflight_apt_packages: \[?\*([a-z0-9_]+)", text):
            assert f"&{alias} " in text or f"&{alias}\n" in text, f"{path}: *{alias}"
    assert found >= 12


def test_the_simulation_switches_the_planner_log_off():
    yaml = __import__("yaml")
    tasks = yaml.safe_load((roletemplate.ROLES / "preflight/tasks/apt_simulate.yml").read_text())
    argv = roletemplate.render_text(
        tasks[0]["ansible.builtin.command"]["argv"],
        "preflight",
        _preflight_apt_packages=["libnccl2=2.26.2-1+cuda12.8"],
        _preflight_apt_flags=["--allow-downgrades"],
    )
    assert argv[:5] == ["apt-get", "--simulate", "--no-install-recommends", "-o", "Dir::Log::Planner="]
    assert argv[5:] == ["install", "--allow-downgrades", "libnccl2=2.26.2-1+cuda12.8"]
    purge = roletemplate.render_text(
        tasks[0]["ansible.builtin.command"]["argv"], "preflight",
        _preflight_apt_packages=["nvidia-utils-535-server"], _preflight_apt_purge=True,
    )
    assert purge[5:] == ["remove", "--purge", "nvidia-utils-535-server"]
    assert tasks[0]["check_mode"] is False


# --- Holds: one module sets dpkg selections -------------------------------------------------------

# dpkg --set-selections gives up at once when another apt/dpkg run holds dpkg's lock; preflight's
# nodecert_dpkg_selections waits for it (tests/e2e/test_e2e_dpkg_lock.py). Any other way of setting
# a selection would bring the unwaited lock back.
SELECTION_MODULES = {"ansible.builtin.dpkg_selections", "ansible.legacy.dpkg_selections", "dpkg_selections"}
COMMAND_MODULES = {
    f"{prefix}{name}" for prefix in ("", "ansible.builtin.", "ansible.legacy.")
    for name in ("command", "shell", "raw", "script")
}
# Over the task's arguments as JSON: an argv list's words are separated by '", "'.
SETS_A_SELECTION = re.compile(r'apt-mark[\s",]+(un)?hold|--set-selections')


def selection_offenders(items, where: str = "") -> list[str]:
    """Tasks (also in blocks, plays and handlers) that set a dpkg selection other than through
    nodecert_dpkg_selections."""
    found = []
    for item in items or []:
        if not isinstance(item, dict):
            continue
        name = f"{where}{item.get('name', '?')}"
        if SELECTION_MODULES & set(item):
            found.append(name)
        if any(SETS_A_SELECTION.search(json.dumps(item[key])) for key in COMMAND_MODULES & set(item)):
            found.append(name)
        for key in ("block", "rescue", "always", "tasks", "pre_tasks", "post_tasks", "handlers"):
            found += selection_offenders(item.get(key), f"{name} > ")
    return found


@pytest.mark.parametrize(
    ("task", "offends"),
    [
        ({"name": "a", "nodecert_dpkg_selections": {"name": ["x"], "selection": "hold"}}, False),
        ({"name": "a", "ansible.builtin.dpkg_selections": {"name": "x", "selection": "hold"}}, True),
        ({"name": "a", "dpkg_selections": {"name": "x", "selection": "install"}}, True),
        ({"name": "a", "ansible.builtin.command": {"argv": ["apt-mark", "hold", "x"]}}, True),
        ({"name": "a", "ansible.builtin.shell": "echo x hold | dpkg --set-selections"}, True),
        ({"name": "a", "ansible.builtin.command": {"argv": ["dpkg", "--get-selections"]}}, False),
        ({"name": "p", "hosts": "all", "tasks": [{"name": "b", "block": [
            {"name": "c", "ansible.builtin.command": "apt-mark unhold x"}]}]}, True),
    ],
)
def test_the_selection_rule_tells_the_ways_apart(task, offends):
    assert bool(selection_offenders([task])) is offends


def test_no_task_sets_a_selection_outside_the_shared_module():
    yaml = __import__("yaml")
    playbooks = roletemplate.ROLES.parent
    offenders, shared = [], 0
    for path in sorted(playbooks.rglob("*.yml")):
        loaded = yaml.safe_load(path.read_text())
        if isinstance(loaded, list):
            offenders += selection_offenders(loaded, f"{path.relative_to(playbooks)}: ")
            shared += path.read_text().count("nodecert_dpkg_selections:")
    assert offenders == []
    assert shared >= 11  # the module is in use: the rule did read the roles' tasks


# --- Moving off Canonical's desktop build; kernels the modules are no longer for -----------------

# Canonical's desktop build of branch 580 (noble-updates restricted, 580.196.07-0ubuntu0.24.04.1:
# nvidia-driver-580 "Depends: libnvidia-gl-580, nvidia-dkms-580, nvidia-kernel-common-580,
# xserver-xorg-video-nvidia-580, ..."; nvidia-kernel-common-580 ships the conffile
# /etc/modprobe.d/nvidia-graphics-drivers-kms.conf, nvidia-kernel-common-580-server none).
DESKTOP_580 = [
    "nvidia-driver-580", "nvidia-driver-580-open", "nvidia-headless-580", "nvidia-headless-no-dkms-580",
    "nvidia-dkms-580", "nvidia-dkms-580-open", "nvidia-kernel-common-580", "nvidia-kernel-source-580",
    "nvidia-kernel-source-580-open", "nvidia-utils-580", "nvidia-compute-utils-580",
    "libnvidia-gl-580", "libnvidia-common-580", "libnvidia-compute-580", "libnvidia-extra-580",
    "libnvidia-decode-580", "libnvidia-encode-580", "libnvidia-cfg1-580", "libnvidia-fbc1-580",
    "nvidia-firmware-580-580.196.07", "xserver-xorg-video-nvidia-580",
    f"linux-modules-nvidia-580-{KERNEL}", f"linux-modules-nvidia-580-open-{KERNEL}",
    f"linux-objects-nvidia-580-{KERNEL}", f"linux-signatures-nvidia-580-{KERNEL}",
    "linux-modules-nvidia-580-generic", "linux-modules-nvidia-580-open-generic",
]


def test_the_desktop_build_of_the_branch_is_told_from_the_server_build():
    assert matching("_nvidia_driver_desktop_re", DESKTOP_580) == DESKTOP_580
    # The server build, Fabric Manager, NSCQ, IMEX and NVIDIA's pinning package are never desktop.
    assert matching("_nvidia_driver_desktop_re", [*BRANCH_580_SERVER, "nvidia-imex-580"]) == []
    # Another branch's desktop build was already another branch.
    desktop_535 = [name.replace("580", "535") for name in DESKTOP_580]
    assert matching("_nvidia_driver_other_branch_re", desktop_535) == desktop_535


def test_the_desktop_build_is_replaced_only_from_ubuntus_archive():
    # install.yml and source.yml (before any change) read the same variable.
    for tasks_file, task in (("install.yml", "Find driver packages of other branches"),
                             ("source.yml", "Find driver packages of other branches before any change")):
        tasks = yaml.safe_load((roletemplate.ROLES / "nvidia_driver/tasks" / tasks_file).read_text())
        found = [t for t in tasks if t.get("name") == task]
        found += [b for t in tasks for b in t.get("block", []) if b.get("name") == task]
        (only,) = found
        assert only["ansible.builtin.set_fact"] == {
            "_nvidia_driver_other_branches": "{{ _nvidia_driver_installed_other_branches }}"}, tasks_file
    installed = {name: [{"version": "580.196.07-0ubuntu0.24.04.1"}] for name in ["nvidia-driver-580", "curl"]}
    for repository, replaced in (("ubuntu", ["nvidia-driver-580"]), ("nvidia", [])):
        assert roletemplate.render(
            "_nvidia_driver_installed_other_branches", "nvidia_driver", nvidia_driver_repository=repository,
            ansible_facts={"packages": installed}, **driver_facts(),
        ) == replaced


def test_the_move_names_what_it_replaces_for_removal_in_the_same_request():
    """From Ubuntu's archive, the packages of another branch or of the desktop build are named for
    removal ("name-") in the install's own apt request and in the fetches before any change; never
    NVIDIA's unbranched names (installed again under the same name), never from NVIDIA's
    repository (its install is the apt module's)."""
    others = ["nvidia-driver-580-open", "nvidia-kernel-source-580-open", "nvidia-utils-535-server",
              "libnvidia-compute", "nvidia-driver"]
    for repository, removals in (
        ("ubuntu", ["nvidia-driver-580-open-", "nvidia-kernel-source-580-open-", "nvidia-utils-535-server-"]),
        ("nvidia", []),
    ):
        assert roletemplate.render(
            "_nvidia_driver_move_removals", "nvidia_driver", nvidia_driver_repository=repository,
            _nvidia_driver_other_branches=others, **driver_facts(),
        ) == removals, repository
    pins = ["nvidia-utils-580-server=1", "libnvidia-compute-580-server=1"]
    pinned = roletemplate.render("_nvidia_driver_install_request", "nvidia_driver", _nvidia_driver_pins=pins,
                                 _nvidia_driver_packages=["nvidia-utils-580-server", "m"], **driver_facts())
    assert pinned == ["m", "nvidia-utils-580-server=1", "libnvidia-compute-580-server=1"]
    nothing_else = roletemplate.render(
        "_nvidia_driver_move_removals", "nvidia_driver", nvidia_driver_repository="ubuntu", **driver_facts())
    assert nothing_else == []
    tasks = {t["name"]: t for t in yaml.safe_load(
        (roletemplate.ROLES / "nvidia_driver/tasks/install.yml").read_text())}
    move = tasks["Install the NVIDIA driver packages in place of the other driver packages"]
    request = move["vars"]["_nvidia_driver_move_request"]
    assert "_nvidia_driver_move_removals" in request
    assert "'--purge'" in move["ansible.builtin.command"]["argv"]
    assert move["notify"] == "Rebuild the initramfs"
    assert "_nvidia_driver_move_removals | length == 0" in tasks["Install the NVIDIA driver packages"]["when"]
    simulated = tasks["Install the NVIDIA driver packages, simulated in check mode"]["vars"]
    assert simulated["_preflight_apt_packages"] == request
    for tasks_file in ("served_try.yml", "fetchable.yml"):
        text = (roletemplate.ROLES / "nvidia_driver/tasks" / tasks_file).read_text()
        assert "+ _nvidia_driver_move_removals" in text, tasks_file


OLD_KERNEL = "6.8.0-88-generic"
STALE = [
    *(f"linux-{part}-{OLD_KERNEL}"
      for part in ("image", "image-unsigned", "headers", "modules", "modules-extra")),
    "linux-headers-6.8.0-88",
    f"linux-modules-nvidia-580-server-open-{OLD_KERNEL}",
    f"linux-objects-nvidia-580-server-{OLD_KERNEL}",
    f"linux-signatures-nvidia-535-server-{OLD_KERNEL}",
    "linux-image-6.18.44-fc-v1000",
]


@pytest.mark.parametrize("running", ["6.8.0-85-generic", "6.18.44-fc-v1045", KERNEL])
def test_holds_on_kernels_the_modules_are_no_longer_for_are_lifted(running):
    in_use = [
        *PER_KERNEL, *PER_KERNEL_MODULES[:2], f"linux-headers-{KERNEL.rsplit('-', 1)[0]}",
        f"linux-image-{KERNEL.replace('generic', 'lowlatency')}",  # the same ABI, another flavour
        f"linux-image-{running}", f"linux-modules-nvidia-580-server-open-{running}",
    ]
    metas = KERNEL_METAS + MODULES_METAS + ["linux-firmware", "linux-base"]
    facts = {"ansible_facts": {"kernel": running}}
    assert matching("_nvidia_driver_stale_kernel_re", STALE + in_use + metas, **facts) == STALE
    # The hold task leaves them out, so that a rerun does not hold what it lifted.
    assert matching("_nvidia_driver_stale_kernel_re", PER_KERNEL_MODULES, **facts) == (
        [] if running == "6.18.44-fc-v1045" else ["linux-modules-nvidia-580-server-open-6.18.44-fc-v1045"]
    )
