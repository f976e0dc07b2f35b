"""`make torch-build` and `make verify` choose the torch build this host runs, as the pytorch role
chooses it for a node it provisions (checks/devtools/torchbuild.py).

The hardware is stood in for at its boundary: a sysfs root holding module/nvidia/version
(NODECERT_SYSFS), an nvidia-smi that prints driver versions and compute capabilities
(NODECERT_NVIDIA_SMI), the machine (NODECERT_MACHINE). `make torch-build` runs in this checkout
(it installs nothing). `make verify` runs in a copy of the files it uses, whose .venv interpreter
records each call and plays pip (a CUDA build cannot be downloaded here); the CPU build is
installed for real, from what this machine's pip finds.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from checks.devtools import torchbuild

# --import-mode=importlib puts no test directory on sys.path
sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_env import user_env

ROOT = Path(__file__).resolve().parents[2]
INDEX = "https://download.pytorch.org/whl"


@dataclass(frozen=True)
class Host:
    """A stand-in machine: the driver sysfs reports (None: not loaded), what nvidia-smi prints
    (None: no nvidia-smi), its exit status, the machine."""

    sysfs_driver: str | None = None
    smi: str | None = None
    smi_rc: int = 0
    machine: str = "x86_64"

    def env(self, tmp: Path) -> dict[str, str]:
        tmp.mkdir(parents=True, exist_ok=True)
        sysfs = tmp / "sys"
        if self.sysfs_driver is not None:
            (sysfs / "module" / "nvidia").mkdir(parents=True, exist_ok=True)
            (sysfs / "module" / "nvidia" / "version").write_text(self.sysfs_driver + "\n")
        smi = tmp / "nvidia-smi"
        if self.smi is not None:
            smi.write_text(f"#!/bin/sh\ncat <<'EOF'\n{self.smi}\nEOF\nexit {self.smi_rc}\n")
            smi.chmod(0o755)
        # As a user's shell has it: not what an enclosing `make test` exported to its recipes
        # (VENV among them, which would make VENV's origin "environment": not the default).
        return {**user_env(), "NODECERT_SYSFS": str(sysfs), "NODECERT_NVIDIA_SMI": str(smi),
                "NODECERT_MACHINE": self.machine, "PROVISIONED_VENV": str(tmp / "no-provisioned-venv")}


def gpus(driver: str, capability: str, count: int = 8) -> str:
    return "\n".join([f"{driver}, {capability}"] * count)


# name: (host, build chosen)
CHOICES = {
    "no-driver": (Host(), "cpu"),
    "nvidia-smi-without-a-driver": (
        Host(smi="NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
             smi_rc=9), "cpu"),
    "535-ampere": (Host("535.183.01", gpus("535.183.01", "8.0")), "cu126"),
    "550-hopper": (Host("550.54.15", gpus("550.54.15", "9.0")), "cu126"),
    "570-hopper": (Host("570.172.08", gpus("570.172.08", "9.0")), "cu126"),
    "580-hopper": (Host("580.95.05", gpus("580.95.05", "9.0")), "cu130"),
    "580-blackwell": (Host("580.95.05", gpus("580.95.05", "10.0")), "cu130"),
    "580-blackwell-rtx-pro": (Host("580.95.05", gpus("580.95.05", "12.0", 2)), "cu130"),
    "580-volta": (Host("580.95.05", gpus("580.95.05", "7.0")), "cu126"),
    "580-ada": (Host("580.95.05", gpus("580.95.05", "8.9", 4)), "cu130"),
    "580-driver-from-nvidia-smi": (Host(None, gpus("580.95.05", "9.0")), "cu130"),
    "580-without-nvidia-smi": (Host("580.95.05"), "cu130"),
    "580-gh200": (Host("580.95.05", gpus("580.95.05", "9.0", 1), machine="aarch64"), "cu130"),
}

# name: (host, words of the one error line)
REFUSED = {
    "570-blackwell": (Host("570.172.08", gpus("570.172.08", "10.0")),
                      ["branch 570", "cu126 no Blackwell kernels", "Install driver branch 580"]),
    "470-volta": (Host("470.256.02", gpus("470.256.02", "7.0")),
                  ["branch 470", "Install driver branch 525"]),
    "580-kepler": (Host("580.95.05", gpus("580.95.05", "3.7", 2)),
                   ["no torch 2.13.0 build carries", "Kepler", "no driver branch"]),
    "580-volta-on-aarch64": (Host("580.95.05", gpus("580.95.05", "7.0", 1), machine="aarch64"),
                             ["no Volta kernels on aarch64"]),
}


def make(where: Path, *args: str, env: dict[str, str],
         timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["make", "--no-print-directory", "-C", str(where), *args], env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if not line.startswith("make: ***")]


def torch_metadata(venv: Path) -> list[str]:
    return sorted(p.name for p in venv.glob("lib/python3*/site-packages/torch-*.dist-info"))


# --- make torch-build: the choice, nothing installed ----------------------------------------

@pytest.mark.parametrize(("host", "build"), CHOICES.values(), ids=CHOICES.keys())
def test_make_torch_build_prints_the_build_this_host_runs(host: Host, build: str, tmp_path: Path) -> None:
    before = torch_metadata(ROOT / ".venv")
    proc = make(ROOT, "torch-build", env=host.env(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, proc.stdout
    name = "the CPU build" if build == "cpu" else f"the {build} build"
    assert lines[0].startswith(f"torch 2.13.0: {name} (") and f"from {INDEX}/{build}" in lines[0], lines[0]
    assert torch_metadata(ROOT / ".venv") == before


def test_the_line_says_why(tmp_path: Path) -> None:
    cases = {"no-driver": ["no NVIDIA driver loaded", "nvidia-smi"],
             "nvidia-smi-without-a-driver": ["couldn't communicate with the NVIDIA driver"],
             "550-hopper": ["driver 550.54.15", "8 x Hopper (9.0)", "cu130 needs driver branch 580+"],
             "580-volta": ["8 x Volta (7.0)", "cu130 no Volta kernels on x86_64"],
             "580-without-nvidia-smi": ["GPUs unknown", "not found"]}
    for name, words in cases.items():
        host, _ = CHOICES[name]
        out = make(ROOT, "torch-build", env=host.env(tmp_path / name)).stdout
        for word in words:
            assert word in out, (name, out)


@pytest.mark.parametrize(("host", "words"), REFUSED.values(), ids=REFUSED.keys())
def test_a_driver_no_build_runs_is_one_error_line(host: Host, words: list[str], tmp_path: Path) -> None:
    proc = make(ROOT, "torch-build", env=host.env(tmp_path))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = error_lines(proc.stderr)
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for word in words:
        assert word in lines[0], lines[0]
    assert proc.stdout == ""


def test_a_torch_pin_that_is_not_a_release_is_a_usage_error(tmp_path: Path) -> None:
    proc = make(ROOT, "torch-build", "TORCH_PIN=torch>=2", env=Host().env(tmp_path))
    assert proc.returncode == 2
    assert error_lines(proc.stderr) == [
        "error: TORCH_PIN must be torch==<release>, e.g. torch==2.13.0 (got 'torch>=2'); the build "
        "(CPU, cu126, ...) is chosen for this host"], proc.stderr


# --- make verify: exactly that build, from its index ----------------------------------------

STUB = '''#!{python} -S
"""Stand-in for the venv's interpreter: records each call; pip "installs" what --index-url names."""
import os, shutil, sys
from pathlib import Path
args = sys.argv[1:]
with open(os.environ["STUB_LOG"], "a") as log:
    log.write(" ".join(args) + "\\n")
