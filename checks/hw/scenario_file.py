"""The scenario file format: where shipped scenarios live, `extends:` and `gpu_overrides:`
merged, every key and type checked (one line naming the file and the key on a mistake). The
fixture backend (checks/hw/fixture.py) plays what a loaded scenario says; the format itself is
documented in docs/scenarios.md."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import yaml

from checks import resources, safeyaml
from checks.hw.base import (
    GPU_FIELDS,
)

SCENARIO_DIR = resources.data("scenarios")
TOP_KEYS = {"description", "extends", "host", "driver", "gpu_defaults", "gpus", "gpu_overrides",
            "nvswitches", "torch", "measurements",
            "rdma"}  # RDMA devices (see _rdma_devices)
HOST_KEYS = {"os_release", "kernel", "cpu_count", "numa_nodes", "shm_bytes", "shm_free_bytes",
             "memlock", "secure_boot", "modules", "module_signers", "services", "kernel_log", "env",
             "virtualization", "container", "device_nodes", "fabric_manager_version",
             "imex_nodes", "dmi_product",
             # /sys/kernel/mm/memory_peers entries, ACS control per bridge address,
             # network interface names
             "memory_peers", "acs", "net_interfaces",
             # perftest's ib_write_bw: {path, cuda} (absent: not installed); its recorded output
             # is measurements.ib_write_bw
             "perftest",
             # storage and swap: python_paths {venv, torch}; disks {mount point: {total_bytes,
             # free_bytes}}; swaps [{name, type, size_bytes, used_bytes}] or /proc/swaps text;
             # BMC: ipmitool {device, sdr, sel_elist}; DCGM: dcgm {path, diag}. See
             # FixtureBackend.disk_usage and _tool_answer for the forms.
             "python_paths", "disks", "swaps", "ipmitool", "dcgm",
             # {pid: text of /proc/PID/cgroup}: which GPU processes a Slurm job owns; where no
             # cgroup says, process_tree: {pid: {ppid, uid, comm, cmdline}} (or `live`: this
             # machine's /proc) finds the job step's slurmstepd above them (checks/hw/jobprocs.py)
             "process_cgroups", "process_tree"}
DRIVER_KEYS = {"nvml", "version", "cuda_version", "proc_version"}
# Per-GPU keys that describe the PCI side rather than NVML answers.
GPU_PCI_KEYS = {"pci_device_id", "on_pci", "nvml_visible", "lost", "numa_node", "link", "pci_path",
                "mig_instances"}
TORCH_KEYS = {"version", "cuda", "cuda_available", "device_count", "arch_list", "nccl", "cudnn",
              "error", "capabilities", "device_names"}
# An `nvswitches:` entry is an address, or a mapping with the PCI facts of that switch.
NVSWITCH_KEYS = {"address", "pci_device_id", "numa_node", "link", "pci_path"}
NVML_KINDS = {"ok", "library_missing", "driver_not_loaded", "bindings_missing", "init_failed",
              "no_permission"}
NVSWITCH_DEVICE_ID = 0x22A3
RDMA_DEVICE_KEYS = {"name", "fw_ver", "hca_type", "pci_address", "numa_node", "pci_path", "ports"}
RDMA_PORT_KEYS = {"port", "state", "phys_state", "rate", "link_layer", "gids", "active_mtu",
                  "netdev", "counters"}


class ScenarioError(Exception):
    """The scenario file is malformed; the message is one line naming the file and the problem."""


def resolve(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if path.is_file():
        return path
    for candidate in (SCENARIO_DIR / name_or_path, SCENARIO_DIR / f"{name_or_path}.yaml"):
        if candidate.is_file():
            return Path(str(candidate))
    raise ScenarioError(f"scenario {name_or_path!r}: no such file or shipped scenario "
                        f"(shipped: {', '.join(shipped())})")


def shipped() -> list[str]:
    return resources.stems("scenarios")


def merge(base: Any, over: Any) -> Any:
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for key, value in over.items():
            out[key] = merge(base.get(key), value) if key in base else copy.deepcopy(value)
        return out
    return copy.deepcopy(over)


def _key_names(keys: set[Any]) -> list[str]:
    """Unknown keys as the message may show them: a key that is no plain name is counted, not
    shown (a file that is no scenario, /etc/shadow, must not have its lines echoed)."""
    plain = sorted(k for k in keys if isinstance(k, str) and re.fullmatch(r"[A-Za-z_][\w-]{0,40}", k))
    other = len(keys) - len(plain)
    return plain + ([f"<{other} key(s) that are not plain names>"] if other else [])


def load_scenario(name_or_path: str, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    path = resolve(name_or_path).resolve()
    if path in _seen:
        raise ScenarioError(f"{path}: 'extends' loops back to itself")
    try:
        text = path.read_text()
        data = json.loads(text) if path.suffix == ".json" else safeyaml.load(text)
    except RecursionError:
        raise ScenarioError(f"{path}: cannot parse: nested too deep") from None
    except yaml.YAMLError as exc:  # the problem and where, never the file's text (--simulate /etc/shadow)
        mark = getattr(exc, "problem_mark", None)
        if mark is None:  # safeyaml's own refusals (alias bombs, ...) quote no text
            raise ScenarioError(f"{path}: cannot parse: {' '.join(str(exc).split())}") from None
        problem = getattr(exc, "problem", None) or "not YAML"
        raise ScenarioError(f"{path}: cannot parse: {problem} at line {mark.line + 1}, "
                            f"column {mark.column + 1}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ScenarioError(f"{path}: cannot parse: {' '.join(str(exc).split())}") from exc
    if not isinstance(data, dict):
        raise ScenarioError(f"{path}: top level must be a mapping, got {type(data).__name__}")
    unknown = set(data) - TOP_KEYS
    if unknown:
        raise ScenarioError(f"{path}: unknown key(s) {_key_names(unknown)}; allowed: {sorted(TOP_KEYS)}")
    parent = data.get("extends")
    if parent is not None:
        if not isinstance(parent, str):
            raise ScenarioError(f"{path}: 'extends' must be a scenario name or path")
        rel = path.parent / parent
        base = load_scenario(str(rel) if rel.is_file() else parent, (*_seen, path))
        overrides = data.pop("gpu_overrides", None)
        data = merge(base, {k: v for k, v in data.items() if k != "extends"})
        if overrides is not None:
            data["gpu_overrides"] = overrides
    _apply_overrides(path, data)
    _validate(path, data)
    data["_path"] = str(path)
    return data


def _apply_overrides(path: Path, data: dict[str, Any]) -> None:
    overrides = data.pop("gpu_overrides", None) or {}
    if not isinstance(overrides, dict):
        raise ScenarioError(f"{path}: gpu_overrides must map GPU index to fields")
    gpus = data.get("gpus") or []
    for key, patch in overrides.items():
        try:
            index = int(key)
            gpus[index] = merge(gpus[index], patch)
        except (ValueError, IndexError):
            raise ScenarioError(f"{path}: gpu_overrides index {key!r} is not one of the "
                                f"{len(gpus)} GPUs") from None
        except TypeError:
            raise ScenarioError(f"{path}: gpu_overrides[{key}] must be a mapping") from None


def _validate(path: Path, data: dict[str, Any]) -> None:
    def check_keys(section: str, value: Any, allowed: set[str]) -> None:
        if value is None:
            return
        if not isinstance(value, dict):
            raise ScenarioError(f"{path}: '{section}' must be a mapping")
        bad = set(value) - allowed
        if bad:
            raise ScenarioError(f"{path}: unknown key(s) {sorted(bad, key=str)} in '{section}'")

    check_keys("host", data.get("host"), HOST_KEYS)
    check_keys("driver", data.get("driver"), DRIVER_KEYS)
    check_keys("torch", data.get("torch"), TORCH_KEYS)
    gpu_keys = set(GPU_FIELDS) | GPU_PCI_KEYS
    check_keys("gpu_defaults", data.get("gpu_defaults"), gpu_keys)
    if not isinstance(data.get("nvswitches") or [], list):
        raise _type_error(path, "nvswitches", data["nvswitches"], (list,))
    for i, switch in enumerate(data.get("nvswitches") or []):
        if isinstance(switch, dict):
            check_keys(f"nvswitches[{i}]", switch, NVSWITCH_KEYS)
            if not switch.get("address"):
                raise ScenarioError(f"{path}: nvswitches[{i}] has no address")
    _validate_rdma(path, data.get("rdma"), check_keys)
    gpus = data.get("gpus", [])
    if not isinstance(gpus, list):
        raise ScenarioError(f"{path}: 'gpus' must be a list")
    for i, gpu in enumerate(gpus):
        check_keys(f"gpus[{i}]", gpu, gpu_keys)
        if not (gpu or {}).get("pci_bus_id") and not (data.get("gpu_defaults") or {}).get(
                "pci_bus_id"):
            raise ScenarioError(f"{path}: gpus[{i}] has no pci_bus_id")
    nvml = (data.get("driver") or {}).get("nvml", "ok")
    if nvml not in NVML_KINDS:
        raise ScenarioError(f"{path}: driver.nvml must be one of {sorted(NVML_KINDS)}")
    _validate_types(path, data)
    _validate_gpu_values(path, data)
    _validate_process_tree(path, (data.get("host") or {}).get("process_tree"))
    for key in ("cpu_count", "shm_bytes"):
        host = data.get("host") or {}
        value = host.get(key)
        failed = key == "shm_bytes" and isinstance(value, dict) and set(value) == {"error"}
        if (key in host or value is not None) and not failed and (
                not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise ScenarioError(f"{path}: host.{key} must be a non-negative integer")


PROCESS_KEYS = {"ppid": int, "uid": int, "comm": str, "cmdline": str}


def _validate_process_tree(path: Path, tree: Any) -> None:
    """host.process_tree: `live`, or {pid: {ppid, uid, comm, cmdline}} with integer PIDs."""
    if tree is None or tree == "live":
        return
    where = f"{path}: host.process_tree"
    if not isinstance(tree, dict):
        raise ScenarioError(f"{where} must be 'live' or a mapping of PID to process")
    for pid, entry in tree.items():
        if not str(pid).isdigit():
            raise ScenarioError(f"{where}: {pid!r} is not a PID")
        if not isinstance(entry, dict) or set(entry) - set(PROCESS_KEYS):
            raise ScenarioError(f"{where}[{pid}] must be a mapping of {sorted(PROCESS_KEYS)}")
        for key, kind in PROCESS_KEYS.items():
            value = entry.get(key)
            if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
                raise ScenarioError(f"{where}[{pid}].{key} must be {kind.__name__}, got {value!r}")


# Keys whose type the backend relies on: a wrong type is one error line naming the key, never a
# traceback from deep inside a check. `{error: text}` and `not_supported` stay allowed wherever
# the format allows a failed read.
_SECTION_TYPES: dict[str, dict[str, tuple[type, ...]]] = {
    "host": {"env": (dict,), "os_release": (dict,), "numa_nodes": (dict,), "services": (dict,),
             "module_signers": (dict,), "kernel": (str,), "modules": (list, dict),
             "kernel_log": (list, dict), "imex_nodes": (list, dict), "memlock": (int, str)},
    "driver": {"version": (str, dict), "cuda_version": (int, dict)},
    "torch": {"device_count": (int,), "version": (str,), "cuda_available": (bool,)},
}
_GPU_TYPES: dict[str, tuple[type, ...]] = {
    "link": (dict,), "pci_device_id": (int,), "pci_bus_id": (str,), "numa_node": (int,),
    "pci_path": (list,), "name": (str, dict), "uuid": (str, dict), "serial": (str, int, dict)}


def _type_error(path: Path, where: str, value: Any, types: tuple[type, ...]) -> ScenarioError:
    names = {dict: "a mapping", list: "a list", str: "a string", int: "an integer", bool: "true/false"}
    wanted = " or ".join(names.get(t, t.__name__) for t in types)
    return ScenarioError(f"{path}: {where} must be {wanted}, got {type(value).__name__} {value!r:.60}")


def _validate_types(path: Path, data: dict[str, Any]) -> None:
    for section, types in _SECTION_TYPES.items():
        body = data.get(section) or {}
        for key, allowed in types.items():
            value = body.get(key)
            if value is None or value == "not_supported":
                continue
            if isinstance(value, bool) and bool not in allowed:
                raise _type_error(path, f"{section}.{key}", value, allowed)
            if not isinstance(value, allowed):
                raise _type_error(path, f"{section}.{key}", value, allowed)
    env = (data.get("host") or {}).get("env") or {}
    for name, value in env.items():
        if not isinstance(name, str) or isinstance(value, dict | list):
            raise ScenarioError(f"{path}: host.env.{name} must be a variable name and a text value")
    gpus = [("gpu_defaults", data.get("gpu_defaults") or {})] + [
        (f"gpus[{i}]", g or {}) for i, g in enumerate(data.get("gpus") or []) if isinstance(g, dict)]
    for where, gpu in gpus:
        for key, allowed in _GPU_TYPES.items():
            value = gpu.get(key)
            if value is None or value == "not_supported" or (isinstance(value, dict) and "error" in value):
                continue
            if isinstance(value, bool) or not isinstance(value, allowed):
                raise _type_error(path, f"{where}.{key}", value, allowed)


# Counters NVML returns as unsigned integers: a negative one describes no machine.
_GPU_COUNTERS = ("ecc_volatile_uncorrected", "ecc_volatile_corrected", "ecc_aggregate_uncorrected",
                 "ecc_aggregate_corrected", "retired_pages_sbe", "retired_pages_dbe",
                 "retired_pages_pending", "pcie_replay_counter")


def _validate_gpu_values(path: Path, data: dict[str, Any]) -> None:
    """Values no GPU reports: a negative counter, two GPUs with one UUID (NVML's UUIDs are unique
    per GPU, and reports, drains and history key GPUs on them)."""
    defaults = data.get("gpu_defaults") or {}
    seen: dict[str, int] = {}
    for i, gpu in enumerate(data.get("gpus") or []):
        fields = merge(defaults, gpu or {})
        for key in _GPU_COUNTERS:
            value = fields.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value < 0:
                raise ScenarioError(f"{path}: gpus[{i}].{key} must be a non-negative count, got {value}")
        uuid = fields.get("uuid")
        if isinstance(uuid, str):
            if uuid in seen:
                raise ScenarioError(f"{path}: gpus[{i}] has the UUID of gpus[{seen[uuid]}] ({uuid:.60}): "
                                    "each GPU's UUID is its own")
            seen[uuid] = i


def _validate_rdma(path: Path, rdma: Any, check_keys: Any) -> None:
    """`rdma: {devices: [...]}` or `rdma: {error: text}` (the class directory unreadable)."""
    if rdma is None or (isinstance(rdma, dict) and set(rdma) == {"error"}):
        return
    if not isinstance(rdma, dict) or not isinstance(rdma.get("devices", []), list):
        raise ScenarioError(f"{path}: 'rdma' must be a mapping with a 'devices' list")
    check_keys("rdma", rdma, {"devices"})
    for i, device in enumerate(rdma.get("devices") or []):
        check_keys(f"rdma.devices[{i}]", device, RDMA_DEVICE_KEYS)
        if not (device or {}).get("name"):
            raise ScenarioError(f"{path}: rdma.devices[{i}] has no name")
        for j, port in enumerate(device.get("ports") or []):
            check_keys(f"rdma.devices[{i}].ports[{j}]", port, RDMA_PORT_KEYS)
