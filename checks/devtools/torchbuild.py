"""The torch build `make verify` installs on this host, chosen as the pytorch role chooses it.

PyPI's torch of a release is one CUDA build (2.13: CUDA 13, which needs driver branch 580): a
3-4 GB download that a 535/550/570 driver cannot run and that a host without GPUs does not need.
PyTorch publishes the other builds on its own index, one per build. This module makes, for the
host it runs on, the choice the pytorch role makes for a node it provisions (the role's filter
plugin and its release table, vars/torch_releases.json, loaded from the role, not copied):

- no NVIDIA driver loaded: the CPU build (~200 MB; on a host whose GPUs lack a driver the checks
  then say what is missing);
- else the newest CUDA build that the loaded driver's branch runs and that carries every GPU;
- a driver that runs no published build for the GPUs: one `error:` line naming the driver branch
  to install, exit 2.

It runs before any venv exists, under the OS's python3 (3.10+), so it imports nothing outside the
standard library. It prints one line, the choice and why; only --install changes anything:

    python3 -m checks.devtools.torchbuild                        # the choice (make torch-build)
    python3 -m checks.devtools.torchbuild --venv .venv --install # the line, then pip installs it
    python3 -m checks.devtools.torchbuild --use-venv /opt/nodecert/venv  # a venv used as it is

What it reads of the machine, each replaceable so that tests stand in for any host:

    NODECERT_SYSFS        sysfs root (/sys): module/nvidia/version is the loaded driver's version
    NODECERT_NVIDIA_SMI   nvidia-smi: `--query-gpu=driver_version,compute_cap` gives each GPU's
                          compute capability, and the driver's version where sysfs has none
    NODECERT_MACHINE      the machine (platform.machine(): x86_64, aarch64)
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType

from checks import cliutil

ROLE = Path(__file__).resolve().parents[2] / "playbooks" / "roles" / "pytorch"
INDEX = "https://download.pytorch.org/whl"
SMI_QUERY = ("--query-gpu=driver_version,compute_cap", "--format=csv,noheader")
SMI_TIMEOUT_S = 60

# Architecture of a compute capability, named as preflight and the release table name them. Source:
# NVIDIA's "CUDA GPU Compute Capability" table; a test holds it to the one the provisioning docs are
# checked with (checks/docgen/preflight_models.ARCHITECTURES). Grace Hopper's GPU is 9.0, and every
# build that carries Grace Hopper carries Hopper.
_BY_MAJOR = {3: "Kepler", 5: "Maxwell", 6: "Pascal", 9: "Hopper", 10: "Blackwell", 11: "Blackwell",
             12: "Blackwell"}


class ChoiceError(Exception):
    """No build for this host, or input that says nothing usable; the message is one line."""


@cache
def plugin() -> ModuleType:
    """The pytorch role's filter plugin (the choice and its table), loaded from its file."""
    path = ROLE / "filter_plugins" / "nodecert_torch_cuda.py"
    spec = importlib.util.spec_from_file_location("nodecert_torch_cuda", path)
    if spec is None or spec.loader is None:
        raise ChoiceError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def role_torch_version() -> str:
    """pytorch_torch_version of the role's defaults (what `make` pins as TORCH_PIN)."""
    text = (ROLE / "defaults" / "main.yml").read_text()
    found = re.search(r'^pytorch_torch_version: *"([^"]+)"', text, re.MULTILINE)
    if not found:
        raise ChoiceError(f"no pytorch_torch_version in {ROLE / 'defaults' / 'main.yml'}")
    return found.group(1)


def pin_version(pin: str) -> str:
    """`torch==2.13.0` -> `2.13.0`: the build is chosen here, so the pin names a release only."""
    found = re.fullmatch(r"\s*torch\s*==\s*(\d+\.\d+\.\d+)\s*", pin)
    if not found:
        raise ChoiceError(f"TORCH_PIN must be torch==<release>, e.g. torch=={role_torch_version()} "
                          f"(got {pin!r}); the build (CPU, cu126, ...) is chosen for this host")
    return found.group(1)


def architecture(capability: str) -> str:
    """`9.0` -> `Hopper`; a capability of no known architecture is named as it is."""
    major, minor = (int(part) for part in capability.split("."))
    if major == 7:
        return "Turing" if minor >= 5 else "Volta"
    if major == 8:
        return "Ada Lovelace" if minor == 9 else "Ampere"
    return _BY_MAJOR.get(major, f"compute capability {capability}")


