"""What the recorder reads from the host, outside NVML: OS and kernel facts, services, the
kernel log (the lines the checks care about), the environment, storage and swap, the BMC through
ipmitool, and the RDMA devices with the ACS bits of the PCI bridges above them. Each is written
in the `host:` and `rdma:` spelling of a scenario (checks/node/record/recorder.py assembles them)."""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Any

from checks import report_schema as report
from checks.hw.base import NotSupported
from checks.node.record.reads import MISSING, Reads, drop_missing, one_line
from checks.node.redact import mask_cmdline_secrets

SERVICES = ("nvidia-fabricmanager", "nvidia-persistenced", "nvidia-imex", "nvlsm")
# The report's environment allow-list (checks/schema/recorded-env.yaml) plus the variables Slurm
# sets for a job's GPUs, so a simulated run sees the same environment the checks saw; values of
# secret-looking names are masked, as in the report.
ENV_NAMES = frozenset({"GPU_DEVICE_ORDINAL"})
SLURM_GPU_RE = re.compile(r"SLURM_\w*GPU")
# Kernel-log lines any check or a reader of the recording cares about. Journal notices ("-- No
# entries --") are kept too: they say the log could not really be read.
# Every pattern is matched in time linear in the line (a kernel-log line can be 1 MB): no
# "A.*B" alternative, which retries from every A; mlx5 lines are judged by kernel_log_wanted.
KERNEL_LOG_RE = re.compile(r"NVRM|\bS?Xid\b|\bAER\b|nvidia|nvswitch|nvlink|fallen off the bus|"
                           r"PCIe Bus Error|^-- ", re.IGNORECASE)
MLX5_RE = re.compile(r"mlx5", re.IGNORECASE)
MLX5_ABOUT_RE = re.compile(r"bandwidth|PCIe", re.IGNORECASE)
KERNEL_LOG_MAX = 300


def kernel_log_wanted(line: str) -> bool:
    """Whether the recording keeps this kernel-log line: KERNEL_LOG_RE, or an mlx5 line about
    its bandwidth or PCIe link (bandwidth/PCIe after the first "mlx5"), in one pass each."""
    if KERNEL_LOG_RE.search(line):
        return True
    m = MLX5_RE.search(line)
    return bool(m and MLX5_ABOUT_RE.search(line, m.end()))


def environment(environ: Any) -> dict[str, str]:
    return {str(k): report.env_value(str(k), str(v)) for k, v in sorted(dict(environ).items())
            if report.env_recorded(str(k)) or str(k) in ENV_NAMES or SLURM_GPU_RE.match(str(k))}