if args[:3] == ["-m", "pip", "install"] and "--index-url" in args:
    if os.environ.get("STUB_PIP_FAIL"):
        print("ERROR: No matching distribution found for " + args[-1], file=sys.stderr)
        sys.exit(1)
    site = Path(__file__).resolve().parents[1] / "lib" / "python3.12" / "site-packages"
    for old in site.glob("torch-*.dist-info"):
        shutil.rmtree(old)
    (site / f"torch-{{args[-1].split('==')[1]}}.dist-info").mkdir(parents=True)
    (site / f"torch-{{args[-1].split('==')[1]}}.dist-info" / "METADATA").write_text(
        "Name: torch\\nVersion: " + args[-1].split("==")[1] + "\\n")
'''

# The OS's python3: runs the module without site-packages (so it imports only the standard
# library); its venv module is stood in for, since the venv above is the stub.
SYSTEM_PYTHON = '''#!/bin/sh
if [ "$1 $2" = "-m venv" ]; then echo "venv $3" >> "$STUB_LOG"; exit 0; fi
exec {python} -S "$@"
'''

COPIED = ["Makefile", "pyproject.toml", "checks/__init__.py", "checks/cliutil.py", "checks/safeio.py",
          "checks/devtools/__init__.py", "checks/devtools/torchbuild.py",
          "playbooks/roles/pytorch/defaults/main.yml", "playbooks/roles/pytorch/vars/torch_releases.json",
          "playbooks/roles/pytorch/filter_plugins/nodecert_torch_cuda.py"]


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """The files `make verify` uses, with a stub .venv interpreter."""
    copy = tmp_path / "checkout"
    for name in COPIED:
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, copy / name)
    stub = copy / ".venv" / "bin" / "python"
    stub.parent.mkdir(parents=True)
    stub.write_text(STUB.format(python=sys.executable))
    stub.chmod(0o755)
    system = tmp_path / "python3"
    system.write_text(SYSTEM_PYTHON.format(python=sys.executable))
    system.chmod(0o755)
    return copy


def verify(checkout: Path, host: Host, *args: str,
           **extra: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    log = checkout.parent / "calls.log"
    log.unlink(missing_ok=True)
    env = {**host.env(checkout.parent / "host"), "STUB_LOG": str(log), **extra}
    proc = make(checkout, "verify", f"PYTHON={checkout.parent / 'python3'}", *args, env=env)
    return proc, log.read_text().splitlines() if log.exists() else []


@pytest.mark.parametrize("name", ["no-driver", "550-hopper", "570-hopper", "580-hopper", "580-volta"])
def test_make_verify_installs_exactly_the_chosen_build_first(checkout: Path, name: str) -> None:
    host, build = CHOICES[name]
    proc, calls = verify(checkout, host)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    requirement = f"torch==2.13.0+{build}"
    # torch alone from the build's index, then its dependencies from pip's own indexes, before
    # the project's install (whose torch==2.13.0 the build satisfies) and the checks
    assert calls == [f"-m pip install --no-deps --index-url {INDEX}/{build} {requirement}",
                     f"-m pip install {requirement}",
                     "venv .venv",
                     "-m pip install -q torch==2.13.0 -e .",
                     "-m checks --level standard"], calls
    said = [line for line in proc.stdout.splitlines() if line.startswith("torch 2.13.0")]
    assert len(said) == 1 and said[0].endswith("; installing into .venv"), proc.stdout
    assert torch_metadata(checkout / ".venv") == [f"torch-2.13.0+{build}.dist-info"]


def test_make_verify_keeps_a_build_that_fits_and_replaces_one_that_no_longer_does(checkout: Path) -> None:
    cpu, _ = CHOICES["no-driver"]
    assert verify(checkout, cpu)[0].returncode == 0
    proc, calls = verify(checkout, cpu)
    assert proc.returncode == 0 and calls == ["-m checks --level standard"], calls
    assert proc.stdout.splitlines()[0].endswith("; .venv has it"), proc.stdout
    # a 550 driver installed since: the venv's CPU build is replaced by the cu126 one
    proc, calls = verify(checkout, CHOICES["550-hopper"][0])
    assert proc.returncode == 0, proc.stderr
    assert calls[0] == f"-m pip install --no-deps --index-url {INDEX}/cu126 torch==2.13.0+cu126", calls
    assert calls[-1] == "-m checks --level standard"
    assert torch_metadata(checkout / ".venv") == ["torch-2.13.0+cu126.dist-info"]


def test_make_verify_where_pip_cannot_get_the_build_fails_with_pip_after_the_line(checkout: Path) -> None:
    proc, calls = verify(checkout, CHOICES["580-hopper"][0], STUB_PIP_FAIL="1")
    assert proc.returncode != 0
    assert proc.stdout.splitlines()[0].startswith("torch 2.13.0: the cu130 build ("), proc.stdout
    assert error_lines(proc.stderr) == ["ERROR: No matching distribution found for torch==2.13.0+cu130"]
    assert calls == [f"-m pip install --no-deps --index-url {INDEX}/cu130 torch==2.13.0+cu130"], calls


def test_make_verify_for_a_driver_no_build_runs_installs_nothing(checkout: Path) -> None:
    proc, calls = verify(checkout, REFUSED["570-blackwell"][0])
    assert proc.returncode == 2
    lines = error_lines(proc.stderr)
    assert len(lines) == 1 and "Install driver branch 580" in lines[0], proc.stderr
    assert calls == []


def test_make_verify_runs_from_the_provisioned_venv_as_it_is(checkout: Path, tmp_path: Path) -> None:
    provisioned = tmp_path / "opt-nodecert-venv"
    (provisioned / "bin").mkdir(parents=True)
    shutil.copy2(checkout / ".venv" / "bin" / "python", provisioned / "bin" / "python")
    host, _ = CHOICES["550-hopper"]
    proc, calls = verify(checkout, host, f"PROVISIONED_VENV={provisioned}")
    assert proc.returncode == 0, proc.stderr
    assert calls == ["-m checks --level standard"], calls  # no pip, no venv: the provisioned one
    assert not (checkout / ".venv" / ".stamp-run").exists()
    env = host.env(tmp_path / "host")
    out = make(checkout, "torch-build", f"PYTHON={tmp_path / 'python3'}", f"PROVISIONED_VENV={provisioned}",
               env=env).stdout
    assert out == (f"torch: make verify runs from {provisioned} as it is (no torch in it); "
                   "nothing is installed\n")
    # VENV given: that venv, the choice installed into .venv
    proc, calls = verify(checkout, host, f"PROVISIONED_VENV={provisioned}", "VENV=.venv")
    assert calls[0].endswith("torch==2.13.0+cu126") and calls[-1] == "-m checks --level standard", calls


def test_make_torch_venv_installs_the_cpu_build_from_what_pip_finds_here(tmp_path: Path) -> None:
    """For real: a venv made by the OS's python3 and the CPU build from PyTorch's CPU index, or
    from this machine's local wheels where that index cannot be reached (pip's find-links)."""
    copy = tmp_path / "checkout"
    for name in COPIED:
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, copy / name)
    proc = make(copy, "torch-venv", env=Host().env(tmp_path / "host"), timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stdout.splitlines()[0].startswith(
        "torch 2.13.0: the CPU build (no NVIDIA driver loaded: "), proc.stdout
    assert torch_metadata(copy / ".venv") == ["torch-2.13.0+cpu.dist-info"]
    found = subprocess.run([str(copy / ".venv" / "bin" / "python"), "-c",
                            "import torch; print(torch.__version__, torch.version.cuda)"],
                           capture_output=True, text=True, timeout=300, check=False)
    assert found.stdout.strip() == "2.13.0+cpu None", found.stderr


# --- the module ------------------------------------------------------------------------------

def test_the_module_imports_only_the_standard_library() -> None:
    """It runs before any venv exists: -S leaves site-packages (yaml, ansible, ...) out."""
    proc = subprocess.run([sys.executable, "-S", "-c", "import checks.devtools.torchbuild as t; "
                           "t.plugin(); print(t.role_torch_version())"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0 and proc.stdout.strip() == "2.13.0", proc.stderr


def test_each_compute_capability_is_the_architecture_the_provisioning_tables_name() -> None:
    from checks.docgen.preflight_models import ARCHITECTURES

    for capability, names in ARCHITECTURES.items():
        assert torchbuild.architecture(capability) in names, capability


@pytest.mark.parametrize(("host", "build"), CHOICES.values(), ids=CHOICES.keys())
def test_main_prints_the_choice(host: Host, build: str, tmp_path: Path, monkeypatch, capsys) -> None:
    for key, value in host.env(tmp_path).items():
        if key.startswith("NODECERT_"):
            monkeypatch.setenv(key, value)
    assert torchbuild.main([]) == 0
    out = capsys.readouterr().out
    assert f"from {INDEX}/{build}\n" in out and out.count("\n") == 1, out


@pytest.mark.parametrize(("argv", "message"), [
    (["--install"], "error: --install needs --venv"),
    (["--use-venv", "/nonexistent/venv"], "error: /nonexistent/venv is not a venv (no bin/python)"),
    (["--pin", "torch==2.99.0"], "error: torch 2.99.0 is not in the pytorch role's release table"),
    (["--venv", ".venv", "--use-venv", ".venv"], "error: argument --use-venv: not allowed with"),
])
def test_main_usage_errors_are_one_line(argv: list[str], message: str, tmp_path: Path, monkeypatch,
                                        capsys) -> None:
    for key, value in CHOICES["580-hopper"][0].env(tmp_path).items():
        if key.startswith("NODECERT_"):
            monkeypatch.setenv(key, value)
    assert torchbuild.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1, captured.err
    assert captured.err.startswith(message), captured.err
