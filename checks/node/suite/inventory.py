"""GPU inventory: PCI bus vs driver vs NVML vs torch, driver and CUDA versions, torch's build."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from checks.hw.base import HardwareError, NvmlUnavailable
from checks.model import Device, Result, error, fail, passed, skip, warn
from checks.node.context import Context
from checks.node.registry import Budget, Cost, check
from checks.node.remedies import GPU_LOST

NO_GPU = "no NVIDIA device on the PCI bus"
REMEDY_DRIVER = ("install the NVIDIA driver (`make provision`), then reboot so the kernel module "
                 "loads; check `dmesg | grep -i nvrm` for load errors")


@check("pci-gpus", code="INV001", title="NVIDIA GPUs on the PCI bus", stage="inventory",
       budget=Budget(value=10, cost=Cost(cpu=1, gpu=1), source="measured cpu"))
def pci_gpus(ctx: Context) -> Result:
    """Counts NVIDIA display/3D controllers (and NVSwitch bridges) on the PCI bus, the ground
    truth that needs no driver. SKIP (and every GPU check with it) when there are none."""
    gpus, switches = ctx.pci_gpus, ctx.nvswitches
    expect = ctx.options.expect_gpus
    details = {"gpus": [f"{d.address} 0x{d.device:04x}" for d in gpus],
               "nvswitches": [d.address for d in switches]}
    if not gpus:
        if expect:
            return fail(f"{NO_GPU}, expected {expect}", value=0, expected=str(expect),
                        remedy="check the GPUs are seated and enabled in the BIOS (lspci -d 10de:)")
        return skip(NO_GPU, value=0, details=details)
    what = f"{len(gpus)} GPU(s)" + (f" and {len(switches)} NVSwitch(es)" if switches else "")
    # A count that differs from --expect-gpus is judged by gpu-count, so that the driver and
    # health checks still run on the GPUs that are there.
    return passed(f"{what} on the PCI bus", value=len(gpus), details=details)


@check("driver-loaded", code="INV002", title="NVIDIA kernel driver loaded and NVML answers",
       stage="inventory", needs=("pci-gpus",),
       budget=Budget(value=10, cost=Cost(cpu=1, gpu=1), source="measured cpu"))
def driver_loaded(ctx: Context) -> Result:
    """GPUs on the PCI bus with no loaded driver or no NVML library is a FAIL, not a skip."""
    count = len(ctx.pci_gpus)
    proc = ctx.hw.proc_driver_version()
    try:
        nvml = ctx.hw.nvml()
    except NvmlUnavailable as exc:
        messages = {
            "library_missing": "NVML library (libnvidia-ml.so.1) is missing",
            "bindings_missing": "the nvidia-ml-py bindings are not installed",
            "driver_not_loaded": "the NVIDIA kernel driver is not loaded",
            "no_permission": "no permission to open the NVIDIA devices",
        }
        what = messages.get(exc.kind, str(exc))
        remedy = ("pip install nvidia-ml-py into this environment" if exc.kind == "bindings_missing"
                  else REMEDY_DRIVER)
        return fail(f"{what} while {count} NVIDIA GPU(s) are on the PCI bus", value=exc.kind,
                    expected="driver loaded, NVML initialised", remedy=remedy)
    if proc is None:
        return fail(f"NVML answers but /proc/driver/nvidia/version is missing ({count} GPUs)",
                    remedy=REMEDY_DRIVER)
    version = nvml.driver_version()
    return passed(f"driver {version} loaded, NVML initialised", value=version)


@check("gpu-profile", code="INV003", title="GPU model has a threshold profile", stage="inventory",
       needs=("pci-gpus",),
       budget=Budget(value=6, cost=Cost(cpu=1, gpu=1), source="measured cpu"))
def gpu_profile(ctx: Context) -> Result:
    """Which per-model profile supplies the thresholds; unknown models fall back to generic."""
    profile = ctx.profile
    if profile.unknown_models:
        return warn(f"unknown GPU model {', '.join(profile.unknown_models)}: using the generic "
                    "profile (no model-specific thresholds)", value=profile.name,
                    remedy="pass --profile NAME for a model that matches, or set this site's "
                           "floors under models.generic in /etc/nodecert/site.yaml "
                           "(docs/checks.md, 'Tuning for your site')")
    return passed(f"profile {profile.name}: {profile.description} ({profile.reason})",
                  value=profile.name)


REMEDY_LOST = GPU_LOST
REMEDY_HIDDEN = ("in a Slurm job request GPUs (--gres=gpu:N or --gpus=N); elsewhere unset "
                 "CUDA_VISIBLE_DEVICES or list the GPUs to verify")


@dataclass
class _Counts:
    """What gpu-count compares: the PCI bus, NVML, the container's device nodes, CUDA_VISIBLE_DEVICES
    and torch (`values` goes into every result's details)."""

    pci: list[str]
    answering: list[Any]
    lost: list[Any]
    missing: list[str]
    container: str | None
    nodes: set[int] | None
    values: dict[str, Any]
    not_given: list[str] = field(default_factory=list)


def _nvml_problems(ctx: Context, c: _Counts) -> Iterator[Result]:
    for gpu in c.lost:
        yield fail(f"GPU {gpu.device.index} at {gpu.device.pci or 'an unknown address'} is lost: "
                   "NVML answers GPU_IS_LOST (fell off the bus)", value="lost",
                   expected="answers", device=gpu.device, remedy=REMEDY_LOST, details=c.values)
    if c.missing and c.container is not None and c.nodes is not None:
        # A container sees every GPU in sysfs but only the device nodes it was given; GPUs
        # given to it but absent from NVML are the ones beyond the answering count.
        gpus = len(ctx.gpus)
        broken = max(0, len(c.nodes) - gpus)
        c.not_given = c.missing[: len(c.missing) - broken] if broken < len(c.missing) else []
        if broken:
            yield fail(f"{broken} GPU(s) given to this {c.container} container (/dev/nvidia* "
                       f"nodes {sorted(c.nodes)}) do not answer NVML", value=gpus,
                       expected=str(len(c.nodes)), remedy=REMEDY_LOST, details=c.values)
    else:
        for address in c.missing:
            yield fail(f"GPU {address} is on the PCI bus but NVML does not list it (fell off the "
                       "bus or failed to initialise)", value=len(ctx.gpus), expected=str(len(c.pci)),
                       remedy=REMEDY_LOST, details=c.values, device=Device(pci=address))
    if c.not_given:
        c.values["not_given"] = c.not_given


def _platform_problems(ctx: Context, c: _Counts) -> Iterator[Result]:
    platform = ctx.profile.get("gpus_per_node")
    if ctx.nvswitches and platform and len(c.pci) < int(platform):
        yield fail(f"{len(c.pci)} GPU(s) on the PCI bus of a baseboard with {len(ctx.nvswitches)} "
                   f"NVSwitch(es); this platform ({ctx.profile.name}) holds {platform}",
                   value=len(c.pci), expected=str(platform), details=c.values,
                   remedy="a GPU missing from lspci is a hardware or BIOS problem: reseat, check "
                          "power and BIOS PCIe settings, or RMA the baseboard/GPU")


def _expectation_problems(ctx: Context, c: _Counts, want: int, note: str, hidden: bool
                          ) -> Iterator[Result]:
    expect = ctx.options.expect_gpus
    if expect is not None and len(c.pci) != expect:
        yield fail(f"{len(c.pci)} GPU(s) on the PCI bus, expected {expect}", value=len(c.pci),
                   expected=str(expect),
                   remedy="a GPU missing from lspci is a hardware or BIOS problem: reseat, check "
                          "power cables and BIOS PCIe settings, or RMA")
    elif ctx.options.expect_gpu_ids and (found := _pci_ids(ctx)) - set(ctx.options.expect_gpu_ids):
        expected = ", ".join(ctx.options.expect_gpu_ids)
        yield fail(f"GPU PCI ID(s) {', '.join(sorted(found))} on the bus, expected {expected}: not the "
                   "model this node was provisioned for", value=sorted(found), expected=expected,
                   details=c.values,
                   remedy="a board or GPU of another model was fitted, or the expectations came "
                          "from another node: reprovision (make provision) for the hardware "
                          "there is, or fit the model that was ordered")
    elif expect is not None and want < expect:
        yield fail(f"only {want} of the {expect} expected GPUs are usable here{note}"
                   + (f"; this {c.container} container was given {len(ctx.gpus)}" if c.not_given else ""),
                   value=want, expected=str(expect), details=c.values,
                   remedy=REMEDY_HIDDEN if hidden else
                   "give the container every GPU (--gpus all, or the pod's nvidia.com/gpu limit)")


def _pci_ids(ctx: Context) -> set[str]:
    return {f"{d.vendor:04x}:{d.device:04x}" for d in ctx.pci_gpus}


def _torch_problems(c: _Counts, visible: Any, torch: Any, want: int, note: str) -> Iterator[Result]:
    if visible.hides_all and c.answering:
        yield fail(f"CUDA_VISIBLE_DEVICES={visible.raw!r} hides all {len(c.answering)} GPU(s): "
                   "torch would train on the CPU", value=visible.raw, expected="GPUs visible",
                   details=c.values, remedy=REMEDY_HIDDEN)
    elif torch.error:
        yield fail(f"torch cannot use CUDA: {torch.error}", details=c.values,
                   remedy="match torch's CUDA build to the driver (see cuda-compat)")
    elif torch.device_count != want:
        what = ("torch cannot use any of them: training would run on the CPU"
                if torch.device_count == 0 else f"torch sees {torch.device_count}")
        yield fail(f"{want} GPU(s) usable{note}, {what}", value=torch.device_count,
                   expected=str(want), details=c.values,
                   remedy="install a CUDA build of torch that matches the driver; check "
                          "CUDA_VISIBLE_DEVICES and container --gpus settings")


@check("gpu-count", code="INV004", title="every GPU on the PCI bus is seen by NVML and torch",
       stage="inventory", needs=("driver-loaded",), nvml=("compute_capability",),
       # gpu: torch + CUDA init
       budget=Budget(value=10, cost=Cost(cpu=1, gpu=5), source="estimated"))
def gpu_count(ctx: Context) -> Iterator[Result]:
    """Counts the GPUs on the PCI bus, in NVML and in torch (CUDA_VISIBLE_DEVICES applied)
    against --expect-gpus and the platform (an NVSwitch baseboard holds profile gpus_per_node),
    and their PCI IDs against --expect-gpu-ids (the model provisioning saw).
    A GPU NVML reports lost, or one on the bus NVML does not list, is named by its PCI address;
    in a container GPUs that were not given to it (no /dev/nvidiaN) are not faults."""
    pci = [d.address for d in ctx.pci_gpus]
    seen = {g.device.pci for g in ctx.gpus}
    c = _Counts(pci=pci, answering=[g for g in ctx.gpus if not g.lost],
                lost=[g for g in ctx.gpus if g.lost], missing=[a for a in pci if a not in seen],
                container=ctx.hw.container(), nodes=ctx.hw.gpu_device_nodes(), values={})
    c.values.update(pci=len(pci), nvml=len(c.answering), lost=len(c.lost))
    problems = [*_nvml_problems(ctx, c), *_platform_problems(ctx, c)]
    visible = ctx.cuda_visible()
    want = visible.count(len(c.answering))
    note = visible.note()
    c.values["cuda_visible"] = want
    problems += _expectation_problems(ctx, c, want, note, visible.raw is not None)
    torch = ctx.hw.torch()
    c.values["torch"] = torch.device_count
    problems += _torch_problems(c, visible, torch, want, note)
    if problems:
        yield from problems
        return
    summary = f"{len(pci)} on PCI, {len(c.answering)} in NVML, {torch.device_count} in torch{note}"
    if c.not_given:
        summary += f"; {len(c.not_given)} on the bus not given to this {c.container} container"
    if visible.mig:
        yield warn(f"{summary}: MIG instance(s) {', '.join(visible.mig)} selected; a process "
                   "uses only the first", value=torch.device_count, details=c.values,
                   remedy="verify whole GPUs (MIG off) before accepting a node for training")
    elif visible.raw is not None and want < len(c.answering):
        yield warn(f"{summary}: only {want} of {len(c.answering)} GPU(s) are verified",
                   value=torch.device_count, expected=str(len(c.answering)), details=c.values,
                   remedy=REMEDY_HIDDEN)
    else:
        yield passed(summary, value=torch.device_count, expected=str(want), details=c.values)


def _branch(version: str) -> int | None:
    match = re.match(r"(\d+)", version)
    return int(match.group(1)) if match else None


@check("driver-version", code="INV005", title="driver version: kernel vs library vs expected",
       stage="inventory", needs=("driver-loaded",),
       budget=Budget(value=7, cost=Cost(cpu=1, gpu=1), source="measured cpu"))
def driver_version(ctx: Context) -> Result:
    """Loaded kernel module (/proc/driver/nvidia/version) must equal the user-space library
    (NVML) and meet --expect-driver (branch or exact) or the profile's driver.min_branch."""
    library = ctx.hw.nvml().driver_version()
    proc = ctx.hw.proc_driver_version() or ""
    match = re.search(r"\b(\d{3,}\.\d+(?:\.\d+)?)\b", proc)
    kernel = match.group(1) if match else None
    if kernel is None:
        return error(f"cannot parse the loaded driver version from {proc[:80]!r}")
    if kernel != library:
        return fail(f"loaded kernel module {kernel} != user-space library {library} "
                    "(\"Driver/library version mismatch\")", value=kernel, expected=library,
                    remedy="the driver was upgraded without a reboot (or unattended-upgrades "
                           "replaced it): reboot, and hold the driver packages")
    expect = ctx.options.expect_driver
    if expect:
        ok = library == expect or (expect.isdigit() and _branch(library) == int(expect))
        if not ok:
            return fail(f"driver {library}, expected {expect}", value=library, expected=expect,
                        remedy=f"provision driver branch {expect} (nvidia_driver_branch) and reboot")
        return passed(f"driver {library} (expected {expect})", value=library, expected=expect)
    minimum = int(ctx.profile.require("driver.min_branch"))
    branch = _branch(library)
    if branch is None or branch < minimum:
        return fail(f"driver {library} is older than branch {minimum}", value=library,
                    expected=f">= {minimum}", remedy="upgrade the driver branch (make provision)")
    return passed(f"driver {library} (kernel module and library agree)", value=library,
                  expected=f">= {minimum}")


def _cuda_tuple(text: str) -> tuple[int, int]:
    major, _, minor = text.partition(".")
    return int(major), int(minor or 0)


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text))


