"""RDMA write bandwidth per GPU-NIC pair with perftest's ib_write_bw (issue 11).

For every GPU its nearest compute NIC (the rails map of rdma-rails), one loopback run on that NIC
with the GPU's memory (`--use_cuda`): the GPUDirect path from GPU over PCIe into the HCA. On a
host without GPUs every compute NIC with host memory. The average must reach a fraction of the
port's line rate (profile rdma.write_bw_min_fraction, default 0.9: Azure's NHC gates GPUDirect
ib_write_bw at 180 Gb/s per 200 Gb/s HDR port on NDv4 and 360 per 400 Gb/s NDR port on ND H200
v5, where 399.7 Gb/s was measured: azurehpc-health-checks PR#38/#73, conf/nd96isr_h200_v5.conf,
issue #152). SKIP with the reason without RDMA devices or without perftest; never PASS without a
measurement.

The loopback's server and client are two processes, each with a CUDA context on its GPU. Under
compute mode EXCLUSIVE_PROCESS a GPU admits one process's context (NVML's
nvmlDeviceGetComputeMode), so the server's buffer goes on another GPU this process has (one
that admits contexts); with no such GPU the pair SKIPs with the reason. A PROHIBITED GPU admits
no context at all: its pair SKIPs (compute-mode FAILs it).
"""

from __future__ import annotations

from typing import Any

from checks.hw.base import HardwareError, NotSupported, RdmaDevice
from checks.hw.perftest import PerftestOutputError, cuda_ordinal, parse_write_bw
from checks.model import Device, Result, error, fail, passed, skip
from checks.node import rules
from checks.node import workload_plan as plan
from checks.node.context import Context
from checks.node.registry import Budget, Cost, check
from checks.node.suite.fabric_links import NO_RDMA, compute_nics, rails_map

BASE_PORT = 18515  # perftest's default port; one more per pair, runs are sequential


def _line_rate(nic: RdmaDevice) -> float | None:
    rates = [p.rate_gbps for p in nic.ports if p.rate_gbps is not None and p.up]
    return max(rates) if rates else None


@check("rdma-write-bw", code="NET009",
       title="ib_write_bw per GPU-NIC pair at a fraction of the port's line rate",
       level="standard", stage="workload", tags=("fabric", "rdma"), timeout_s=900.0,
       gated_by=("gpu-occupied",),
       # ib_write_bw loopback per GPU-NIC pair: -D 5 plus start-up (~2 s) each; a host without GPUs measures
       # each compute NIC (one assumed), and SKIPs at once without RDMA devices or perftest
       budget=Budget(value=7, cost=Cost(cpu=8, gpu=2, per_gpu=8), source="estimated"))
def rdma_write_bw(ctx: Context) -> list[Result]:
    """Loopback ib_write_bw on each GPU's nearest compute NIC (with --use_cuda on GPU hosts;
    every compute NIC with host memory where there are no GPUs). FAIL below
    rdma.write_bw_min_fraction of the port's rate; ERROR when perftest ran but reported no
    bandwidth (its own message is quoted); SKIP without RDMA devices or perftest."""
    try:
        devices = ctx.hw.rdma_devices()
    except HardwareError as exc:
        return [error(f"RDMA devices not readable: {exc}")]
    if not devices:
        return [skip(NO_RDMA)]
    tool = ctx.hw.perftest()
    if tool is None:
        return [skip("perftest is not installed (no ib_write_bw): RDMA bandwidth not measured; "
                     "the rdma role installs it")]
    fraction = float(ctx.profile.get("rdma.write_bw_min_fraction"))
    duration = int(ctx.profile.get("rdma.write_bw_duration_s"))
    size = int(ctx.profile.get("rdma.write_bw_message_bytes"))
    nics = {n.name: n for n in compute_nics(ctx, devices)}
    # (client CUDA ordinal, server CUDA ordinal, NIC, GPU label)
    pairs: list[tuple[int | None, int | None, str, str | None]] = []
    results: list[Result] = []
    if ctx.pci_gpus and tool.get("cuda"):
        cuda_pcis = _cuda_pcis(ctx)
        modes = _modes(ctx)
        for rail in rails_map(ctx, list(nics.values())):
            if rail.nic is None:
                continue
            where = Device(name=rail.gpu, pci=rail.gpu_pci)
            ordinal = cuda_ordinal(rail.gpu_pci, cuda_pcis)
            if ordinal is None:
                results.append(skip(f"{rail.gpu}: not one of the GPUs the driver gives this "
                                    "process (NVML lists it not): its NIC path is not measured "
                                    "here", device=where))
                continue
            mode = modes.get(rail.gpu_pci.lower())
            if mode == plan.PROHIBITED:
                results.append(skip(f"{rail.gpu}: compute mode PROHIBITED: no process may "
                                    "create a CUDA context there, so its NIC path cannot be "
                                    "measured (the compute-mode check FAILs it)", device=where))
                continue
            server: int | None = ordinal
            if mode == plan.EXCLUSIVE:
                server = _server_gpu(rail.gpu_pci, cuda_pcis, modes)
                if server is None:
                    results.append(skip(
                        f"{rail.gpu}: compute mode EXCLUSIVE_PROCESS admits one process's CUDA "
                        "context and no other GPU here can hold the loopback server's buffer: "
                        "ib_write_bw's server and client cannot both open this GPU",
                        device=where))
                    continue
            pairs.append((ordinal, server, rail.nic, rail.gpu))
    else:
        if ctx.pci_gpus:
            results.append(skip(f"{tool.get('path')} is built without CUDA (no --use_cuda: "
                                "Debian's and Ubuntu's perftest): the GPU-NIC path is not "
                                "measured; each NIC is measured with host memory"))
        pairs = [(None, None, name, None) for name in sorted(nics)]
    for n, (gpu, server, nic, label) in enumerate(pairs):
        results.append(_measure(ctx, nics[nic], gpu, label, fraction, duration, size,
                                BASE_PORT + n, server))
    return results or [skip("no compute NIC to measure")]


