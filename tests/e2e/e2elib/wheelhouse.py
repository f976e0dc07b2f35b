"""Wheels for the hosts' venvs: the chroots cannot verify PyPI's certificate, so the pytorch role
installs from a directory with `--no-index --find-links`."""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import tomllib

LOCAL_WHEELS = Path("/opt/wheels")


def torch_requirement(version: str = "2.13.0") -> str:
    """The local CPU wheel when this machine has one (PyPI's default torch pulls GBs of CUDA)."""
    local = sorted(
        LOCAL_WHEELS.glob(f"torch-{version}*-cp{sys.version_info.major}{sys.version_info.minor}-*.whl")
    )
    return str(local[0]) if local else f"torch=={version}"


def project_requirements(repo: Path) -> list[str]:
    with open(repo / "pyproject.toml", "rb") as handle:
        dependencies = tomllib.load(handle)["project"]["dependencies"]
    return [d for d in dependencies if not d.replace(" ", "").startswith("torch")]


def cached_wheelhouse(repo: Path, cache_dir: Path, torch_version: str = "2.13.0") -> Path:
    """A directory of binary wheels for torch and this project's dependencies (Python of this
    interpreter, which is the Debian 12 roots' 3.11)."""
    requirements = [torch_requirement(torch_version), *project_requirements(repo)]
    key = hashlib.sha256("\n".join(requirements).encode()).hexdigest()[:12]
    wheelhouse = cache_dir / f"wheelhouse-cp{sys.version_info.major}{sys.version_info.minor}-{key}"
    cache_dir.mkdir(parents=True, exist_ok=True)
    with open(cache_dir / f".{wheelhouse.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not wheelhouse.exists():
            partial = wheelhouse.with_name(wheelhouse.name + ".partial")
            shutil.rmtree(partial, ignore_errors=True)
            env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_REQUIRE")}
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "--quiet",
                    "--only-binary=:all:",
                    "--dest",
                    str(partial),
                    *requirements,
                ],
                check=True,
                env=env,
            )
            partial.rename(wheelhouse)
    return wheelhouse


def link_into(wheelhouse: Path, root: Path, inside: str = "srv/wheelhouse") -> str:
    """Hard-link the wheels into a host root (same file system: instant) and return the path the
    host sees."""
    dest = root / inside
    dest.mkdir(parents=True, exist_ok=True)
    for wheel in wheelhouse.iterdir():
        target = dest / wheel.name
        if not target.exists():
            try:
                os.link(wheel, target)
            except OSError:
                shutil.copy2(wheel, target)
    return "/" + inside


# A stand-in for torch on the Ubuntu roots: the local torch wheel is built for CPython 3.11 (Debian
# 12's Python); jammy has 3.10 and noble 3.12. The stand-in lets the pytorch role's venv, pip and
# import steps run for real there; it is not PyTorch.
STANDIN_TORCH_INIT = '''"""Stand-in for torch made by nodecert's e2e tests (not PyTorch)."""
from . import version
__version__ = version.__version__
'''


def standin_torch_wheel(dest: Path, version: str = "2.13.0") -> Path:
    """A py3-none-any wheel named torch with an importable module, __version__ and version.cuda."""
    import base64
    import zipfile

    files = {
        "torch/__init__.py": STANDIN_TORCH_INIT,
        "torch/version.py": f'__version__ = "{version}"\ncuda = None\n',
        f"torch-{version}.dist-info/METADATA": (
            f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n"
            "Summary: stand-in for torch (nodecert e2e tests)\n"
        ),
        f"torch-{version}.dist-info/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: nodecert-e2e\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(text.encode())}")
    record.append(f"torch-{version}.dist-info/RECORD,,")
    files[f"torch-{version}.dist-info/RECORD"] = "\n".join(record) + "\n"
    dest.mkdir(parents=True, exist_ok=True)
    wheel = dest / f"torch-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, text in files.items():
            # Fixed timestamps: the same bytes every time.
            archive.writestr(zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0)), text)
    return wheel


def cached_standin_wheelhouse(
    repo: Path, cache_dir: Path, python: str, with_project_deps: bool, torch_version: str = "2.13.0"
) -> Path:
    """Wheels for a root whose Python is `python` ("3.10", "3.12"): the stand-in torch and, when
    with_project_deps, this project's dependencies as binary wheels for that Python."""
    requirements = project_requirements(repo) if with_project_deps else []
    tag = python.replace(".", "")
    key = hashlib.sha256("\n".join(["standin-1", torch_version, *requirements]).encode()).hexdigest()[:12]
    wheelhouse = cache_dir / f"wheelhouse-standin-cp{tag}-{key}"
    cache_dir.mkdir(parents=True, exist_ok=True)
    with open(cache_dir / f".{wheelhouse.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not wheelhouse.exists():
            partial = wheelhouse.with_name(wheelhouse.name + ".partial")
            shutil.rmtree(partial, ignore_errors=True)
            standin_torch_wheel(partial, torch_version)
            if requirements:
                env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_REQUIRE")}
                subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "pip",
                        "download",
                        "--quiet",
                        "--only-binary=:all:",
                        "--python-version",
                        python,
                        "--implementation",
                        "cp",
                        "--platform",
                        "manylinux_2_28_x86_64",
                        "--platform",
                        "manylinux_2_17_x86_64",
                        "--platform",
                        "manylinux2014_x86_64",
                        "--dest",
                        str(partial),
                        *requirements,
                    ],
                    check=True,
                    env=env,
                )
            partial.rename(wheelhouse)
    return wheelhouse
