"""What the hardware layer reads on this machine, as a recording (`python -m checks record`):
the recorder asks a `Backend` every question the checks ask and keeps each answer in the
scenario spelling `--simulate` reads (checks/node/record.py writes it and is the command)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import re
import threading
from collections.abc import Callable
from typing import Any

from checks import __version__
from checks import report_schema as report
from checks.hw.base import (
    GPU_FIELDS,
    Backend,
    GpuHandle,
    GpuLost,
    HardwareError,
    NotSupported,
    NvmlUnavailable,
    PciDevice,
)
from checks.hw.fixture import NVML_KINDS, _expand_nvlink
from checks.node.redact import REDACTED_HOST, Redactor, mask_cmdline_secrets

SUFFIXES = (".yaml", ".yml", ".json")
SERVICES = ("nvidia-fabricmanager", "nvidia-persistenced", "nvidia-imex", "nvlsm")
# The report's environment allow-list (checks/schema/recorded-env.yaml) plus the variables Slurm
# sets for a job's GPUs, so a simulated run sees the same environment the checks saw; values of
# secret-looking names are masked, as in the report.
ENV_NAMES = frozenset({"GPU_DEVICE_ORDINAL"})
SLURM_GPU_RE = re.compile(r"SLURM_\w*GPU")
# Kernel-log lines any check or a reader of the recording cares about. Journal notices ("-- No
# entries --") are kept too: they say the log could not really be read.
KERNEL_LOG_RE = re.compile(r"NVRM|\bS?Xid\b|\bAER\b|nvidia|nvswitch|nvlink|fallen off the bus|"
                           r"PCIe Bus Error|mlx5.*(bandwidth|PCIe)|^-- ", re.IGNORECASE)
KERNEL_LOG_MAX = 300
# Fields a GPU answers with something of its own: never moved into gpu_defaults.
IDENTITY = {"pci_bus_id", "uuid", "serial", "lost", "nvml_visible"}
CALL_TIMEOUT_S = 30.0


class Hung(HardwareError):
    """A read did not come back within the bound (a hung driver call)."""


class UsageError(Exception):
    pass


def _bounded(fn: Callable[[], Any], timeout_s: float) -> Any:
    """fn() in a daemon thread: a call stuck in C (NVML on a hung GPU) is abandoned, not waited
    for, and cannot keep the process alive."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the caller as-is
            box["error"] = exc

    thread = threading.Thread(target=target, name="record-read", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise Hung(f"no answer within {timeout_s:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def _plain(value: Any) -> Any:
    """A YAML/JSON-safe copy of what a backend returned."""
    if value is None:
        return None
    if isinstance(value, HexInt):
        return value
    for kind in (bool, int, float, str):  # plain types, not subclasses (torch's TorchVersion)
        if isinstance(value, kind):
            return kind(value)
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, dict):
        return {k if isinstance(k, int) else str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        items = sorted(value) if isinstance(value, set | frozenset) else value
        return [_plain(v) for v in items]
    return str(value)


def _compact_nvlink(links: list[dict[str, Any]]) -> Any:
    """The short scenario form {links, inactive, errors} when it expands back to exactly these
    links, else the list itself."""
    compact: dict[str, Any] = {"links": len(links)}
    inactive = [lk.get("link") for lk in links if not lk.get("active")]
    errors = {lk.get("link"): {k: v for k, v in (lk.get("errors") or {}).items() if v}
              for lk in links}
    if inactive:
        compact["inactive"] = inactive
    if any(errors.values()):
        compact["errors"] = {i: e for i, e in errors.items() if e}
    try:
        same = _expand_nvlink(compact) == links
    except (TypeError, ValueError):
        same = False
    return compact if same else links


class HexInt(int):
    """Written as 0x2330 (device ids, clock event reason bits); YAML reads it back as an int."""


def _pci_facts(device: PciDevice) -> dict[str, Any]:
    facts: dict[str, Any] = {"pci_device_id": HexInt(device.device)}
    if device.numa_node is not None:
        facts["numa_node"] = device.numa_node
    link = {"speed": device.current_link_speed, "max_speed": device.max_link_speed,
            "width": device.current_link_width, "max_width": device.max_link_width}
    if any(v is not None for v in link.values()):
        facts["link"] = {k: v for k, v in link.items() if v is not None}
    if device.pci_path:
        facts["pci_path"] = list(device.pci_path)
    return facts


@dataclasses.dataclass
class Recording:
    scenario: dict[str, Any]
    gaps: list[str]  # facts the scenario format could not express
    notes: list[str]  # said in the header (kernel log shortened, ...)


class Recorder:
    """Reads every Backend fact once, each read bounded in time."""

    def __init__(self, hw: Backend, timeout_s: float = CALL_TIMEOUT_S) -> None:
        self.hw = hw
        self.timeout_s = timeout_s
        self.gaps: list[str] = []
        self.notes: list[str] = []
        self._nvml_hung: str | None = None

    def read(self, fn: Callable[[], Any], timeout_s: float | None = None) -> Any:
        return _bounded(fn, timeout_s or self.timeout_s)

    def fact(self, what: str, fn: Callable[[], Any], errors_ok: bool = False) -> Any:
        """One host fact. A failure is `{error: text}` where the format takes it (errors_ok),
        otherwise a gap: left out, so the simulation uses the scenario default."""
        try:
            return _plain(self.read(fn))
        except Exception as exc:  # the recording goes on; the failure is written down
            text = _one_line(exc)
            if errors_ok:
                return {"error": text}
            self.gaps.append(f"{what}: {text}")
            return _MISSING

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
        elif shm is not _MISSING:
            host["shm_bytes"], host["shm_free_bytes"] = shm["total_bytes"], shm["free_bytes"]
        memlock = self.fact("memlock_limit", hw.memlock_limit)
        host["memlock"] = "unlimited" if memlock == -1 else memlock
        host["secure_boot"] = self.fact("secure_boot", hw.secure_boot)
        host["modules"] = self.fact("loaded_modules", hw.loaded_modules, errors_ok=True)
        signer = self.fact("module_signer(nvidia)", lambda: hw.module_signer("nvidia"))
        if signer not in (None, _MISSING):
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
        host["services"] = _drop_missing(host["services"])
        host["memory_peers"] = self.fact("memory_peers", hw.memory_peers)
        host["net_interfaces"] = self.fact("net_interfaces", hw.net_interfaces)
        self.storage(host)
        return _drop_missing(host)

    def storage(self, host: dict[str, Any]) -> None:
        """The Python environment's paths, the file systems under them, and swap (disk-space
        and swap checks). What the backend does not provide (NotSupported) is left out, so the
        simulation answers the same way."""
        hw = self.hw
        paths = self.fact("python_paths", hw.python_paths)
        if paths is _MISSING:
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
                disks[path] = {"error": _one_line(exc)}
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
            host["swaps"] = {"error": _one_line(exc)}
        self.bmc(host)

    def bmc(self, host: dict[str, Any]) -> None:
        """ipmitool and, with the in-band device, what `sdr` and `sel elist` answered."""
        tool = self.fact("ipmitool", self.hw.ipmitool)
        if not tool or tool is _MISSING:
            return
        host["ipmitool"] = dict(tool)
        if not tool.get("device"):
            return
        for key, args in (("sdr", ("sdr",)), ("sel_elist", ("sel", "elist"))):
            try:
                run = self.hw.ipmi(args, self.timeout_s)
            except Exception as exc:  # the simulation answers with the same error
                host["ipmitool"][key] = {"error": _one_line(exc)}
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
            return {"error": _one_line(exc)}
        if not devices:
            return _MISSING
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
        kept = [mask_cmdline_secrets(str(line)) for line in lines if KERNEL_LOG_RE.search(str(line))]
        if len(kept) > KERNEL_LOG_MAX:
            self.notes.append(f"kernel log: kept the latest {KERNEL_LOG_MAX} of {len(kept)} "
                              f"matching lines ({len(lines)} lines in all)")
            kept = kept[-KERNEL_LOG_MAX:]
        return kept

    # -- NVML and the PCI bus -----------------------------------------------------------------
    def driver_and_gpus(self) -> tuple[dict[str, Any], list[Any], list[dict[str, Any]]]:
        hw = self.hw
        driver: dict[str, Any] = {}
        try:
            pci = self.read(hw.pci_devices)
        except Exception as exc:  # no way to say "PCI bus unreadable" in a scenario
            self.gaps.append(f"pci_devices: {_one_line(exc)}")
            pci = []
        bus_gpus = sorted((d for d in pci if d.is_nvidia_gpu), key=lambda d: d.address)
        switches = [{"address": d.address, **_pci_facts(d)}
                    for d in sorted(pci, key=lambda d: d.address) if d.is_nvswitch]
        try:
            nvml = self.read(hw.nvml)
            driver["nvml"] = "ok"
        except NvmlUnavailable as exc:
            nvml = None
            driver["nvml"] = exc.kind
            if exc.kind not in NVML_KINDS:
                self.gaps.append(f"NVML init failure kind {exc.kind!r} is not a scenario kind: "
                                 "written as init_failed")
                driver["nvml"] = "init_failed"
        except Exception as exc:
            nvml = None
            driver["nvml"] = "init_failed"
            self.gaps.append(f"NVML init: {_one_line(exc)} (written as init_failed)")
        if nvml is not None:
            driver["version"] = self._nvml_value(nvml.driver_version)
            driver["cuda_version"] = self._nvml_value(nvml.cuda_driver_version)
        driver["proc_version"] = self.fact("proc_driver_version", hw.proc_driver_version)
        driver = _drop_missing(driver)
        answered = self._nvml_gpus(nvml) if nvml is not None else []
        return driver, switches, self._place(answered, bus_gpus, nvml is not None)

    def _nvml_value(self, fn: Callable[[], Any]) -> Any:
        if self._nvml_hung:
            return {"error": f"not read: an earlier NVML call hung ({self._nvml_hung})"}
        try:
            return _plain(self.read(fn))
        except NotSupported:
            return "not_supported"
        except Hung as exc:
            self._nvml_hung = str(exc)
            return {"error": str(exc)}
        except Exception as exc:
            return {"error": _one_line(exc)}

    def _nvml_gpus(self, nvml: Any) -> list[dict[str, Any]]:
        count = self._nvml_value(nvml.device_count)
        if not isinstance(count, int):
            self.gaps.append(f"NVML device count: {count} (written as no GPUs)")
            return []
        gpus = []
        for index in range(count):
            try:
                handle = self.read(functools.partial(nvml.gpu, index))
            except GpuLost:
                gpus.append({"lost": True})
                continue
            except Exception as exc:  # only GPU_IS_LOST has a scenario spelling
                self.gaps.append(f"NVML GPU {index} handle: {_one_line(exc)} (left out)")
                continue
            gpus.append(self._gpu_fields(handle))
        return gpus

    def _gpu_fields(self, handle: GpuHandle) -> dict[str, Any]:
        fields: dict[str, Any] = {}
        for name in GPU_FIELDS:
            if self._nvml_hung:
                fields[name] = {"error": f"not read: an earlier NVML call hung "
                                         f"({self._nvml_hung})"}
                continue
            try:
                value = self.read(functools.partial(handle.query, name))
            except GpuLost:
                # Lost while being read: what the checks see from now on is a lost GPU.
                return {"lost": True, **({"pci_bus_id": fields["pci_bus_id"]}
                                         if isinstance(fields.get("pci_bus_id"), str) else {})}
            except NotSupported:
                fields[name] = "not_supported"
                continue
            except Hung as exc:
                self._nvml_hung = str(exc)
                fields[name] = {"error": str(exc)}
                continue
            except KeyError:
                fields[name] = {"error": f"{name} is not implemented by the {self.hw.name} "
                                         "backend"}
                continue
            except Exception as exc:
                fields[name] = {"error": _one_line(exc)}
                continue
            if name == "compute_capability" and isinstance(value, tuple | list):
                value = ".".join(str(v) for v in value)
            elif name == "nvlink" and isinstance(value, list):
                value = _compact_nvlink(_plain(value))
            fields[name] = _plain(value)
            if name == "clock_event_reasons" and type(fields[name]) is int:
                fields[name] = HexInt(fields[name])
        return fields

    def _place(self, answered: list[dict[str, Any]], bus: list[PciDevice], nvml_ok: bool
               ) -> list[dict[str, Any]]:
        """Join NVML's GPUs (in NVML order) with the bus: each gets its PCI facts; a lost GPU
        takes a bus address no answering GPU claimed, in order (as the checks place it); the
        bus GPUs left over are `nvml_visible: false` (only when NVML answered at all)."""
        by_address = {d.address: d for d in bus}
        claimed = {g["pci_bus_id"] for g in answered if isinstance(g.get("pci_bus_id"), str)}
        unclaimed = [d.address for d in bus if d.address not in claimed]
        entries = []
        for position, gpu in enumerate(answered):
            address = gpu.get("pci_bus_id")
            if not isinstance(address, str):
                if not unclaimed:
                    what = "lost GPU" if gpu.get("lost") else "GPU without a PCI address"
                    self.gaps.append(f"NVML index {position}: {what} with no unclaimed bus "
                                     "address (left out)")
                    continue
                address = unclaimed.pop(0)
                if not gpu.get("lost"):
                    self.gaps.append(f"NVML index {position}: PCI address unreadable "
                                     f"({gpu.get('pci_bus_id')}); placed at {address}")
            elif address not in by_address and bus:
                self.gaps.append(f"NVML GPU {address} is not on the PCI bus listing: the "
                                 "simulation will show it there")
            facts = _pci_facts(by_address[address]) if address in by_address else {}
            entries.append({"pci_bus_id": address, **facts,
                            **{k: v for k, v in gpu.items() if k != "pci_bus_id"}})
        hidden = [{"pci_bus_id": a, **_pci_facts(by_address[a]),
                   **({"nvml_visible": False} if nvml_ok else {})} for a in unclaimed]
        # Keep NVML's order; slot each bus-only GPU in before the first higher address.
        placed: list[dict[str, Any]] = []
        for entry in entries:
            while hidden and hidden[0]["pci_bus_id"] < entry["pci_bus_id"]:
                placed.append(hidden.pop(0))
            placed.append(entry)
        return placed + hidden

    # -- torch --------------------------------------------------------------------------------
    def torch(self) -> dict[str, Any]:
        try:
            info = self.read(self.hw.torch, timeout_s=max(self.timeout_s, 120.0))
        except Exception as exc:
            self.gaps.append(f"torch: {_one_line(exc)} (written as torch error)")
            return {"error": _one_line(exc)}
        data = _plain(dataclasses.asdict(info))
        data["capabilities"] = [".".join(map(str, c)) for c in data.get("capabilities") or []]
        return data


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


_MISSING: Any = _Missing()


def _drop_missing(mapping: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in mapping.items() if v is not _MISSING}


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if isinstance(exc, HardwareError) else f"{type(exc).__name__}: {text}"


def environment(environ: Any) -> dict[str, str]:
    return {str(k): report.env_value(str(k), str(v)) for k, v in sorted(dict(environ).items())
            if report.env_recorded(str(k)) or str(k) in ENV_NAMES or SLURM_GPU_RE.match(str(k))}


def _factor_defaults(gpus: list[dict[str, Any]]) -> dict[str, Any]:
    """Move the fields the GPUs share (same value) into gpu_defaults, as hand-written scenarios
    do; an 8-GPU recording then reads like one. An NVML field needs the same value on every GPU
    that answered (a lost or NVML-hidden GPU never shows it); a PCI fact, on every GPU."""
    answering = [g for g in gpus if not g.get("lost") and g.get("nvml_visible", True)]
    if len(answering) < 2:
        return {}
    shared = {}
    for key, value in answering[0].items():
        among = gpus if key not in GPU_FIELDS else answering
        if key not in IDENTITY and all(key in g and g[key] == value for g in among):
            shared[key] = value
    for gpu in gpus:
        for key in shared:
            gpu.pop(key, None)
    return shared


def record(hw: Backend, *, host: str, redact: bool = False, timeout_s: float = CALL_TIMEOUT_S,
           now: dt.datetime | None = None) -> Recording:
    """Read everything from `hw` and return it as a scenario (plus what could not be said)."""
    rec = Recorder(hw, timeout_s)
    host_facts = rec.host()
    driver, switches, gpus = rec.driver_and_gpus()
    scenario: dict[str, Any] = {"description": "", "host": host_facts, "driver": driver}
    if switches:
        scenario["nvswitches"] = switches
    defaults = _factor_defaults(gpus)
    if defaults:
        scenario["gpu_defaults"] = defaults
    scenario["gpus"] = gpus
    scenario["torch"] = rec.torch()
    fabric = rec.rdma(host_facts)
    if fabric is not _MISSING:
        scenario["rdma"] = fabric
    if redact:
        for dev in (fabric or {}).get("devices", []) if isinstance(fabric, dict) else []:
            for port in dev.get("ports", []):
                for gid in port.get("gids", []):
                    gid["gid"] = "redacted"  # a GID carries the port's MAC or IP address
        scenario = Redactor(scenario, host).apply(scenario)
    when = (now or dt.datetime.now(dt.UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    shown = REDACTED_HOST if redact else host
    scenario["description"] = (f"Recording of {shown} made {when} by nodecert {__version__} "
                               f"(python -m checks record{' --redact' if redact else ''})")
    return Recording(scenario, rec.gaps, rec.notes)