@check("cuda-compat", code="INV006", title="driver supports torch's CUDA version",
       stage="inventory", needs=("driver-loaded",), nvml=("compute_capability",),
       budget=Budget(value=9, cost=Cost(cpu=1, gpu=1), source="measured cpu"))
def cuda_compat(ctx: Context) -> Result:
    """torch.version.cuda against the CUDA version the driver supports (NVML). Newer major:
    FAIL. Same major, newer minor: runs under CUDA minor version compatibility when the driver
    is at least the family's minimum (profile cuda.minor_compat_min_driver), with a limited
    feature set (PTX of the newer toolkit cannot be JIT-compiled): WARN naming the rule."""
    raw = ctx.hw.nvml().cuda_driver_version()
    driver_cuda = (raw // 1000, (raw % 1000) // 10)
    shown = f"{driver_cuda[0]}.{driver_cuda[1]}"
    torch = ctx.hw.torch()
    if torch.version is None:
        return fail(f"torch is not importable: {torch.error}", expected="torch installed",
                    remedy="install torch into this environment (make provision)")
    if torch.cuda is None:
        return fail(f"torch {torch.version} is a CPU-only build on a GPU host", value=None,
                    expected=f"CUDA <= {shown}",
                    remedy=f"install a CUDA build of torch for CUDA <= {shown} "
                           "(pytorch_index_url in the pytorch role)")
    expect = ctx.options.expect_cuda
    if expect and driver_cuda < _cuda_tuple(expect):
        return fail(f"driver supports CUDA {shown}, expected >= {expect}", value=shown,
                    expected=f">= {expect}", remedy="upgrade the driver branch")
    built = _cuda_tuple(torch.cuda)
    if built[0] > driver_cuda[0]:
        return fail(f"torch {torch.version} is built for CUDA {torch.cuda}, a newer major version "
                    f"than the driver's CUDA {shown}: CUDA will not initialise",
                    value=torch.cuda, expected=f"CUDA {driver_cuda[0]}.x",
                    remedy=f"install torch built for CUDA {driver_cuda[0]}.x, or upgrade the "
                           "driver to a branch that supports CUDA " + str(built[0]))
    if built > driver_cuda:
        driver = ctx.hw.nvml().driver_version()
        minimum = (ctx.profile.get("cuda.minor_compat_min_driver") or {}).get(str(built[0]))
        if minimum is None or _version_tuple(driver) < _version_tuple(str(minimum)):
            return fail(f"torch CUDA {torch.cuda} is newer than the driver's CUDA {shown} and "
                        f"driver {driver} is below the minor-version-compatibility minimum "
                        f"{minimum or 'unknown'} for CUDA {built[0]}.x", value=torch.cuda,
                        expected=f"<= {shown}",
                        remedy=f"install torch built for CUDA <= {shown}, or upgrade the driver")
        return warn(f"torch CUDA {torch.cuda} is newer than the driver's CUDA {shown}: it runs "
                    f"under CUDA minor version compatibility (CUDA {built[0]}.x on driver >= "
                    f"{minimum}), without PTX JIT of newer kernels", value=torch.cuda,
                    expected=f"<= {shown}",
                    remedy=f"for the full feature set install torch built for CUDA <= {shown} "
                           "or upgrade the driver")
    return passed(f"torch CUDA {torch.cuda} <= driver CUDA {shown}", value=torch.cuda,
                  expected=f"<= {shown}")


@check("torch-arch", code="INV007", title="torch is compiled for every GPU's architecture",
       stage="inventory", needs=("driver-loaded",), scope="gpus", nvml=("compute_capability",),
       budget=Budget(value=9, cost=Cost(cpu=1, gpu=1), source="measured cpu"))
def torch_arch(ctx: Context) -> Iterator[Result]:
    """Every GPU's compute capability is in torch.cuda.get_arch_list() (sm_XY, or a compute_XY
    PTX target at or below it). Also reports torch's NCCL and cuDNN versions."""
    torch = ctx.hw.torch()
    if torch.cuda is None:
        yield skip("torch is a CPU-only build (see cuda-compat)")
        return
    sm = {int(a[3:]) for a in torch.arch_list if a.startswith("sm_") and a[3:].isdigit()}
    ptx = {int(a[8:]) for a in torch.arch_list if a.startswith("compute_") and a[8:].isdigit()}
    versions = f"NCCL {torch.nccl or 'absent'}, cuDNN {torch.cudnn or 'absent'}"
    details = {"arch_list": torch.arch_list, "nccl": torch.nccl, "cudnn": torch.cudnn}
    caps: set[int] = set()
    problems = 0
    for gpu in ctx.gpus:
        if gpu.lost:
            problems += 1
            yield error("not measured: NVML answers GPU_IS_LOST for this GPU (see gpu-count)",
                        device=gpu.device)
            continue
        try:
            major, minor = gpu.handle.query("compute_capability")
        except HardwareError as exc:
            problems += 1
            yield error(f"cannot read compute capability: {exc}", device=gpu.device)
            continue
        cap = major * 10 + minor
        caps.add(cap)
        # Binary compatibility holds within a major version; PTX JIT-compiles for newer GPUs.
        if cap not in sm and not any(s // 10 == major and s <= cap for s in sm) and \
                not any(p <= cap for p in ptx):
            problems += 1
            yield fail(f"torch {torch.version} has no kernels for compute capability "
                       f"{major}.{minor}", value=f"{major}.{minor}",
                       expected=" ".join(torch.arch_list), device=gpu.device, details=details,
                       remedy="install a torch build whose arch list includes this GPU "
                              "(newer torch / CUDA)")
    if torch.nccl is None:
        problems += 1
        yield fail(f"torch {torch.version} has no NCCL: multi-GPU training cannot run",
                   details=details, remedy="install an official CUDA build of torch")
    shown = ", ".join(f"{c // 10}.{c % 10}" for c in sorted(caps))
    if not problems:
        yield passed(f"arch list covers compute capability {shown}; {versions}", value=shown,
                     details=details)