def _cuda_pcis(ctx: Context) -> list[str]:
    """PCI addresses of the GPUs NVML (and so CUDA) sees in this process."""
    try:
        return [g.device.pci for g in ctx.gpus if g.device.pci]
    except HardwareError:
        return []


def _modes(ctx: Context) -> dict[str, str | None]:
    """PCI address (lower case) -> compute mode (None when NVML cannot say)."""
    try:
        gpus = ctx.gpus
    except HardwareError:
        return {}
    return {str(g.device.pci).lower(): plan.compute_mode(g) for g in gpus if g.device.pci}


def _server_gpu(client_pci: str, cuda_pcis: list[str], modes: dict[str, str | None]
                ) -> int | None:
    """The CUDA ordinal of another GPU for the loopback server of an EXCLUSIVE_PROCESS GPU:
    the first in PCI order that admits a context (not PROHIBITED, whose mode NVML reads)."""
    for pci in sorted(p.lower() for p in cuda_pcis):
        if pci != client_pci.lower() and modes.get(pci) not in (plan.PROHIBITED, None):
            return cuda_ordinal(pci, cuda_pcis)
    return None


def _measure(ctx: Context, nic: RdmaDevice, gpu: int | None, label: str | None,
             fraction: float, duration: int, size: int, port: int,
             server_gpu: int | None = None) -> Result:
    name = f"{label} -> {nic.name}" if label else f"{nic.name} (host memory)"
    device = Device(name=name, pci=nic.pci_address)
    rate = _line_rate(nic)
    if rate is None:
        return skip(f"{name}: no ACTIVE port with a known rate (see rdma-ports): not measured",
                    device=device)
    try:
        run = ctx.hw.workload("ib_write_bw", nic=nic.name, gpu=gpu, server_gpu=server_gpu,
                              port=port, duration_s=duration, size=size,
                              timeout_s=duration * 4 + 30.0)
    except NotSupported as exc:
        return skip(f"{name}: {exc}", device=device)
    details: dict[str, Any] = {"argv": run.get("argv"), "returncode": run.get("returncode"),
                               "line_rate_gbps": rate, "min_fraction": fraction,
                               "gpu": gpu, "server_gpu": server_gpu, "nic": nic.name}
    if run.get("timed_out"):
        return error(f"{name}: ib_write_bw did not finish in time", device=device,
                     details={**details, "output_tail": str(run.get("output", ""))[-400:]})
    try:
        bw = parse_write_bw(str(run.get("output") or ""))
    except PerftestOutputError as exc:
        return error(f"{name}: ib_write_bw reported no bandwidth: {exc}", device=device,
                     details={**details, "output_tail": str(run.get("output", ""))[-400:]},
                     remedy="run the printed command by hand; check the port (rdma-ports), "
                            "memlock limits and, with --use_cuda, nvidia_peermem "
                            "(gpudirect-rdma)")
    floor = fraction * rate
    details.update(bytes=bw.bytes, iterations=bw.iterations, average_gbps=bw.average_gbps,
                   unit=bw.unit)
    text = (f"{name}: {bw.average_gbps:.1f} Gb/s average ({bw.bytes} B messages) of a "
            f"{rate:g} Gb/s port")
    if server_gpu is not None and server_gpu != gpu:
        text += (f" (loopback server on CUDA GPU {server_gpu}: this GPU is in compute mode "
                 "EXCLUSIVE_PROCESS)")
    kw: dict[str, Any] = {"device": device, "details": details, "value": round(bw.average_gbps, 2),
                          "unit": "Gb/s", "expected": f">= {floor:g} Gb/s ({fraction:g} x line rate)"}
    if rules.below(bw.average_gbps, floor):
        return fail(f"{text}, below {fraction:g} x line rate ({floor:g} Gb/s)",
                    remedy="compare with the other pairs: one slow GPU-NIC pair points at its PCIe "
                           "path (link width/speed of GPU and NIC, ACS: pcie-acs) or GPUDirect "
                           "(gpudirect-rdma); all slow points at the NIC firmware or settings",
                    **kw)
    return passed(text, **kw)
