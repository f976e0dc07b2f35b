"""A scenario file in place of the machine: the same checks run through it unchanged.

The file format (`extends:`, `gpu_overrides:`, every key checked) is checks/hw/scenario_file.py,
whose names are importable from here too; docs/scenarios.md documents it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from checks.hw.base import (
    GPU_FIELDS,
    Backend,
    DiskUsage,
    GpuHandle,
    GpuLost,
    HardwareError,
    NoPermission,
    NotSupported,
    Nvml,
    NvmlUnavailable,
    PciDevice,
    RdmaDevice,
    RdmaPort,
    ShmInfo,
    SwapArea,
    ToolRun,
    TorchInfo,
    slurm_job_of_cgroup,
)
from checks.hw.scenario_file import (  # noqa: F401 (the format's names, used with the backend)
    NVML_KINDS,
    NVSWITCH_DEVICE_ID,
    SCENARIO_DIR,
    ScenarioError,
    load_scenario,
    merge,
    resolve,
    shipped,
)


def _value(raw: Any) -> Any:
    """Scenario spelling of a failed query: `not_supported`, `no_permission` or `{error: text}`."""
    if raw == "not_supported":
        raise NotSupported("not supported (scenario)")
    if raw == "no_permission":
        raise NoPermission("Insufficient Permissions (scenario: NVML's NO_PERMISSION)")
    if isinstance(raw, dict) and set(raw) == {"error"}:
        raise HardwareError(str(raw["error"]))
    return raw


def _kernel_sources(spec: dict[str, Any]) -> list[str]:
    """`kernel_log: {journalctl: ..., dmesg: ..., kmsg: ...}`: what each source answered on the
    recorded host (text, or {rc, stdout, stderr}, or {error: why it could not run}), judged by
    the same fallback chain the real backend uses."""
    import subprocess

    from checks.hw import kernel_log as kernlog

    def answer(kind: str) -> Any:
        value = spec.get(kind)
        if value is None:
            return kernlog._Attempt(None, "not in the scenario")
        if isinstance(value, dict) and set(value) == {"error"}:
            return kernlog._Attempt(None, str(value["error"]))
        if kind == "kmsg":
            lines = kernlog.parse_kmsg(str(value))
            return kernlog._Attempt(lines or None, "" if lines else "no kernel records")
        if isinstance(value, str):
            value = {"stdout": value}
        proc = subprocess.CompletedProcess([kind], int(value.get("rc", 0)),
                                           str(value.get("stdout", "")), str(value.get("stderr", "")))
        return kernlog.journal_answer(proc) if kind == "journalctl" else kernlog.dmesg_answer(proc)

    sources: list[tuple[str, Callable[[], Any]]] = [
        (f"{k} (scenario)", functools.partial(answer, k)) for k in ("journalctl", "dmesg", "kmsg")]
    return kernlog.chain(sources)


class FixtureGpu(GpuHandle):
    def __init__(self, index: int, fields: dict[str, Any]) -> None:
        self.index = index
        self._fields = fields

    def query(self, field_name: str) -> Any:
        if field_name not in GPU_FIELDS:
            raise KeyError(f"unknown GPU field {field_name!r}")
        if self._fields.get("lost"):
            raise GpuLost("GPU is lost (scenario)")
        if field_name not in self._fields:
            raise NotSupported(f"{field_name} not given in the scenario")
        value = _value(self._fields[field_name])
        if field_name == "compute_capability" and isinstance(value, str):
            major, minor = value.split(".")
            return int(major), int(minor)
        if field_name == "nvlink" and isinstance(value, dict):
            return _expand_nvlink(value)
        return value


def _capability(value: Any) -> tuple[int, int]:
    """"9.0" or [9, 0] -> (9, 0)."""
    major, minor = str(value).split(".") if isinstance(value, str) else value
    return int(major), int(minor)


def _expand_nvlink(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Compact scenario form {links: 18, inactive: [3], errors: {5: {replay: 200}}} -> per link.

    `remote_type` (gpu, switch) and `remote_pci` (the peer's bus id, for a bridged pair) are
    what nvmlDeviceGetNvLinkRemoteDeviceType / nvmlDeviceGetNvLinkRemotePciInfo give for every
    active link; left out, the links carry neither (a driver that answers neither)."""
    inactive = {int(i) for i in spec.get("inactive", [])}
    errors = {int(k): v for k, v in (spec.get("errors") or {}).items()}
    remote = {k: str(spec[k]) for k in ("remote_type", "remote_pci") if spec.get(k)}
    return [{"link": i, "active": i not in inactive,
             "errors": {"replay": 0, "recovery": 0, "crc_flit": 0, **errors.get(i, {})},
             **(remote if i not in inactive else {})}
            for i in range(int(spec.get("links", 0)))]