@dataclass(frozen=True)
class Host:
    """What the choice depends on: the loaded driver, the GPUs' compute capabilities, the machine."""

    machine: str
    driver: str | None = None        # "550.54.15"
    capabilities: tuple[str, ...] = ()
    no_gpus_why: str = ""            # why no capabilities are known ("" when they are)

    def gpus(self) -> str:
        if not self.capabilities:
            return f"GPUs unknown: {self.no_gpus_why}"
        counts = Counter(self.capabilities)
        return "GPUs: " + ", ".join(f"{n} x {architecture(cc)} ({cc})"
                                    for cc, n in sorted(counts.items(), key=lambda kv: _version(kv[0])))


def _nvidia_smi(command: str) -> tuple[list[tuple[str, str]], str]:
    """(driver version, compute capability) per GPU, or [] and why not."""
    try:
        proc = subprocess.run([command, *SMI_QUERY], capture_output=True, text=True,
                              timeout=SMI_TIMEOUT_S, check=False, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        return [], f"{command} not found"
    except subprocess.TimeoutExpired:
        return [], f"{command} did not answer in {SMI_TIMEOUT_S} s"
    except OSError as err:
        return [], f"{command}: {err.strerror or err}"
    text = (proc.stdout + proc.stderr).strip()
    if proc.returncode != 0:
        first = text.splitlines()[0] if text else "no output"
        return [], f"{command} exited {proc.returncode}: {first}"
    rows = [tuple(part.strip() for part in line.split(",")) for line in proc.stdout.splitlines()
            if line.strip()]
    if not rows or any(len(row) != 2 or not re.fullmatch(r"\d+\.\d+", row[1]) for row in rows):
        return [], f"{command} gave no compute capability ({' '.join(text.split())[:80] or 'no output'})"
    return [(row[0], row[1]) for row in rows], ""


def probe(environ: Mapping[str, str] | None = None) -> Host:
    """The loaded driver (sysfs, else nvidia-smi) and the GPUs nvidia-smi reports."""
    env = os.environ if environ is None else environ
    version_file = Path(env.get("NODECERT_SYSFS") or "/sys") / "module" / "nvidia" / "version"
    machine = env.get("NODECERT_MACHINE") or platform.machine()
    gpus, smi_why = _nvidia_smi(env.get("NODECERT_NVIDIA_SMI") or "nvidia-smi")
    capabilities = tuple(cc for _, cc in gpus)
    try:
        driver = version_file.read_text().strip()
        driver_from = str(version_file)
    except OSError:
        if not gpus:
            return Host(machine, no_gpus_why=f"no {version_file}; {smi_why}")
        driver, driver_from = gpus[0][0], "nvidia-smi"
    if not re.fullmatch(r"\d+(\.\d+)+", driver):
        raise ChoiceError(f"the NVIDIA driver version {driver!r} from {driver_from} is not a version")
    return Host(machine, driver, capabilities, smi_why)


@dataclass(frozen=True)
class Choice:
    """A torch release's build for this host, and why."""

    torch_version: str
    build: str                       # "cpu", "cu126", "cu130"
    why: str

    @property
    def requirement(self) -> str:
        # PyTorch's per-build indexes name each wheel with the build as its local version
        # (torch-2.13.0+cu126-...): the label makes pip take that build and no other, even where
        # its configured find-links or extra indexes hold another build of the same release.
        return f"torch=={self.torch_version}+{self.build}"

    @property
    def index_url(self) -> str:
        return f"{INDEX}/{self.build}"

    def line(self) -> str:
        name = "the CPU build" if self.build == "cpu" else f"the {self.build} build"
        return f"torch {self.torch_version}: {name} ({self.why}), from {self.index_url}"


def choose(host: Host, torch_version: str) -> Choice:
    """The role's choice for this host: CPU without a driver, else the newest build that fits."""
    if host.driver is None:
        return Choice(torch_version, "cpu", f"no NVIDIA driver loaded: {host.no_gpus_why}")
    nodecert_torch_cuda = plugin()
    matrix = nodecert_torch_cuda.release_matrix()
    wanted = [architecture(cc) for cc in host.capabilities]
    branch = host.driver.split(".")[0]
    try:
        fits = nodecert_torch_cuda.build_fits(matrix, torch_version, branch, host.machine, wanted)
        carries = nodecert_torch_cuda.build_fits(matrix, torch_version, None, host.machine, wanted)
    except nodecert_torch_cuda.NoBuild as err:
        raise ChoiceError(f"{err}: set TORCH_PIN to a release it holds") from err
    fitting = [cuda for cuda, why in fits.items() if why is None]
    reasons = [f"cu{cuda.replace('.', '')} {why}" for cuda, why in fits.items()
               if why is not None and (not fitting or _version(cuda) > _version(fitting[-1]))]
    if fitting:
        why = "; ".join([f"driver {host.driver}", host.gpus(), *reasons])
        return Choice(torch_version, "cu" + fitting[-1].replace(".", ""), why)
    host_text = f"NVIDIA driver {host.driver} (branch {branch})"
    carried = [cuda for cuda, why in carries.items() if why is None]
    if not carried:
        lacking = "; ".join(f"cu{cuda.replace('.', '')} {why}" for cuda, why in carries.items())
        raise ChoiceError(f"no torch {torch_version} build carries this host's GPUs ({host.gpus()}): "
                          f"{lacking}; no driver branch makes one run")
    needed = matrix["cuda_major_min_driver"][carried[-1].split(".")[0]]
    raise ChoiceError(f"{host_text} runs no torch {torch_version} build for this host ({host.gpus()}): "
                      f"{'; '.join(reasons)}. Install driver branch {needed} or later "
                      "(make provision: nvidia_driver_branch)")


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def installed_torch(venv: Path) -> str | None:
    """The version (with its build label, e.g. 2.13.0+cpu) of the torch a venv holds, read from
    its metadata: importing torch takes seconds and needs the venv's interpreter."""
    for metadata in sorted(venv.glob("lib/python3*/site-packages/torch-*.dist-info/METADATA")):
        for line in metadata.read_text(errors="replace").splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
    return None


def install(choice: Choice, venv: Path) -> int:
    """pip installs the chosen build into the venv (made first when missing); pip's own status."""
    python = venv / "bin" / "python"
    if not python.exists():
        made = subprocess.run([sys.executable, "-m", "venv", str(venv)], check=False)
        if made.returncode != 0:
            return made.returncode
    sys.stdout.flush()
    # torch alone from the build's index, then what it depends on from the indexes pip is
    # configured with (PyPI, or a site's mirror): the build's index mirrors those too, but each
    # package asked of an index that cannot be reached costs pip's retries (seconds each).
    pip = [str(python), "-m", "pip", "install"]
    alone = subprocess.run([*pip, "--no-deps", "--index-url", choice.index_url, choice.requirement],
                           check=False)
    if alone.returncode != 0:
        return alone.returncode
    return subprocess.run([*pip, choice.requirement], check=False).returncode


def _args(argv: Sequence[str] | None) -> argparse.Namespace | int:
    parser = argparse.ArgumentParser(prog="python3 -m checks.devtools.torchbuild",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--pin", help="the torch release, as torch==X.Y.Z (make's TORCH_PIN; "
                                      "default: the pytorch role's pytorch_torch_version)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--venv", type=Path, help="the venv `make verify` builds (.venv)")
    where.add_argument("--use-venv", type=Path, metavar="VENV",
                       help="a venv `make verify` runs from as it is (the provisioned one)")
    parser.add_argument("--install", action="store_true", help="install the choice into --venv")
    return cliutil.parse(parser, argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _args(argv)
    if isinstance(args, int):
        return args
    if args.install and args.venv is None:
        print("error: --install needs --venv", file=sys.stderr)
        return 2
    if args.use_venv is not None:
        if not (args.use_venv / "bin" / "python").exists():
            print(f"error: {args.use_venv} is not a venv (no bin/python)", file=sys.stderr)
            return 2
        held = installed_torch(args.use_venv)
        print(f"torch: make verify runs from {args.use_venv} as it is "
              f"({f'torch {held}' if held else 'no torch in it'}); nothing is installed")
        return 0
    try:
        version = pin_version(args.pin) if args.pin is not None else role_torch_version()
        choice = choose(probe(), version)
    except (ChoiceError, OSError, ValueError) as err:
        print(f"error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    if args.venv is None:
        print(choice.line())
        return 0
    held = installed_torch(args.venv)
    if held == f"{choice.torch_version}+{choice.build}":
        print(f"{choice.line()}; {args.venv} has it")
        return 0
    print(f"{choice.line()}; installing into {args.venv}" if args.install
          else f"{choice.line()}; make verify installs it into {args.venv}"
               + (f" (it holds torch {held})" if held else ""))
    return install(choice, args.venv) if args.install else 0


if __name__ == "__main__":
    raise SystemExit(main())
