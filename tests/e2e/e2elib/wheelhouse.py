"""Wheels for the hosts' venvs: the chroots cannot verify PyPI's certificate, so the pytorch role
installs from a directory with `--no-index --find-links`."""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

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