class FixtureNvml(Nvml):
    def __init__(self, driver: dict[str, Any], gpus: list[dict[str, Any]]) -> None:
        self._driver = driver
        self._gpus = gpus

    def driver_version(self) -> str:
        return str(_value(self._driver.get("version", "0")))

    def cuda_driver_version(self) -> int:
        return int(_value(self._driver.get("cuda_version", 0)))

    def device_count(self) -> int:
        return len(self._gpus)

    def gpu(self, index: int) -> GpuHandle:
        if not 0 <= index < len(self._gpus):
            raise HardwareError(f"invalid GPU index {index}")
        if self._gpus[index].get("lost"):
            # What a real driver does: nvmlDeviceGetHandleByIndex answers GPU_IS_LOST for this
            # index while the other GPUs still answer.
            raise GpuLost(f"GPU {index}: GPU is lost (scenario)")
        return FixtureGpu(index, self._gpus[index])

    def mig_parent(self, mig_uuid: str) -> int | None:
        """The GPU whose scenario `mig_instances` lists the UUID."""
        return next((i for i, g in enumerate(self._gpus)
                     if mig_uuid in map(str, g.get("mig_instances") or ())), None)


class FixtureBackend(Backend):
    name = "fixture"

    def __init__(self, scenario: dict[str, Any]) -> None:
        self.scenario = scenario
        self.path = scenario.get("_path", "<memory>")
        self._host = scenario.get("host") or {}
        self._driver = scenario.get("driver") or {}
        defaults = scenario.get("gpu_defaults") or {}
        self._gpus = [merge(defaults, gpu or {}) for gpu in scenario.get("gpus") or []]
        self.resets: list[str] = []  # UUIDs reset_gpu was asked to reset, in order

    @classmethod
    def from_file(cls, name_or_path: str) -> FixtureBackend:
        return cls(load_scenario(name_or_path))

    @property
    def simulated(self) -> bool:
        return True

    def pci_devices(self) -> list[PciDevice]:
        devices = []
        for gpu in self._gpus:
            if gpu.get("on_pci", True) is False:
                continue
            link = gpu.get("link") or {}
            devices.append(PciDevice(
                address=gpu["pci_bus_id"], vendor=0x10DE, device=int(gpu.get("pci_device_id", 0)),
                class_code=0x030200, driver="nvidia" if self._nvml_kind() == "ok" else None,
                numa_node=gpu.get("numa_node"), current_link_speed=link.get("speed"),
                max_link_speed=link.get("max_speed"), current_link_width=link.get("width"),
                max_link_width=link.get("max_width"),
                pci_path=tuple(str(b) for b in gpu.get("pci_path") or ())))
        for entry in self.scenario.get("nvswitches") or []:
            spec = entry if isinstance(entry, dict) else {"address": entry}
            link = spec.get("link") or {}
            devices.append(PciDevice(
                address=str(spec["address"]), vendor=0x10DE,
                device=int(spec.get("pci_device_id", NVSWITCH_DEVICE_ID)), class_code=0x068000,
                driver="nvidia-nvswitch", numa_node=spec.get("numa_node"),
                current_link_speed=link.get("speed"), max_link_speed=link.get("max_speed"),
                current_link_width=link.get("width"), max_link_width=link.get("max_width"),
                pci_path=tuple(str(b) for b in spec.get("pci_path") or ())))
        return sorted(devices, key=lambda d: d.address)

    def _nvml_kind(self) -> str:
        return str(self._driver.get("nvml", "ok"))

    def nvml(self) -> Nvml:
        kind = self._nvml_kind()
        if kind != "ok":
            raise NvmlUnavailable(kind, f"NVML init failed: {kind.replace('_', ' ')} (scenario)")
        visible = [g for g in self._gpus if g.get("nvml_visible", True) and g.get("on_pci", True)]
        return FixtureNvml(self._driver, visible)

    def proc_driver_version(self) -> str | None:
        if "proc_version" in self._driver:
            return self._driver["proc_version"]
        if self._nvml_kind() != "ok" or "nvidia" not in self.loaded_modules():
            return None
        version = self._driver.get("version", "0")
        return (f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {version}  "
                f"Release Build  (scenario)")

    def loaded_modules(self) -> set[str]:
        return set(_value(self._host.get("modules", [])))

    def module_signer(self, module: str) -> str | None:
        return (self._host.get("module_signers") or {}).get(module)

    def kernel_log(self) -> list[str]:
        raw = self._host.get("kernel_log", [])
        if isinstance(raw, dict) and set(raw) - {"error"}:
            return _kernel_sources(raw)
        return [str(line) for line in _value(raw)]

    def os_release(self) -> dict[str, str]:
        return {k: str(v) for k, v in (self._host.get("os_release") or {}).items()}

    def kernel_release(self) -> str:
        return str(self._host.get("kernel", "unknown"))

    def secure_boot(self) -> bool | None:
        return self._host.get("secure_boot")

    def shm(self) -> ShmInfo:
        total = _value(self._host.get("shm_bytes", 8 << 30))
        return ShmInfo(total_bytes=total, free_bytes=self._host.get("shm_free_bytes", total))

    def memlock_limit(self) -> int:
        value = self._host.get("memlock", "unlimited")
        return -1 if value == "unlimited" else int(value)

    def cpu_count(self) -> int:
        return int(self._host.get("cpu_count", 8))

    def numa_nodes(self) -> dict[int, int]:
        nodes = self._host.get("numa_nodes") or {0: self.cpu_count()}
        return {int(k): int(v) for k, v in nodes.items()}

    def service_state(self, unit: str) -> str:
        # A container has no systemd to ask: every unit is 'unknown' there unless listed.
        default = "unknown" if self._host.get("container") else "inactive"
        return str((self._host.get("services") or {}).get(unit, default))

    def virtualization(self) -> str | None:
        return self._host.get("virtualization")

    def container(self) -> str | None:
        return self._host.get("container")

    def reset_gpu(self, uuid: str) -> float:
        """A scenario GPU "reset", recorded in `resets`; a GPU the scenario has lost cannot be
        reset (HardwareError, as nvidia-smi cannot reach a GPU off the bus). The clock is the
        last timestamp the scenario's kernel log holds: the recording's now."""
        gpu = next((g for g in self._gpus if str(g.get("uuid")) == uuid), None)
        if gpu is None:
            raise HardwareError(f"no GPU {uuid} in the scenario")
        if gpu.get("lost") or gpu.get("on_pci", True) is False:
            raise HardwareError(f"GPU {uuid} is lost (scenario): a reset cannot reach it")
        self.resets.append(uuid)
        from checks.hw.kernel_log import line_clock

        try:
            stamps = [line_clock(line) for line in self.kernel_log()]
        except HardwareError:
            return 0.0
        return max((t for t in stamps if t is not None), default=0.0)

    def process_slurm_job(self, pid: int) -> str | None:
        # host.process_cgroups: {pid: the text of /proc/PID/cgroup}; host.process_tree: the
        # processes above it ({pid: {ppid, uid, comm, cmdline}}), or `live`: this machine's
        # /proc (a test whose scenario lists a real job's PID on a simulated GPU)
        from checks.hw import jobprocs

        cgroups = self._host.get("process_cgroups") or {}
        text = cgroups.get(int(pid), cgroups.get(str(pid)))
        job = None if text is None else slurm_job_of_cgroup(str(text))
        tree = self._host.get("process_tree")
        if job or tree is None:
            return job
        if tree == "live":
            return jobprocs.slurm_job_of_ancestry(int(pid), jobprocs.read_proc)

        def read(p: int) -> jobprocs.ProcInfo | None:
            entry = tree.get(p, tree.get(str(p)))
            if entry is None:
                return None
            return jobprocs.ProcInfo(int(entry.get("ppid", 0)), int(entry.get("uid", 0)),
                                     str(entry.get("comm", "")), str(entry.get("cmdline", "")))

        return jobprocs.slurm_job_of_ancestry(int(pid), read)

    def gpu_device_nodes(self) -> set[int] | None:
        nodes = self._host.get("device_nodes")
        if nodes is None and "device_nodes" in self._host:
            return None  # written as null: /dev could not be listed (a recording says so)
        if nodes is not None:
            return {int(n) for n in nodes}
        if self._nvml_kind() != "ok" and "nvidia" not in self.loaded_modules():
            return set()
        # Default: one node per GPU the driver probed (its index among the GPUs on the bus).
        return {int(g.get("minor_number", i)) for i, g in enumerate(self._gpus)
                if g.get("on_pci", True)}

    def fabric_manager_version(self) -> str | None:
        return self._host.get("fabric_manager_version")

    def imex_nodes_config(self) -> list[str] | None:
        # `imex_nodes:` absent or null: no nodes_config.cfg; `{error: ...}`: unreadable.
        nodes = _value(self._host.get("imex_nodes"))
        return None if nodes is None else [str(n) for n in nodes]

    def dmi_product(self) -> str | None:
        value = self._host.get("dmi_product")
        return None if value is None else str(value)

    # --- RDMA fabric and GPUDirect -------------------------------------------------------
    def rdma_devices(self) -> list[RdmaDevice]:
        """Scenario form: rdma: {devices: [{name, fw_ver, hca_type, pci_address, numa_node,
        pci_path, ports: [{port, state, phys_state, rate: "400 Gb/sec (4X NDR)", link_layer,
        gids: [{index, gid, type}], active_mtu, netdev, counters: {name: n}}]}]}."""
        from checks.hw.rdma import parse_rate

        spec = _value(self.scenario.get("rdma") or {})
        devices = []
        for dev in spec.get("devices") or []:
            ports = []
            for i, port in enumerate(dev.get("ports") or [{}]):
                rate, width, speed = parse_rate(port.get("rate"))
                ports.append(RdmaPort(
                    port=int(port.get("port", i + 1)), state=str(port.get("state", "ACTIVE")),
                    phys_state=str(port.get("phys_state", "LinkUp")), rate_gbps=rate,
                    width=width, speed=speed, link_layer=port.get("link_layer", "InfiniBand"),
                    gids=tuple(port.get("gids") or ()), active_mtu=port.get("active_mtu"),
                    netdev=port.get("netdev"),
                    counters={str(k): int(v) for k, v in (port.get("counters") or {}).items()}))
            devices.append(RdmaDevice(
                name=str(dev["name"]), fw_ver=dev.get("fw_ver"), hca_type=dev.get("hca_type"),
                pci_address=dev.get("pci_address"), numa_node=dev.get("numa_node"),
                pci_path=tuple(str(b) for b in dev.get("pci_path") or ()), ports=tuple(ports)))
        return devices

    def memory_peers(self) -> list[str] | None:
        peers = self._host.get("memory_peers")
        return None if peers is None else [str(p) for p in peers]

    def pci_acs_control(self, address: str) -> int | None:
        """host.acs: {bridge address: ACS control value, or {error: text}}; absent: no ACS."""
        value = _value((self._host.get("acs") or {}).get(address))
        return None if value is None else int(value)

    def net_interfaces(self) -> list[str] | None:
        names = self._host.get("net_interfaces", ["lo", "eth0"])
        return None if names is None else [str(n) for n in names]

    # host.network: {interfaces: {ifname: address}, route_source: address or null (no route),
    # hostname_addresses: [...]}; by default everything is loopback and consistent
    def _network(self) -> dict[str, Any]:
        return dict(self._host.get("network") or {})

    def interface_address(self, ifname: str) -> str | None:
        value = (self._network().get("interfaces") or {"lo": "127.0.0.1"}).get(ifname)
        return None if value is None else str(value)

    def route_source(self, host: str, port: int) -> str:
        network = self._network()
        if "route_source" in network and network["route_source"] is None:
            raise HardwareError(f"no route to {host}:{port} (scenario)")
        return str(network.get("route_source", "127.0.0.1"))

    def hostname_addresses(self) -> list[str]:
        return [str(a) for a in self._network().get("hostname_addresses", ["127.0.0.1"])]

    def perftest(self) -> dict[str, Any] | None:
        info = self._host.get("perftest")
        return None if info is None else {"path": str(info.get("path", "/usr/bin/ib_write_bw")),
                                          "cuda": bool(info.get("cuda", False))}

    # --- Storage, swap, BMC, DCGM ----------------------------------------------------------------
    def python_paths(self) -> dict[str, str]:
        return {str(k): str(v) for k, v in (self._host.get("python_paths") or {}).items()}

    def disk_usage(self, path: str) -> DiskUsage:
        """host.disks maps mount points to {total_bytes, free_bytes} (or {error: text}); a path
        is on the longest mount point that contains it, as on a real file system."""
        disks = self._host.get("disks")
        if disks is None:
            raise NotSupported("disk usage not given in the scenario")
        parts = Path(path).parts
        mounts = sorted((m for m in disks if parts[:len(Path(m).parts)] == Path(m).parts),
                        key=lambda m: len(Path(m).parts), reverse=True)
        if not mounts:
            raise HardwareError(f"statvfs {path}: no such file or directory (scenario)")
        spec = _value(disks[mounts[0]])
        return DiskUsage(path=str(mounts[0]), total_bytes=int(spec["total_bytes"]),
                         free_bytes=int(spec["free_bytes"]))

    def swaps(self) -> list[SwapArea]:
        if "swaps" not in self._host:
            raise NotSupported("swap state not given in the scenario")
        value = _value(self._host["swaps"])
        if isinstance(value, str):
            from checks.hw.linux import parse_proc_swaps

            return parse_proc_swaps(value)
        return [SwapArea(name=str(a["name"]), kind=str(a.get("type", "partition")),
                         size_bytes=int(a["size_bytes"]), used_bytes=int(a.get("used_bytes", 0)),
                         priority=int(a.get("priority", -2))) for a in value or []]

    def ipmitool(self) -> dict[str, Any] | None:
        spec = self._host.get("ipmitool")
        if spec is None:
            return None
        return {"path": str(spec.get("path", "/usr/bin/ipmitool")), "device": spec.get("device")}

    def ipmi(self, args: tuple[str, ...], timeout_s: float) -> ToolRun:
        spec = self._host.get("ipmitool") or {}
        key = "_".join(args)  # ("sdr",) -> sdr; ("sel", "elist") -> sel_elist
        return self._tool_answer(("ipmitool", *args), spec.get(key), timeout_s)

    def dcgmi(self) -> str | None:
        spec = self._host.get("dcgm")
        return None if spec is None else str(spec.get("path", "/usr/bin/dcgmi"))

    def dcgm_diag(self, run: str, timeout_s: float) -> ToolRun:
        """host.dcgm.diag: one answer for any run level, or {<level>: answer}."""
        diag = (self._host.get("dcgm") or {}).get("diag")
        if isinstance(diag, dict) and str(run) in {str(k) for k in diag}:
            diag = {str(k): v for k, v in diag.items()}[str(run)]
        return self._tool_answer(("dcgmi", "diag", "-r", str(run), "-j"), diag, timeout_s)

    def _tool_answer(self, argv: tuple[str, ...], answer: Any, timeout_s: float) -> ToolRun:
        """A recorded tool run: text (its stdout, exit 0), or {stdout | file, rc, stderr}, or
        {timed_out: true} (it never finished: killed at the deadline), or {error: text} (it
        could not be started). `file` is relative to the scenario's directory."""
        if answer is None:
            raise HardwareError(f"{' '.join(argv)}: no answer recorded in the scenario")
        if isinstance(answer, str):
            answer = {"stdout": answer}
        answer = _value(answer) if set(answer) == {"error"} else answer
        if answer.get("timed_out"):
            return ToolRun(argv, None, str(answer.get("stdout", "")), "", True, timeout_s)
        stdout = str(answer.get("stdout", ""))
        if "file" in answer:
            base = Path(self.path).parent if self.path != "<memory>" else SCENARIO_DIR
            try:
                stdout = (base / str(answer["file"])).read_text()
            except OSError as exc:
                raise ScenarioError(f"{self.path}: {answer['file']}: {exc.strerror}") from None
        return ToolRun(argv, int(answer.get("rc", 0)), stdout, str(answer.get("stderr", "")),
                       False, float(answer.get("duration_s", 0.0)))

    def torch(self) -> TorchInfo:
        spec = dict(self.scenario.get("torch") or {})
        info = TorchInfo(**{k: v for k, v in spec.items() if k != "device_count"})
        if not spec:
            info.version = "2.13.0+cpu"
        if "device_count" in spec:
            info.device_count = int(spec["device_count"])
        elif info.cuda_available:
            info.device_count = len(self._torch_visible())
        # Given (a recording of torch's own answers) or derived from the GPUs torch sees.
        info.capabilities = [_capability(c) for c in info.capabilities]
        if info.cuda_available:
            gpus = self._torch_visible()[: info.device_count]
            if "capabilities" not in spec:
                info.capabilities = [FixtureGpu(i, g).query("compute_capability")
                                     for i, g in enumerate(gpus) if "compute_capability" in g]
            if "device_names" not in spec:
                info.device_names = [str(g.get("name", "")) for g in gpus]
        return info

    def _torch_visible(self) -> list[dict[str, Any]]:
        gpus = [g for g in self._gpus if g.get("nvml_visible", True) and g.get("on_pci", True)
                and not g.get("lost")]
        cvd = self.environ().get("CUDA_VISIBLE_DEVICES")
        if cvd is None:
            return gpus
        picked = []
        for token in filter(None, (t.strip() for t in cvd.split(","))):
            if token.isdigit() and int(token) < len(gpus):
                picked.append(gpus[int(token)])
                continue
            # a GPU by its UUID, or a MIG instance by its own (the scenario's `mig_instances`
            # of its parent GPU): CUDA then enumerates that slice
            by_uuid = [g for g in gpus if token in (str(g.get("uuid")), *map(
                str, g.get("mig_instances") or ()))]
            if not by_uuid:
                break  # CUDA stops at the first invalid entry
            picked.append(by_uuid[0])
        return picked

    def environ(self) -> Mapping[str, str]:
        return {str(k): str(v) for k, v in (self._host.get("env") or {}).items()}

    def measurements(self) -> dict[str, Any]:
        return dict(self.scenario.get("measurements") or {})

    def workload(self, name: str, **params: Any) -> Any:
        """The scenario's `measurements:` entry for `name`, in the shape a real run returns."""
        from checks.hw.measure import scenario

        # Measurements come from torch: only the GPUs torch sees (CUDA_VISIBLE_DEVICES).
        seen = self._torch_visible()
        visible = [(i, str(g["pci_bus_id"])) for i, g in enumerate(self._gpus)
                   if any(g is v for v in seen)]
        return scenario.measurement(name, self.measurements(), visible, **params)
