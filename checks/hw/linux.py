"""The real machine: sysfs, /proc, the kernel log, systemd, NVML (through nvml.py) and torch."""

from __future__ import annotations

import contextlib
import os
import platform
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from checks.hw import nvml as nvml_module
from checks.hw.base import (
    Backend,
    DiskUsage,
    HardwareError,
    NotSupported,
    Nvml,
    PciDevice,
    RdmaDevice,
    ShmInfo,
    SwapArea,
    ToolRun,
    TorchInfo,
    slurm_job_of_cgroup,
)
from checks.hw.torchview import read_torch, read_torch_build

SYS_PCI = Path("/sys/bus/pci/devices")
EFI_VARS = Path("/sys/firmware/efi/efivars")
DMI = Path("/sys/class/dmi/id")
IMEX_NODES_CONFIG = Path("/etc/nvidia-imex/nodes_config.cfg")  # NVIDIA IMEX guide, default path
PCI_ADDRESS = re.compile(r"^[0-9a-f]{4,5}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
# DMI sys_vendor / product_name of common hypervisors -> the name systemd-detect-virt uses.
DMI_HYPERVISORS = (("Microsoft Corporation", "microsoft"), ("Amazon EC2", "amazon"),
                   ("Google", "google"), ("QEMU", "qemu"), ("KVM", "kvm"),
                   ("VMware", "vmware"), ("Xen", "xen"), ("OpenStack", "kvm"),
                   ("Oracle Corporation", "oracle"))
# Files a container runtime leaves at the root of the container's file system.
CONTAINER_MARKERS = ((Path("/.dockerenv"), "docker"), (Path("/run/.containerenv"), "podman"))
# SecureBoot-<EFI global variable GUID>: 4 attribute bytes, then 1 data byte.
SECURE_BOOT_VAR = "SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _int(text: str | None, base: int = 10) -> int | None:
    try:
        return int(text, base) if text is not None else None
    except ValueError:
        return None


RESET_TIMEOUT_S = 120.0  # nvidia-smi --gpu-reset of one GPU


class LinuxBackend(Backend):
    name = "linux"

    def __init__(self, sys_pci: Path = SYS_PCI) -> None:
        self._sys_pci = sys_pci
        self._torch: TorchInfo | None = None

    def pci_devices(self) -> list[PciDevice]:
        if not self._sys_pci.is_dir():
            raise HardwareError(f"{self._sys_pci} is missing: is sysfs mounted?")
        devices = []
        for entry in sorted(self._sys_pci.iterdir()):
            vendor = _int(_read(entry / "vendor"), 16)
            device = _int(_read(entry / "device"), 16)
            klass = _int(_read(entry / "class"), 16)
            if vendor is None or device is None or klass is None:
                continue
            driver = entry / "driver"
            devices.append(PciDevice(
                address=entry.name,
                pci_path=_pci_path(entry),
                vendor=vendor,
                device=device,
                class_code=klass,
                driver=driver.resolve().name if driver.exists() else None,
                numa_node=_int(_read(entry / "numa_node")),
                current_link_speed=_read(entry / "current_link_speed"),
                max_link_speed=_read(entry / "max_link_speed"),
                current_link_width=_int(_read(entry / "current_link_width")),
                max_link_width=_int(_read(entry / "max_link_width")),
            ))
        return devices

    def nvml(self) -> Nvml:
        return nvml_module.open_nvml()

    def proc_driver_version(self) -> str | None:
        return _read(Path("/proc/driver/nvidia/version"))

    def loaded_modules(self) -> set[str]:
        text = _read(Path("/proc/modules"))
        if text is not None:
            return {line.split()[0] for line in text.splitlines() if line.strip()}
        # No /proc/modules: a kernel without loadable modules. Built-in drivers still appear
        # under /sys/module (only those with parameters), which is the best view there is.
        sys_module = Path("/sys/module")
        if not sys_module.is_dir():
            raise HardwareError("neither /proc/modules nor /sys/module is readable")
        return {entry.name for entry in sys_module.iterdir()}

    def module_signer(self, module: str) -> str | None:
        if shutil.which("modinfo") is None:
            return None
        proc = subprocess.run(["modinfo", "-F", "signer", module], capture_output=True,
                              text=True, timeout=10, check=False)
        return (proc.stdout.strip() or None) if proc.returncode == 0 else None

    def kernel_log(self) -> list[str]:
        # journalctl -k -b, then dmesg, then /dev/kmsg; the answer records which one replied.
        from checks.hw.kernel_log import read_kernel_log

        return read_kernel_log()

    def os_release(self) -> dict[str, str]:
        return dict(platform.freedesktop_os_release())

    def kernel_release(self) -> str:
        return platform.release()

    def secure_boot(self) -> bool | None:
        var = EFI_VARS / SECURE_BOOT_VAR
        if not EFI_VARS.is_dir():
            return None
        try:
            data = var.read_bytes()
        except OSError:
            return None
        return len(data) >= 5 and data[4] == 1

    def shm(self) -> ShmInfo:
        try:
            st = os.statvfs("/dev/shm")
        except OSError as exc:
            raise HardwareError(f"/dev/shm: {exc.strerror}") from exc
        return ShmInfo(total_bytes=st.f_blocks * st.f_frsize, free_bytes=st.f_bavail * st.f_frsize)

    def memlock_limit(self) -> int:
        soft, _hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
        return -1 if soft == resource.RLIM_INFINITY else soft

    def cpu_count(self) -> int:
        return len(os.sched_getaffinity(0))

    def numa_nodes(self) -> dict[int, int]:
        nodes: dict[int, int] = {}
        base = Path("/sys/devices/system/node")
        for node in sorted(base.glob("node[0-9]*")):
            cpus = _read(node / "cpulist") or ""
            nodes[int(node.name[4:])] = _count_cpulist(cpus)
        return nodes or {0: self.cpu_count()}

    def service_state(self, unit: str) -> str:
        if shutil.which("systemctl") is None:
            return "unknown"
        proc = subprocess.run(["systemctl", "show", "-p", "ActiveState", "--value", unit],
                              capture_output=True, text=True, timeout=10, check=False)
        return proc.stdout.strip() or "unknown"

    def virtualization(self) -> str | None:
        answer = _detect_virt("--vm")
        if answer is not None:
            return answer or None
        # No systemd-detect-virt (minimal images): the CPU's hypervisor flag and DMI vendor.
        cpuinfo = _read(Path("/proc/cpuinfo")) or ""
        if not re.search(r"^flags\s*:.*\bhypervisor\b", cpuinfo, re.MULTILINE):
            return None
        vendor = " ".join(filter(None, (_read(DMI / "sys_vendor"), _read(DMI / "product_name"))))
        return next((name for key, name in DMI_HYPERVISORS if key in vendor), "unknown")

    def container(self) -> str | None:
        answer = _detect_virt("--container")
        if answer:
            return answer
        for marker, name in CONTAINER_MARKERS:
            if marker.exists():
                return name
        if os.environ.get("KUBERNETES_SERVICE_HOST"):
            return "kubernetes"
        env_marker = os.environ.get("container")  # noqa: SIM112 - systemd's lower-case convention
        if env_marker:
            return env_marker
        cgroup = _read(Path("/proc/1/cgroup")) or ""
        for key, name in (("kubepods", "kubernetes"), ("docker", "docker"),
                          ("containerd", "containerd"), ("libpod", "podman")):
            if key in cgroup:
                return name
        return None

    def gpu_device_nodes(self) -> set[int] | None:
        try:
            names = os.listdir("/dev")
        except OSError:
            return None
        return {int(n[6:]) for n in names if re.fullmatch(r"nvidia\d+", n)}

    def fabric_manager_version(self) -> str | None:
        binary = shutil.which("nv-fabricmanager") or (
            "/usr/bin/nv-fabricmanager" if Path("/usr/bin/nv-fabricmanager").exists() else None)
        if binary is None:
            return None
        try:
            proc = subprocess.run([binary, "--version"], capture_output=True, text=True,
                                  timeout=10, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise HardwareError(f"nv-fabricmanager --version: {exc}") from exc
        # "Fabric Manager version is : 550.90.07"
        match = re.search(r"(\d{3,}\.\d+(?:\.\d+)?)", proc.stdout + proc.stderr)
        if match is None:
            raise HardwareError(f"cannot parse the Fabric Manager version from "
                                f"{(proc.stdout + proc.stderr).strip()[:80]!r}")
        return match.group(1)

    def imex_nodes_config(self) -> list[str] | None:
        try:
            text = IMEX_NODES_CONFIG.read_text()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise HardwareError(f"{IMEX_NODES_CONFIG}: {exc.strerror or exc}") from exc
        lines = (line.split("#", 1)[0].strip() for line in text.splitlines())
        return [line for line in lines if line]

    def dmi_product(self) -> str | None:
        return _read(DMI / "product_name") or None

    # --- RDMA fabric and GPUDirect -------------------------------------------------------
    def rdma_devices(self) -> list[RdmaDevice]:
        from checks.hw import rdma

        return rdma.read_devices()

    def memory_peers(self) -> list[str] | None:
        path = Path("/sys/kernel/mm/memory_peers")
        try:
            return sorted(p.name for p in path.iterdir()) if path.is_dir() else None
        except OSError:
            return None

    def pci_acs_control(self, address: str) -> int | None:
        from checks.hw import rdma

        return rdma.read_acs(address, self._sys_pci)

    def net_interfaces(self) -> list[str] | None:
        try:
            return sorted(os.listdir("/sys/class/net"))
        except OSError:
            return None

    def interface_address(self, ifname: str) -> str | None:
        import fcntl
        import socket
        import struct

        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:  # SIOCGIFADDR
                packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", ifname.encode()[:15]))
            except OSError:
                return None
        return socket.inet_ntoa(packed[20:24])

    def route_source(self, host: str, port: int) -> str:
        import socket

        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                probe.connect((host, int(port)))  # UDP: picks the route, sends nothing
                return str(probe.getsockname()[0])
        except (OSError, ValueError) as exc:
            raise HardwareError(str(exc)) from exc

    def hostname_addresses(self) -> list[str]:
        import socket

        try:
            return sorted({str(a[4][0]) for a in socket.getaddrinfo(socket.gethostname(), None,
                                                                    socket.AF_INET)})
        except OSError:
            return []

    def own_pids(self) -> set[int]:
        return {os.getpid()}

    def reset_gpu(self, uuid: str) -> float:
        # nvidia-smi -r takes the UUID for -i; it refuses a GPU a process still holds. Its whole
        # tree is killed at the deadline (a reset that hangs in the driver leaves the node drained).
        from checks.supervise import procs

        if shutil.which("nvidia-smi") is None:
            raise NotSupported("nvidia-smi is not installed: no GPU reset")
        try:
            proc = procs.run(["nvidia-smi", "--gpu-reset", "-i", uuid], timeout_s=RESET_TIMEOUT_S,
                             text=True)
        except subprocess.TimeoutExpired:
            raise HardwareError(f"nvidia-smi --gpu-reset -i {uuid} did not finish in "
                                f"{RESET_TIMEOUT_S:g} s (killed)") from None
        if proc.returncode != 0:
            why = " ".join((proc.stdout + " " + proc.stderr).split())[:200]
            raise HardwareError(f"nvidia-smi --gpu-reset -i {uuid} failed (exit "
                                f"{proc.returncode}): {why}")
        # printk stamps lines with the kernel's local clock: seconds since boot, not counting
        # suspend, which CLOCK_MONOTONIC follows
        return time.clock_gettime(time.CLOCK_MONOTONIC)

    def process_slurm_job(self, pid: int) -> str | None:
        # the job's cgroup (cgroup plugins), else the job step's slurmstepd above it
        # (proctrack/linuxproc and other setups without a job cgroup): checks/hw/jobprocs.py
        from checks.hw import jobprocs

        text = _read(Path(f"/proc/{int(pid)}/cgroup"))
        job = None if text is None else slurm_job_of_cgroup(text)
        return job or jobprocs.slurm_job_of_ancestry(int(pid), jobprocs.read_proc)

    # --- Storage, swap, BMC, DCGM ----------------------------------------------------------------
    def python_paths(self) -> dict[str, str]:
        import importlib.util

        paths = {"venv": sys.prefix}
        try:
            spec = importlib.util.find_spec("torch")  # located, not imported
        except (ImportError, ValueError):
            spec = None
        if spec is not None and spec.origin:
            paths["torch"] = str(Path(spec.origin).parent)
        return paths

    def disk_usage(self, path: str) -> DiskUsage:
        # A checkpoint directory not created yet lands on its nearest existing parent.
        target = Path(path)
        while not target.exists() and target != target.parent:
            target = target.parent
        try:
            st = os.statvfs(target)
        except OSError as exc:
            raise HardwareError(f"statvfs {target}: {exc.strerror or exc}") from exc
        # Named by its mount point, so paths on one file system are judged once.
        mount = target.resolve()
        while not os.path.ismount(mount) and mount != mount.parent:
            mount = mount.parent
        return DiskUsage(path=str(mount), total_bytes=st.f_blocks * st.f_frsize,
                         free_bytes=st.f_bavail * st.f_frsize)

    def swaps(self) -> list[SwapArea]:
        try:
            text = Path("/proc/swaps").read_text()
        except OSError as exc:
            raise HardwareError(f"/proc/swaps: {exc.strerror or exc}") from exc
        return parse_proc_swaps(text)

    def ipmitool(self) -> dict[str, Any] | None:
        binary = shutil.which("ipmitool")
        if binary is None:
            return None
        device = next((str(d) for d in IPMI_DEVICES if d.exists()), None)
        return {"path": binary, "device": device}

    def ipmi(self, args: tuple[str, ...], timeout_s: float) -> ToolRun:
        binary = shutil.which("ipmitool")
        if binary is None:
            raise HardwareError("ipmitool is not installed")
        return run_tool((binary, *args), timeout_s)

    def dcgmi(self) -> str | None:
        return shutil.which("dcgmi")

    def dcgm_diag(self, run: str, timeout_s: float) -> ToolRun:
        binary = shutil.which("dcgmi")
        if binary is None:
            raise HardwareError("dcgmi is not installed")
        return run_tool((binary, "diag", "-r", run, "-j"), timeout_s)

    def torch(self) -> TorchInfo:
        if self._torch is None:
            self._torch = read_torch()
        return self._torch

    def torch_build(self) -> tuple[str | None, str | None]:
        if self._torch is not None:
            return self._torch.version, self._torch.cuda
        return read_torch_build()

    def environ(self) -> Mapping[str, str]:
        return os.environ

    def perftest(self) -> dict[str, Any] | None:
        from checks.hw import perftest

        return perftest.tool_info()

    def workload(self, name: str, **params: Any) -> Any:
        """Real measurements: torch on the GPUs (or the CPU), torchrun for the collectives."""
        from checks.hw.measure import local  # torch is imported only when a workload check runs

        return local.run(self, name, **params)


# In-band IPMI device nodes, as ipmitool's open interface looks for them (ipmitool(1), -I open).
IPMI_DEVICES = (Path("/dev/ipmi0"), Path("/dev/ipmi/0"), Path("/dev/ipmidev/0"))


def parse_proc_swaps(text: str) -> list[SwapArea]:
    """/proc/swaps: a header line, then `Filename Type Size Used Priority` (sizes in KiB)."""
    areas = []
    for line in text.splitlines()[1:]:
        parts = line.split()
        if len(parts) < 5:
            continue
        try:
            areas.append(SwapArea(name=parts[0], kind=parts[1], size_bytes=int(parts[2]) * 1024,
                                  used_bytes=int(parts[3]) * 1024, priority=int(parts[4])))
        except ValueError:
            raise HardwareError(f"/proc/swaps: cannot parse {line.strip()!r}") from None
    return areas


def run_tool(argv: tuple[str, ...], timeout_s: float) -> ToolRun:
    """Run an external tool in its own process group; at the deadline the whole group is
    killed (a BMC that does not answer, a diagnostic that hangs) and the run says so."""
    start = time.monotonic()
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
    except OSError as exc:
        raise HardwareError(f"{argv[0]}: {exc.strerror or exc}") from exc
    try:
        out, err = proc.communicate(timeout=timeout_s)
        return ToolRun(argv, proc.returncode, out, err, False, time.monotonic() - start)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):  # the group ended on its own meanwhile
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return ToolRun(argv, None, out or "", err or "", True, time.monotonic() - start)


def _pci_path(entry: Path) -> tuple[str, ...]:
    """Bridges above a device: /sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0
    gives ("0000:00:01.0", "0000:01:00.0") for device 0000:02:00.0."""
    try:
        parts = entry.resolve().parts
    except OSError:
        return ()
    return tuple(p for p in parts[:-1] if PCI_ADDRESS.match(p))


def _detect_virt(flag: str) -> str | None:
    """systemd-detect-virt's answer: a name, '' for none, None when the tool is missing."""
    if shutil.which("systemd-detect-virt") is None:
        return None
    try:
        proc = subprocess.run(["systemd-detect-virt", flag], capture_output=True, text=True,
                              timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    answer = proc.stdout.strip()
    return "" if answer in ("", "none") else answer


def _count_cpulist(text: str) -> int:
    count = 0
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        count += int(hi or lo) - int(lo) + 1
    return count
