"""Which CUDA build of torch a node gets: the pytorch role's `pytorch_cuda_version: auto`.

torch publishes each release for a few CUDA releases only (PyTorch's release matrix, the role's
vars/torch_releases.json), each build carrying the GPU architectures of its CUDA; the driver branch
runs the builds of its CUDA major and older (NVIDIA's minor version compatibility). The choice is
the newest build that the driver runs and that carries every GPU of the node; an error names what
is missing.

`make verify` makes the same choice for the host it runs on before any venv exists
(checks/devtools/torchbuild.py, under the OS's python3): it loads this file and the JSON table,
so both stay inside the standard library; Ansible's error type is imported only when Ansible
calls the filter.
"""

from __future__ import annotations

import json
from pathlib import Path

MATRIX = Path(__file__).resolve().parents[1] / "vars" / "torch_releases.json"


class NoBuild(ValueError):
    """No CUDA build of the torch release fits the node; the message says why."""


class UnknownRelease(NoBuild):
    """A torch release the table does not hold."""


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in str(text).split("."))


def release_matrix(path: Path = MATRIX) -> dict:
    """The table: {"releases": {"2.13": {"python": [...], "cuda": [builds]}},
    "cuda_major_min_driver": {"12": 525, ...}}."""
    return json.loads(path.read_text())


def build_fits(
    matrix: dict, torch_version: str, driver_branch: object, machine: str, gpu_architectures: list
) -> dict[str, str | None]:
    """{CUDA release: None when the build fits, else why not}, oldest build first.

    No driver branch (a play without the driver role: a GPU-less image) runs every build."""
    releases, major_min_driver = matrix["releases"], matrix["cuda_major_min_driver"]
    release = ".".join(str(torch_version).split(".")[:2])
    row = releases.get(release)
    if row is None:
        raise UnknownRelease(
            f"torch {torch_version} is not in the pytorch role's release table (known: "
            f"{', '.join(sorted(releases, key=_version))})"
        )
    if driver_branch in (None, ""):
        runnable = set(major_min_driver)
    else:
        try:
            number = int(str(driver_branch).split(".")[0])
        except ValueError as err:
            raise NoBuild(f"driver branch {driver_branch!r} is not a number") from err
        runnable = {major for major, minimum in major_min_driver.items() if number >= int(minimum)}
    wanted = {str(a) for a in gpu_architectures if a}
    fits: dict[str, str | None] = {}
    for build in sorted(row["cuda"], key=lambda b: _version(b["cuda"])):
        carried, major = set(build.get(machine) or []), str(build["cuda"]).split(".")[0]
        if major not in runnable:
            fits[build["cuda"]] = f"needs driver branch {major_min_driver.get(major)}+"
        elif not wanted <= carried:
            fits[build["cuda"]] = f"no {', '.join(sorted(wanted - carried))} kernels on {machine}"
        else:
            fits[build["cuda"]] = None
    return fits


def torch_cuda_build(
    torch_version: str,
    driver_branch: object,
    machine: str,
    gpu_architectures: list,
    matrix: dict | None = None,
) -> str:
    """The CUDA release (e.g. "13.0") of the torch build to install on this node."""
    fits = build_fits(matrix or release_matrix(), torch_version, driver_branch, machine, gpu_architectures)
    chosen = [cuda for cuda, why in fits.items() if why is None]
    if chosen:
        return str(chosen[-1])
    wanted = sorted({str(a) for a in gpu_architectures if a})
    branch = "none" if driver_branch in (None, "") else str(int(str(driver_branch).split(".")[0]))
    reasons = "; ".join(f"cu{cuda.replace('.', '')} {why}" for cuda, why in fits.items())
    raise NoBuild(
        f"torch {torch_version} has no CUDA build for this node ({', '.join(wanted) or 'no GPU'}, "
        f"driver branch {branch}, {machine}): {reasons}. Choose another pytorch_torch_version or "
        "nvidia_driver_branch, or set pytorch_cuda_version"
    )


def _filter(torch_version: str, driver_branch: object, machine: str, gpu_architectures: list) -> str:
    from ansible.errors import AnsibleFilterError

    try:
        return torch_cuda_build(torch_version, driver_branch, machine, gpu_architectures)
    except UnknownRelease as err:
        raise AnsibleFilterError(f"{err}: set pytorch_cuda_version to one of its CUDA builds (PyTorch's "
                                 "release matrix) or add the release to the table") from err
    except NoBuild as err:
        raise AnsibleFilterError(str(err)) from err


class FilterModule:
    def filters(self) -> dict:
        return {"nodecert_torch_cuda": _filter}
