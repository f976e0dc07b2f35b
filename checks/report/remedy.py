"""What may be done about a failing report unattended: one remedy class per fault code, as data.

Every code in checks/report/faults.yaml names its class under `remedy:`; `remedy_for(report)`
picks the one a node's report calls for, so the remediation loop (checks/fleet/remediate.py)
decides from data that docs/operations.md tables (`python -m checks.docgen.faults --write`):

    >>> remedy_for(json.load(open("/var/lib/nodecert/last.json")))
    Remedy(kind='gpu-reset', fault='GPU015', gpus=('GPU-6f1b...',), serials=(...), reason=...)

Why the strongest class wins: one action must cure every failing result, so a reboot covers a
GPU reset and a recheck, and a class a person must decide (`none`) or hardware nothing on site
repairs (`rma`) stops the loop. The driver knows more than the fault code, so its own word wins
over the code's default: NVML's GPU recovery action (check gpu-recovery-action), the action an
XID 154 line names, and NVIDIA's catalog action for the XID an xid-events result is about.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

CLASSES = ("recheck", "gpu-reset", "reboot", "reprovision", "rma", "none")

# Strongest first. `none` sits just below `rma`: a person must decide, whatever else failed,
# unless nothing on site can repair the node anyway.
STRENGTH = ("rma", "none", "reprovision", "reboot", "gpu-reset", "recheck")

# NVML's GPU recovery action (nvml.h nvmlGpuRecoveryAction_t, the values checks/hw/nvml.py reads
# into RECOVERY_ACTIONS; the same numbers an XID 154 line prints as "to 0x<n> (<name>)"). NVIDIA,
# "A100 GPU Memory Error Management", Error Recovery and Response Flags
# (https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/error-recovery-and-response-flags.html):
# Reset - end the GPU's processes, `nvidia-smi -r`; Reboot - the OS may be inconsistent; Drain P2P
# - quiesce peer-to-peer traffic (end the processes that use it); Drain and Reset - the GPU keeps
# working but is to be reset once drained. A drained node has no processes left, so both drains
# end in the reset the loop verifies. SYSTEM_REBOOT asks for a power cycle (a warm reboot is not
# enough) and RECOVER_IMEX_DOMAIN for an action across every tray of an NVLink domain: neither is
# one node's reboot or reset, so a person does it.
RECOVERY_ACTION_REMEDY = {
    "none": None,
    "gpu_reset": "gpu-reset",
    "node_reboot": "reboot",
    "drain_p2p": "gpu-reset",
    "drain_and_reset": "gpu-reset",
    "recover_imex_domain": "none",
    "bus_reset": "gpu-reset",
    "system_reboot": "none",
}
RECOVERY_ACTION_CODES = {0: "none", 1: "gpu_reset", 2: "node_reboot", 3: "drain_p2p",
                         4: "drain_and_reset", 5: "recover_imex_domain", 6: "bus_reset",
                         7: "system_reboot"}

# NVIDIA's XID catalog, column "Resolution Bucket (Immediate Action)" (checks/kernlog/xid.yaml,
# `catalog` source): RESET_GPU resets the GPU, RESTART_BM / RESTART_VM restart the machine,
# CONTACT_SUPPORT and CHECK_MECHANICALS are hardware nobody on site repairs; the two workflows
# (XID 48 double-bit ECC, NVLink errors) start with a GPU reset. Actions not here keep the code's
# default (GPU005's).
XID_ACTION_REMEDY = {
    "RESET_GPU": "gpu-reset",
    "RESTART_BM": "reboot",
    "RESTART_VM": "reboot",
    "CONTACT_SUPPORT": "rma",
    "CHECK_MECHANICALS": "rma",
    "WORKFLOW_XID_48": "gpu-reset",
    "WORKFLOW_NVLINK_ERR": "gpu-reset",
}
# checks/kernlog/nvstatus.yaml's remedy kinds for the driver's status lines.
STATUS_REMEDY = {"reset": "gpu-reset", "reboot": "reboot", "rma": "rma"}

SOURCES = {
    "recovery-action": "https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/"
                       "error-recovery-and-response-flags.html",
    "xid-catalog": "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html",
    "gpu-reset": "nvidia-smi(1), -r/--gpu-reset: the GPU must have no process on it",
    "nvswitch-reset": "https://docs.nvidia.com/datacenter/tesla/fabric-manager-user-guide/ "
                      "(GPU reset on NVSwitch systems: what Fabric Manager allows per baseboard)",
}

FAILING = ("FAIL", "ERROR")


@dataclass(frozen=True)
class Remedy:
    kind: str                  # one of CLASSES
    fault: str                 # the fault code that decided it (GPU015, GPU005, ...)
    gpus: tuple[str, ...]      # UUIDs of the GPUs the failing results name, where the report has them
    serials: tuple[str, ...]   # their board serials (what an RMA asks for)
    reason: str                # one line: the result that decided it, and why this class


@functools.lru_cache(maxsize=1)
def table() -> dict[str, str]:
    """Fault code -> remedy class from faults.yaml; empty when it is not installed or unreadable
    (every code then maps to `none`: a person decides, nothing is done unattended)."""
    from checks.report.act_on import faults

    return {code: str(entry["remedy"]) for code, entry in faults().items()
            if entry.get("remedy") in CLASSES}


def default_remedy(fault_code: str) -> str:
    """The class faults.yaml gives `fault_code`; a could-not-measure code (<CODE>-E) is `recheck`
    (nothing is known to be broken yet), an unknown code `none`."""
    if fault_code.endswith("-E"):
        return "recheck"
    return table().get(fault_code, "none")


def strongest(kinds: list[str]) -> str:
    return min(kinds, key=STRENGTH.index)


def _driver_action(check_id: str, result: dict[str, Any]) -> tuple[str, str] | None:
    """(class, why) when the driver's own word overrides the fault code's default."""
    raw = result.get("details")
    details: dict[str, Any] = raw if isinstance(raw, dict) else {}
    if check_id == "gpu-recovery-action" and result.get("status") == "FAIL":
        action = str(result.get("value"))
        kind = RECOVERY_ACTION_REMEDY.get(action)
        if kind:
            return kind, f"NVML recovery action {action.upper()}"
        return "none", f"NVML recovery action {action!r}, unknown to this table"
    if check_id != "xid-events" or result.get("status") != "FAIL":
        return None
    recovery = details.get("recovery_action")
    if isinstance(recovery, dict):
        try:
            action = RECOVERY_ACTION_CODES.get(int(str(recovery.get("code")), 16), "")
        except ValueError:
            action = ""
        kind = RECOVERY_ACTION_REMEDY.get(action)
        if kind:
            return kind, f"XID 154: the driver asks for {recovery.get('name')}"
        return "none", f"XID 154: recovery action {recovery.get('name')!r}, unknown to this table"
    status_kind = STATUS_REMEDY.get(str(details.get("remedy_kind")))
    if status_kind:
        return status_kind, f"driver status {details.get('status')}"
    catalog = details.get("catalog")
    if isinstance(catalog, dict) and catalog.get("action") in XID_ACTION_REMEDY:
        return (XID_ACTION_REMEDY[catalog["action"]],
                f"XID {details.get('xid')} catalog action {catalog['action']}")
    if details.get("reset_request"):
        return "gpu-reset", f"XID {details.get('xid')}: the driver asks {details['reset_request']}"
    return None


def remedy_for(report: dict[str, Any]) -> Remedy | None:
    """The remedy a node report calls for: None when no result FAILs or ERRORs, else the
    strongest class over the failing results (STRENGTH), with the GPUs and serials every failing
    result of that class names. A result that is not a mapping is skipped; a report without
    `checks` has nothing failing."""
    chosen: list[tuple[str, str, str, dict[str, Any]]] = []  # (kind, fault, why, result)
    checks = report.get("checks") if isinstance(report, dict) else None
    for chk in checks if isinstance(checks, list) else ():
        if not isinstance(chk, dict):
            continue
        for result in chk.get("results") or ():
            if not isinstance(result, dict) or result.get("status") not in FAILING:
                continue
            code = str(result.get("fault_code") or chk.get("code") or "")
            if result.get("status") == "ERROR" and not code.endswith("-E"):
                code += "-E"
            override = _driver_action(str(chk.get("id")), result)
            kind, why = override or (default_remedy(code), f"{code} defaults to this class")
            chosen.append((kind, code, why, result))
    if not chosen:
        return None
    kind = strongest([c[0] for c in chosen])
    same = [c for c in chosen if c[0] == kind]
    devices: list[dict[str, Any]] = [r["device"] for _, _, _, r in same
                                     if isinstance(r.get("device"), dict)]
    gpus = tuple(dict.fromkeys(str(d["uuid"]) for d in devices if d.get("uuid")))
    serials = tuple(dict.fromkeys(str(d["serial"]) for d in devices if d.get("serial")))
    _, fault, why, result = same[0]
    where = f" on {', '.join(gpus)}" if gpus else ""
    message = " ".join(str(result.get("message") or "").split())
    return Remedy(kind=kind, fault=fault, gpus=gpus, serials=serials,
                  reason=f"{kind}: {fault}{where} ({why}): {message}")
