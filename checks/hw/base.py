"""The hardware-access boundary: the only interface through which checks see the machine.

Two implementations: `linux.LinuxBackend` (sysfs, /proc, NVML, the kernel log, torch) and
`fixture.FixtureBackend` (a scenario file). Checks receive a `Backend` and never know which.
"""

from __future__ import annotations

import abc
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

NVIDIA_VENDOR = 0x10DE
# PCI class codes (class << 8 | subclass): display VGA, 3D controller, bridge "other" (NVSwitch).
CLASS_VGA = 0x0300
CLASS_3D = 0x0302
CLASS_BRIDGE_OTHER = 0x0680


class HardwareError(Exception):
    """A source could not be read (permission, I/O, library failure)."""


class NotSupported(HardwareError):
    """The device or driver does not implement this query. Distinct from a failure."""


class NoPermission(HardwareError):
    """The query needs privileges this process lacks (NVML's NO_PERMISSION): nothing is known
    about the value, and nothing is wrong with the GPU."""


class NvmlUnavailable(HardwareError):
    """NVML could not be initialised. `kind` says why: library_missing, driver_not_loaded, ..."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class GpuLost(HardwareError):
    """NVML reports the GPU as lost (fell off the bus)."""


@dataclass(frozen=True)
class PciDevice:
    address: str  # 0000:3b:00.0
    vendor: int
    device: int
    class_code: int  # 24-bit class; class_code >> 8 is class/subclass
    driver: str | None = None
    numa_node: int | None = None
    current_link_speed: str | None = None  # as sysfs prints it: "16.0 GT/s PCIe"
    max_link_speed: str | None = None
    current_link_width: int | None = None
    max_link_width: int | None = None
    # Upstream bridges from the root port down to (not including) this device, as the sysfs
    # path /sys/devices/pci0000:00/<root port>/<switch up>/<switch down>/<device> lists them.
    # Two devices behind one PCIe switch share a bridge below the root port.
    pci_path: tuple[str, ...] = ()

    @property
    def base_class(self) -> int:
        return self.class_code >> 8

    @property
    def is_nvidia_gpu(self) -> bool:
        return self.vendor == NVIDIA_VENDOR and self.base_class in (CLASS_VGA, CLASS_3D)

    @property
    def is_nvswitch(self) -> bool:
        return self.vendor == NVIDIA_VENDOR and self.base_class == CLASS_BRIDGE_OTHER


@dataclass(frozen=True)
class ShmInfo:
    total_bytes: int
    free_bytes: int


@dataclass
class TorchInfo:
    """What the installed torch sees. `error` set when torch could not be imported."""

    version: str | None = None
    cuda: str | None = None  # torch.version.cuda, None for a CPU build
    cuda_available: bool = False
    device_count: int = 0
    arch_list: list[str] = field(default_factory=list)
    nccl: str | None = None
    cudnn: int | None = None
    capabilities: list[tuple[int, int]] = field(default_factory=list)
    device_names: list[str] = field(default_factory=list)
    error: str | None = None


# --- RDMA fabric. Read by checks/hw/rdma.py from /sys/class/infiniband. ---------
@dataclass(frozen=True)
class RdmaPort:
    """One port of an RDMA device as sysfs (and ibv_devinfo, for the MTU) describes it."""

    port: int
    state: str  # "ACTIVE", "DOWN", "INIT", "ARMED" (sysfs prints "4: ACTIVE")
    phys_state: str  # "LinkUp", "Polling", "Disabled", ... ("5: LinkUp")
    rate_gbps: float | None = None  # 400.0 from "400 Gb/sec (4X NDR)"
    width: str | None = None  # "4X"
    speed: str | None = None  # "NDR", "HDR", ... (the text in brackets after the width)
    link_layer: str | None = None  # "InfiniBand" or "Ethernet" (RoCE)
    # Non-zero GIDs with their types: [{"index": 3, "gid": "0000:...", "type": "RoCE v2"}]
    gids: tuple[dict[str, Any], ...] = ()
    active_mtu: int | None = None  # bytes, from ibv_devinfo (IB) or the netdev (RoCE)
    netdev: str | None = None  # the Ethernet interface behind a RoCE port
    counters: Mapping[str, int] = field(default_factory=dict)  # ports/N/counters/*

    @property
    def up(self) -> bool:
        """Logically and physically up: the only state that carries traffic."""
        return self.state == "ACTIVE" and self.phys_state == "LinkUp"


@dataclass(frozen=True)
class RdmaDevice:
    name: str  # mlx5_0
    fw_ver: str | None = None
    hca_type: str | None = None  # "MT4129" (ConnectX-7): firmware is compared within a type
    pci_address: str | None = None
    numa_node: int | None = None
    pci_path: tuple[str, ...] = ()  # bridges above the device, as PciDevice.pci_path
    ports: tuple[RdmaPort, ...] = ()


# Field names every GPU handle answers. Values: see linux/nvml.py for units.
GPU_FIELDS = (
    "name", "uuid", "pci_bus_id", "serial", "memory_total_bytes", "compute_capability",
    "persistence_mode", "ecc_mode", "ecc_volatile_uncorrected", "ecc_volatile_corrected",
    "ecc_aggregate_uncorrected", "ecc_aggregate_corrected", "retired_pages_sbe",
    "retired_pages_dbe", "retired_pages_pending", "remapped_rows", "pcie_gen_current",
    "pcie_gen_max", "pcie_width_current", "pcie_width_max", "pcie_replay_counter",
    "clock_event_reasons", "temperature_c", "temperature_slowdown_c", "temperature_shutdown_c",
    "power_w", "power_limit_w", "power_default_limit_w", "nvlink", "mig_mode", "sm_clock_mhz",
    "sm_clock_max_mhz", "utilization_gpu",
    # ECC counts by location where NVML gives them (Ampere+):
    #   {"sram": {"volatile_uncorrected": n, "volatile_corrected": n, "aggregate_uncorrected": n,
    #             "aggregate_corrected": n}, "dram": {...}}
    "ecc_by_location",
    # GPU fabric registration (NVSwitch / NVLink domain), nvmlDeviceGetGpuFabricInfo[V]:
    #   {"state": "not_supported"|"not_started"|"in_progress"|"completed",
    #    "status": "success" or the NVML error name, "cluster_uuid": str, "clique_id": int}
    "fabric_info",
    # "default" | "exclusive_process" | "prohibited" (nvmlDeviceGetComputeMode)
    "compute_mode",
    # N of /dev/nvidiaN (nvmlDeviceGetMinorNumber): which device node a container must be given
    "minor_number",
    # Occupancy before the jobs start (checks/node/suite/occupancy.py): memory in use (bytes,
    # nvmlDeviceGetMemoryInfo .used) and the compute processes holding a context,
    # [{"pid": int, "name": str | None, "used_memory_bytes": int | None}]
    # (nvmlDeviceGetComputeRunningProcesses; PIDs are the host's PID namespace).
    "memory_used_bytes", "compute_processes",
    # Firmware (checks/node/suite/firmware.py): nvmlDeviceGetVbiosVersion ("96.00.89.00.01") and
    # nvmlDeviceGetInforomImageVersion ("G520.0200.00.05").
    "vbios_version", "inforom_image_version",
    # What the driver says the GPU needs (nvmlDeviceGetFieldValues,
    # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION): "none" | "gpu_reset" | "node_reboot" | "drain_p2p" |
    # "drain_and_reset" | "recover_imex_domain" | "bus_reset" | "system_reboot" | "unknown(N)".
    "recovery_action",
    # Bus ids (sysfs form) of the other GPUs this one reaches over NVLink by the driver's own
    # peer-to-peer answer: nvmlDeviceGetP2PStatus(this, other, NVML_P2P_CAPS_INDEX_NVLINK) ==
    # NVML_P2P_STATUS_OK (NVML API reference, Device Queries). It names NVLink peers where the
    # per-link remote queries say nothing (bridged PCIe cards, switches off the host's PCI bus).
    "nvlink_p2p_peers",
)


# --- Storage, swap, BMC and DCGM (checks/node/suite/storage.py, bmc.py, dcgm.py) -------------
@dataclass(frozen=True)
class DiskUsage:
    """os.statvfs of the file system holding a path (free = f_bavail: what a non-root user
    may still write). `path` is that file system's mount point."""

    path: str
    total_bytes: int
    free_bytes: int