class HostReads(Reads):
    """The host's facts, each read through `Reads.fact` (a failure is a gap or `{error: text}`)."""

    # -- host ---------------------------------------------------------------------------------
    def host(self) -> dict[str, Any]:
        hw = self.hw
        host: dict[str, Any] = {
            "os_release": self.fact("os_release", hw.os_release),
            "kernel": self.fact("kernel_release", hw.kernel_release),
            "cpu_count": self.fact("cpu_count", hw.cpu_count),
            "numa_nodes": self.fact("numa_nodes", hw.numa_nodes),
        }
        shm = self.fact("shm", lambda: dataclasses.asdict(hw.shm()), errors_ok=True)
        if isinstance(shm, dict) and "error" in shm:
            host["shm_bytes"] = shm
        elif shm is not MISSING:
            host["shm_bytes"], host["shm_free_bytes"] = shm["total_bytes"], shm["free_bytes"]
        memlock = self.fact("memlock_limit", hw.memlock_limit)
        host["memlock"] = "unlimited" if memlock == -1 else memlock
        host["secure_boot"] = self.fact("secure_boot", hw.secure_boot)
        host["modules"] = self.fact("loaded_modules", hw.loaded_modules, errors_ok=True)
        signer = self.fact("module_signer(nvidia)", lambda: hw.module_signer("nvidia"))
        if signer not in (None, MISSING):
            host["module_signers"] = {"nvidia": signer}
        host["services"] = {unit: self.fact(f"service_state({unit})",
                                            functools.partial(hw.service_state, unit))
                            for unit in SERVICES}
        host["kernel_log"] = self.kernel_log()
        host["env"] = self.fact("environ", lambda: environment(hw.environ()))
        host["virtualization"] = self.fact("virtualization", hw.virtualization)
        host["container"] = self.fact("container", hw.container)
        host["device_nodes"] = self.fact("gpu_device_nodes", hw.gpu_device_nodes)
        host["fabric_manager_version"] = self.fact("fabric_manager_version",
                                                   hw.fabric_manager_version)
        host["imex_nodes"] = self.fact("imex_nodes_config", hw.imex_nodes_config,
                                       errors_ok=True)
        host["dmi_product"] = self.fact("dmi_product", hw.dmi_product)
        host["services"] = drop_missing(host["services"])
        host["memory_peers"] = self.fact("memory_peers", hw.memory_peers)
        host["net_interfaces"] = self.fact("net_interfaces", hw.net_interfaces)
        self.storage(host)
        return drop_missing(host)

    def storage(self, host: dict[str, Any]) -> None:
        """The Python environment's paths, the file systems under them, and swap (disk-space
        and swap checks). What the backend does not provide (NotSupported) is left out, so the
        simulation answers the same way."""
        hw = self.hw
        paths = self.fact("python_paths", hw.python_paths)
        if paths is MISSING:
            return
        host["python_paths"] = paths
        disks: dict[str, Any] = {}
        for path in paths.values():
            try:
                du = self.read(functools.partial(hw.disk_usage, path))
            except NotSupported:
                disks = {}
                break
            except Exception as exc:  # written down as the simulation's answer
                disks[path] = {"error": one_line(exc)}
                continue
            disks[du.path] = {"total_bytes": du.total_bytes, "free_bytes": du.free_bytes}
        if disks:
            host["disks"] = disks
        try:
            host["swaps"] = [{"name": a.name, "type": a.kind, "size_bytes": a.size_bytes,
                              "used_bytes": a.used_bytes, "priority": a.priority}
                             for a in self.read(hw.swaps)]
        except NotSupported:
            pass
        except Exception as exc:
            host["swaps"] = {"error": one_line(exc)}
        self.bmc(host)

    def bmc(self, host: dict[str, Any]) -> None:
        """ipmitool and, with the in-band device, what `sdr` and `sel elist` answered."""
        tool = self.fact("ipmitool", self.hw.ipmitool)
        if not tool or tool is MISSING:
            return
        host["ipmitool"] = dict(tool)
        if not tool.get("device"):
            return
        for key, args in (("sdr", ("sdr",)), ("sel_elist", ("sel", "elist"))):
            try:
                run = self.hw.ipmi(args, self.timeout_s)
            except Exception as exc:  # the simulation answers with the same error
                host["ipmitool"][key] = {"error": one_line(exc)}
                continue
            host["ipmitool"][key] = ({"timed_out": True} if run.timed_out else
                                     {"rc": run.returncode, "stdout": run.stdout,
                                      "stderr": run.stderr})

    # -- RDMA fabric --------------------------------------------------------------------------
    def rdma(self, host: dict[str, Any]) -> Any:
        """`rdma:` devices as the scenario writes them, and host.acs for the bridges above the
        GPUs and the RDMA devices (read only where there are RDMA devices: it needs root)."""
        try:
            devices = self.read(self.hw.rdma_devices)
        except Exception as exc:
            return {"error": one_line(exc)}
        if not devices:
            return MISSING
        out = []
        for dev in devices:
            ports = []
            for p in dev.ports:
                rate = None
                if p.rate_gbps is not None:
                    inner = " ".join(x for x in (p.width, p.speed) if x)
                    rate = f"{p.rate_gbps:g} Gb/sec" + (f" ({inner})" if inner else "")
                ports.append({k: v for k, v in {
                    "port": p.port, "state": p.state, "phys_state": p.phys_state, "rate": rate,
                    "link_layer": p.link_layer, "gids": [dict(g) for g in p.gids] or None,
                    "active_mtu": p.active_mtu, "netdev": p.netdev,
                    "counters": dict(p.counters)}.items() if v is not None})
            out.append({k: v for k, v in {
                "name": dev.name, "fw_ver": dev.fw_ver, "hca_type": dev.hca_type,
                "pci_address": dev.pci_address, "numa_node": dev.numa_node,
                "pci_path": list(dev.pci_path) or None, "ports": ports}.items()
                if v is not None})
        try:
            bridges = {b for d in self.read(self.hw.pci_devices) for b in d.pci_path}
        except Exception:
            bridges = set()
        bridges |= {b for d in devices for b in d.pci_path}
        acs = {}
        for bridge in sorted(bridges):
            value = self.fact(f"pci_acs_control({bridge})",
                              functools.partial(self.hw.pci_acs_control, bridge), errors_ok=True)
            if value is not None:
                acs[bridge] = value
        if acs:
            host["acs"] = acs
        return {"devices": out}

    def kernel_log(self) -> Any:
        lines = self.fact("kernel_log", self.hw.kernel_log, errors_ok=True)
        if not isinstance(lines, list):
            return lines
        kept = [mask_cmdline_secrets(str(line)) for line in lines if kernel_log_wanted(str(line))]
        if len(kept) > KERNEL_LOG_MAX:
            self.notes.append(f"kernel log: kept the latest {KERNEL_LOG_MAX} of {len(kept)} "
                              f"matching lines ({len(lines)} lines in all)")
            kept = kept[-KERNEL_LOG_MAX:]
        return kept
