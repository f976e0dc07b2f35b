"""Which CUDA build of torch a node gets: the pytorch role's `pytorch_cuda_version: auto`.

torch publishes each release for a few CUDA releases only (PyTorch's release matrix, the role's
vars/main.yml), each build carrying the GPU architectures of its CUDA; the driver branch runs the
builds of its CUDA major and older (NVIDIA's minor version compatibility). The choice is the newest
build that the driver runs and that carries every GPU of the node; an error names what is missing.
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in str(text).split("."))


def torch_cuda_build(
    releases: dict,
    torch_version: str,
    driver_branch: object,
    machine: str,
    gpu_architectures: list,
    major_min_driver: dict,
) -> str:
    """The CUDA release (e.g. "13.0") of the torch build to install on this node."""
    release = ".".join(str(torch_version).split(".")[:2])
    row = releases.get(release)
    if row is None:
        raise AnsibleFilterError(
            f"torch {torch_version} is not in the pytorch role's release table (known: "
            f"{', '.join(sorted(releases, key=_version))}): set pytorch_cuda_version to one of its "
            "CUDA builds (PyTorch's release matrix) or add the release to the table"
        )
    if driver_branch in (None, ""):  # no driver role in the play (a GPU-less image): any build
        branch, runnable = "none", set(major_min_driver)
    else:
        try:
            number = int(str(driver_branch).split(".")[0])
        except ValueError as err:
            raise AnsibleFilterError(f"driver branch {driver_branch!r} is not a number") from err
        branch = str(number)
        runnable = {major for major, minimum in major_min_driver.items() if number >= int(minimum)}
    wanted = sorted({str(a) for a in gpu_architectures if a})
    fits, missing = [], {}
    for build in sorted(row["cuda"], key=lambda b: _version(b["cuda"])):
        carried, major = set(build.get(machine) or []), str(build["cuda"]).split(".")[0]
        if major not in runnable:
            missing[build["cuda"]] = f"needs driver branch {major_min_driver.get(major)}+"
        elif not set(wanted) <= carried:
            missing[build["cuda"]] = f"no {', '.join(sorted(set(wanted) - carried))} kernels on {machine}"
        else:
            fits.append(build["cuda"])
    if fits:
        return str(fits[-1])
    reasons = "; ".join(f"cu{cuda.replace('.', '')} {why}" for cuda, why in missing.items())
    raise AnsibleFilterError(
        f"torch {torch_version} has no CUDA build for this node ({', '.join(wanted) or 'no GPU'}, "
        f"driver branch {branch}, {machine}): {reasons}. Choose another pytorch_torch_version or "
        "nvidia_driver_branch, or set pytorch_cuda_version"
    )


class FilterModule:
    def filters(self) -> dict:
        return {"nodecert_torch_cuda": torch_cuda_build}