@dataclass(frozen=True)
class SwapArea:
    """One line of /proc/swaps (sizes converted from KiB to bytes)."""

    name: str
    kind: str  # "partition" or "file"
    size_bytes: int
    used_bytes: int
    priority: int = -2


@dataclass(frozen=True)
class ToolRun:
    """What one bounded run of an external tool returned. `timed_out`: killed at its deadline
    (stdout/stderr are what it printed before that)."""

    argv: tuple[str, ...]
    returncode: int | None
    stdout: str
    stderr: str = ""
    timed_out: bool = False
    duration_s: float = 0.0


class GpuHandle(abc.ABC):
    """One GPU as NVML sees it."""

    index: int

    @abc.abstractmethod
    def query(self, field_name: str) -> Any:
        """Return the value of one GPU_FIELDS entry; raise NotSupported / HardwareError."""


class Nvml(abc.ABC):
    @abc.abstractmethod
    def driver_version(self) -> str: ...

    @abc.abstractmethod
    def cuda_driver_version(self) -> int:
        """CUDA version the driver supports, as NVML encodes it (12040 = 12.4)."""

    @abc.abstractmethod
    def device_count(self) -> int: ...

    @abc.abstractmethod
    def gpu(self, index: int) -> GpuHandle: ...

    def mig_parent(self, mig_uuid: str) -> int | None:
        """NVML index of the GPU holding the MIG instance `mig_uuid` (a CUDA_VISIBLE_DEVICES
        entry), None when unknown."""
        return None


