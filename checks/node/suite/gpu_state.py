"""Whether the driver lets work onto each GPU now (NVML, one result per GPU): compute mode, a
recovery action the driver asks for, MIG mode."""

from __future__ import annotations

from collections.abc import Iterator

from checks.model import Result, fail, passed, warn
from checks.node.context import Context, Gpu
from checks.node.perdevice import each_gpu
from checks.node.registry import Budget, Cost, check

DRIVER = ("driver-loaded",)


@check("compute-mode", code="GPU020", title="compute mode lets training processes in",
       needs=DRIVER, scope="gpu", nvml=("compute_mode",),
       budget=Budget(value=8, cost=Cost(cpu=1, gpu=1), source="measured cpu"))
def compute_mode(ctx: Context) -> Iterator[Result]:
    """PROHIBITED admits no CUDA context (nothing can train) and fails. EXCLUSIVE_PROCESS
    admits one process per GPU: training with one rank per GPU works, tools that open a second
    context on a GPU do not, so it is reported (WARN) and the workload checks keep to one
    process per GPU. DEFAULT passes."""

    def measure(gpu: Gpu) -> Result:
        mode = str(gpu.handle.query("compute_mode"))
        if mode == "prohibited":
            return fail("compute mode PROHIBITED: no process can use this GPU", value=mode,
                        expected="default",
                        remedy="nvidia-smi -i N -c DEFAULT (and find what set it: a scheduler "
                               "prolog, or an administrator taking the GPU out of service)")
        if mode == "exclusive_process":
            return warn("compute mode EXCLUSIVE_PROCESS: one process per GPU", value=mode,
                        expected="default",
                        remedy="fine for one rank per GPU; set DEFAULT (nvidia-smi -c 0) for "
                               "jobs that share a GPU or run monitoring tools with a context")
        return passed(f"compute mode {mode.upper()}", value=mode, expected="default")

    yield from each_gpu(ctx, measure)


# What to do for each action NVML names (nvml.h, nvmlGpuRecoveryAction_t; NVIDIA's XID catalog
# gives the same remedies per XID). Anything but "none" means the GPU is not fit for work now.
RECOVERY_REMEDIES = {
    "gpu_reset": "stop the GPU's processes, then reset it: sudo nvidia-smi -r -i N",
    "bus_reset": "stop the GPU's processes, then reset it (a bus reset): sudo nvidia-smi -r -i N",
    "node_reboot": "drain the node and reboot it",
    "system_reboot": "drain the node and power-cycle it (a warm reboot is not enough)",
    "drain_p2p": "stop the jobs that use peer-to-peer/NVLink traffic on this GPU (drain), then "
                 "check again; reset the GPU if the action stays",
    "drain_and_reset": "drain the node's jobs, then reset the GPU: sudo nvidia-smi -r -i N",
    "recover_imex_domain": "recover the NVLink domain: restart nvidia-imex on the domain's nodes",
}


@check("gpu-recovery-action", code="GPU015", title="the driver asks for no GPU reset or reboot",
       needs=DRIVER, scope="gpu", nvml=("recovery_action",),
       # one NVML field read per GPU, as ecc-errors; a reset or reboot the driver asks for kills jobs
       budget=Budget(value=10, cost=Cost(cpu=1, gpu=1), source="estimated"))
def gpu_recovery_action(ctx: Context) -> Iterator[Result]:
    """NVML's recovery action for each GPU (nvmlDeviceGetFieldValues,
    NVML_FI_DEV_GET_GPU_RECOVERY_ACTION): NONE passes; GPU_RESET, BUS_RESET, NODE_REBOOT,
    SYSTEM_REBOOT, DRAIN_P2P, DRAIN_AND_RESET and RECOVER_IMEX_DOMAIN FAIL with that remedy,
    whether or not an XID line reached the kernel log; a value this tool does not know WARNs.
    A driver before the field answers through the two fields it replaced (reset required,
    drain and reset recommended: GPU_RESET / DRAIN_AND_RESET); one with none of them SKIPs."""

    def measure(gpu: Gpu) -> Result:
        action = str(gpu.handle.query("recovery_action"))
        if action == "none":
            return passed("the driver asks for no recovery action", value=action,
                          expected="none")
        remedy = RECOVERY_REMEDIES.get(action)
        if remedy is None:
            return warn(f"the driver reports recovery action {action}, which this tool does "
                        "not know", value=action, expected="none",
                        remedy="see nvidia-smi -q and NVIDIA's XID catalog for the action")
        return fail(f"the driver says this GPU needs {action.upper()}", value=action,
                    expected="none", remedy=remedy)

    yield from each_gpu(ctx, measure)


@check("mig-mode", code="GPU012", title="MIG mode as expected", needs=DRIVER,
       scope="gpu", nvml=("mig_mode",),
       budget=Budget(value=7, cost=Cost(cpu=1, gpu=1), source="measured cpu"))
def mig_mode(ctx: Context) -> Iterator[Result]:
    """Training nodes normally run with MIG off (profile mig.expected)."""
    expected = bool(ctx.profile.get("mig.expected"))

    def measure(gpu: Gpu) -> Result:
        enabled = bool(gpu.handle.query("mig_mode"))
        shown = "enabled" if enabled else "disabled"
        if enabled != expected:
            return warn(f"MIG {shown}, expected {'enabled' if expected else 'disabled'}",
                        value=enabled, remedy="nvidia-smi -mig 0 (or 1) and reset the GPU")
        return passed(f"MIG {shown}", value=enabled)

    yield from each_gpu(ctx, measure)