# slurmstepd places a job's processes in a cgroup named job_<id>: under cgroup v2 (cgroup/v2
# plugin) /system.slice/slurmstepd.scope/job_<id>/step_<step>/..., under v1 (cgroup/v1)
# /slurm/uid_<uid>/job_<id>/step_<step> or /slurm_<nodename>/uid_<uid>/job_<id>/... when several
# slurmd share a host (Slurm's cgroup.conf and cgroup_v2 documentation, slurm.schedmd.com).
SLURM_JOB_CGROUP = re.compile(r"(?:/slurmstepd\.scope|/slurm(?:_[^/]+)?/uid_\d+)/job_(\d+)(?:/|$)")


def slurm_job_of_cgroup(text: str) -> str | None:
    """The Slurm job id in the text of /proc/PID/cgroup ("hierarchy:controllers:path" lines),
    or None when no line names a Slurm job cgroup."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1].strip()
        match = SLURM_JOB_CGROUP.search(path)
        if match:
            return match.group(1)
    return None


class Backend(abc.ABC):
    """Everything checks read from the machine."""

    name: str = "abstract"

    @abc.abstractmethod
    def pci_devices(self) -> list[PciDevice]: ...

    @abc.abstractmethod
    def nvml(self) -> Nvml:
        """Initialised NVML; raises NvmlUnavailable."""

    @abc.abstractmethod
    def proc_driver_version(self) -> str | None:
        """Text of /proc/driver/nvidia/version, None when the kernel module is not loaded."""

    @abc.abstractmethod
    def loaded_modules(self) -> set[str]: ...

    @abc.abstractmethod
    def module_signer(self, module: str) -> str | None:
        """Who signed a kernel module (modinfo signer), None when unsigned or unknown."""

    @abc.abstractmethod
    def kernel_log(self) -> list[str]:
        """Kernel messages since boot."""

    @abc.abstractmethod
    def os_release(self) -> dict[str, str]: ...

    @abc.abstractmethod
    def kernel_release(self) -> str: ...

    @abc.abstractmethod
    def secure_boot(self) -> bool | None:
        """True/False, None when the machine does not say (no EFI)."""

    @abc.abstractmethod
    def shm(self) -> ShmInfo: ...

    @abc.abstractmethod
    def memlock_limit(self) -> int:
        """Soft RLIMIT_MEMLOCK in bytes, -1 for unlimited."""

    @abc.abstractmethod
    def cpu_count(self) -> int: ...

    @abc.abstractmethod
    def numa_nodes(self) -> dict[int, int]:
        """NUMA node id -> number of CPUs in it."""

    @abc.abstractmethod
    def service_state(self, unit: str) -> str:
        """systemd ActiveState of a unit ('active', 'inactive', 'failed', 'unknown')."""

    @abc.abstractmethod
    def torch(self) -> TorchInfo: ...

    def torch_build(self) -> tuple[str | None, str | None]:
        """torch's version and CUDA build (torch.version.cuda) for the report, without asking
        CUDA anything (the Linux backend reads the installed files and imports nothing)."""
        info = self.torch()
        return info.version, info.cuda

    def virtualization(self) -> str | None:
        """Hypervisor the host runs under ('kvm', 'microsoft', 'amazon', ...), None on bare metal."""
        return None

    def container(self) -> str | None:
        """Container runtime this process runs in ('docker', 'podman', 'kubernetes', ...), or None."""
        return None

    def gpu_device_nodes(self) -> set[int] | None:
        """Minor numbers N of the /dev/nvidiaN nodes present, None when /dev cannot be listed."""
        return None

    def fabric_manager_version(self) -> str | None:
        """Version of the installed Fabric Manager (nv-fabricmanager), None when not installed."""
        return None

    def imex_nodes_config(self) -> list[str] | None:
        """Node addresses in /etc/nvidia-imex/nodes_config.cfg (IMEX_NODE_CONFIG_FILE), one per
        line, comments and blank lines dropped; None when the file does not exist."""
        return None

    def dmi_product(self) -> str | None:
        """DMI product name (/sys/class/dmi/id/product_name), None when the firmware gives none."""
        return None

    # --- RDMA fabric and GPUDirect (checks/node/suite/fabric_*.py) ------------------------
    def rdma_devices(self) -> list[RdmaDevice]:
        """RDMA devices (/sys/class/infiniband); [] when there are none. HardwareError when the
        class directory exists but cannot be read."""
        return []

    def memory_peers(self) -> list[str] | None:
        """Entries of /sys/kernel/mm/memory_peers (nv_mem when nvidia_peermem registered with
        the RDMA core); None when the directory does not exist."""
        return None

    def pci_acs_control(self, address: str) -> int | None:
        """ACS Control register of a PCI bridge; None when it has no ACS capability.
        HardwareError when its extended config space cannot be read (needs root)."""
        return None

    def net_interfaces(self) -> list[str] | None:
        """Network interface names (/sys/class/net), None when they cannot be listed."""
        return None

    # --- Addresses the cross-host stage compares (checks/node/crosshost_node.py) -----------------
    def interface_address(self, ifname: str) -> str | None:
        """IPv4 address of a network interface, None when it has none or does not exist."""
        return None

    def route_source(self, host: str, port: int) -> str:
        """The local address the kernel routes to host:port from (nothing is sent).
        HardwareError when there is no route."""
        raise NotSupported(f"routes are not available on the {self.name} backend")

    def hostname_addresses(self) -> list[str]:
        """IPv4 addresses this host's name resolves to (what NCCL and gloo advertise by default)."""
        return []

    def perftest(self) -> dict[str, Any] | None:
        """The installed `ib_write_bw`: {"path", "cuda": built with --use_cuda}; None when
        perftest is not installed. Measurements: workload("ib_write_bw", nic=, gpu=, ...)."""
        return None

    def reset_gpu(self, uuid: str) -> float:
        """Reset one GPU (the remediation loop, on a drained node with no process on it; NVIDIA's
        `nvidia-smi -r` rules). Returns the kernel log's clock when the reset had finished
        (seconds since boot, as the log's timestamps print it), which the reset marker records so
        the kernel-log checks judge only what that GPU logged after it. NotSupported where this
        backend cannot reset, HardwareError when the reset failed."""
        raise NotSupported(f"GPU reset is not available on the {self.name} backend")

    def own_pids(self) -> set[int]:
        """PIDs of this tool's own processes, which may hold a CUDA context of their own (NVML
        lists them among a GPU's compute processes); empty where there are none."""
        return set()

    def process_slurm_job(self, pid: int) -> str | None:
        """The Slurm job process PID belongs to: the job whose cgroup holds it (/proc/PID/cgroup,
        see slurm_job_of_cgroup), else, where no cgroup names a job (proctrack/linuxproc), the
        job step whose root-owned slurmstepd it descends from (checks/hw/jobprocs.py). None when
        PID is in no job, has ended, or cannot be read."""
        return None

    # --- Storage and swap (checks/node/suite/storage.py) --------------------------------------
    def python_paths(self) -> dict[str, str]:
        """Where the training software lives: {"venv": sys.prefix, "torch": torch's package
        directory}; an entry is left out when it cannot be found."""
        return {}

    def disk_usage(self, path: str) -> DiskUsage:
        """Size and free space of the file system holding `path`, named by its mount point.
        HardwareError when the path does not exist or cannot be read."""
        raise NotSupported(f"disk usage is not available on the {self.name} backend")

    def swaps(self) -> list[SwapArea]:
        """Active swap areas (/proc/swaps); [] when swap is off."""
        raise NotSupported(f"swap state is not available on the {self.name} backend")

    # --- BMC through ipmitool (checks/node/suite/bmc.py) ----------------------------------------
    def ipmitool(self) -> dict[str, Any] | None:
        """The installed ipmitool: {"path", "device": the in-band IPMI device node
        (/dev/ipmi0, /dev/ipmi/0 or /dev/ipmidev/0) or None}; None when ipmitool is absent."""
        return None

    def ipmi(self, args: tuple[str, ...], timeout_s: float) -> ToolRun:
        """Run `ipmitool <args>` in-band, bounded by timeout_s."""
        raise NotSupported(f"ipmitool is not available on the {self.name} backend")

    # --- DCGM diagnostics (checks/node/suite/dcgm.py) ------------------------------------------
    def dcgmi(self) -> str | None:
        """Path of the installed `dcgmi`, None when DCGM is not installed."""
        return None

    def dcgm_diag(self, run: str, timeout_s: float) -> ToolRun:
        """`dcgmi diag -r <run> -j`, killed at timeout_s (ToolRun.timed_out)."""
        raise NotSupported(f"dcgmi is not available on the {self.name} backend")

    @abc.abstractmethod
    def environ(self) -> Mapping[str, str]: ...

    @property
    def simulated(self) -> bool:
        return False

    # Workload measurements (collectives, P2P, compute, DataLoader, burn-in). Appended for the
    # workload checks; the real implementation launches processes and loads the GPUs.
    def workload(self, name: str, **params: Any) -> Any:
        """Run (or, for a scenario, look up) the measurement `name` and return its raw figures.

        Names and result shapes: checks/hw/measure/local.py and docs/workload-checks.md.
        Raises NotSupported when this backend cannot provide it.
        """
        raise NotSupported(f"workload {name!r} is not available on the {self.name} backend")
