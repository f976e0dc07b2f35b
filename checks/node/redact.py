"""Redaction for `python -m checks record --redact`: a recording that can be shared.

What identifies the machine or its network is replaced by stable placeholders (the same input
gives the same placeholder everywhere in the file, so equal things stay equal): GPU serials,
every UUID (GPU-/MIG-, fabric cluster, filesystem), the hostname, IPv4 and IPv6 addresses, MAC
and IPoIB hardware addresses, IMEX peers. The kernel command line keeps only the parameters in
CMDLINE_KEPT (the GPU-relevant ones: IOMMU, PCIe, nouveau/nvidia module options); every other
parameter (root=UUID=..., a token someone put there) is removed. Everything the checks judge
stays as read, so the verdict does not change. docs/recording.md lists it all.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any

REDACTED_HOST = "redacted-host"
UUID_RE = re.compile(r"(?<![0-9A-Za-z])(GPU-|MIG-)?([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-"
                     r"[0-9a-fA-F]{4}-[0-9a-fA-F]{12})(?![0-9A-Za-z])")


IPV4_RE = re.compile(r"(?<![\w.])(\d{1,3}(?:\.\d{1,3}){3})(?![\w]|\.\d)")
IPV6_RE = re.compile(r"(?<![\w:.])([0-9A-Fa-f]{0,4}(?::[0-9A-Fa-f]{0,4}){2,7}(?:%\w+)?)(?![\w:])")
# MAC (6 octets) up to IPoIB hardware addresses (20 octets), ':' or '-' separated.
MAC_RE = re.compile(r"(?<![\w:-])([0-9A-Fa-f]{2}(?:([:-])[0-9A-Fa-f]{2})(?:\2[0-9A-Fa-f]{2}){4,18})"
                    r"(?![\w:-])")
# "Command line: ..." (x86 early boot) and "Kernel command line: ...".
CMDLINE_RE = re.compile(r"^(.*?\b(?:Kernel )?[Cc]ommand line:\s*)(.*)$")
# The kernel's echo of the parameters it did not recognise, which carries the same values:
#   Unknown kernel command line parameters "BOOT_IMAGE=... token=...", will be passed to user space.
# (printed by init/main.c's print_unknown_bootoptions since Linux 5.15).
UNKNOWN_PARAMS_RE = re.compile(r'^(.*?\bUnknown kernel command line parameters\s*")([^"]*)(".*)$')
# Kernel parameters kept in a redacted recording: the GPU-relevant ones a reader (or a check's
# remedy: IOMMU and ACS for P2P, nouveau for the driver) asks about. Nothing else is kept.
CMDLINE_KEPT = ("iommu", "intel_iommu", "amd_iommu", "iommu.passthrough", "iommu.strict", "pci",
                "pcie_aspm", "pcie_acs_override", "nouveau.modeset", "modprobe.blacklist",
                "rd.driver.blacklist", "nvidia-drm.modeset", "nvidia_drm.modeset",
                "nvidia-drm.fbdev", "nvidia.NVreg_", "hugepagesz", "default_hugepagesz",
                "hugepages", "isolcpus", "numa_balancing", "init_on_alloc", "mitigations")
NOT_IDENTIFYING_IPS = {"0.0.0.0", "127.0.0.1", "::", "::1"}


def cmdline_kept(param: str) -> bool:
    name = param.split("=", 1)[0]
    return any(name == k or (k.endswith("_") and name.startswith(k)) for k in CMDLINE_KEPT)


def _cmdline_parts(line: str) -> tuple[str, str, str] | None:
    """(before, parameters, after) of a log line that lists kernel parameters: the command line
    itself or the kernel's "Unknown kernel command line parameters" echo; None for any other."""
    m = UNKNOWN_PARAMS_RE.match(line)
    if m:
        return m.group(1), m.group(2), m.group(3)
    m = CMDLINE_RE.match(line)
    return (m.group(1), m.group(2), "") if m else None


def redact_cmdline(line: str) -> str:
    """A kernel command line log line (or the kernel's echo of its unknown parameters) with only
    the CMDLINE_KEPT parameters, a secret in their values masked (secret_param)."""
    parts = _cmdline_parts(line)
    if parts is None:
        return line
    before, given, after = parts
    params = given.split()
    kept = [_masked_param(p) for p in params if cmdline_kept(p)]
    gone = len(params) - len(kept)
    return before + " ".join(kept) + after + (f" [{gone} parameters removed by --redact]" if gone else "")


# an assignment inside a parameter's value: nvidia.NVreg_RegistryDwords="RmApiKey=...;Other=1"
_INNER_NAME = re.compile(r"(?:^|[\s;,\"'])([A-Za-z_][\w.-]*)=")


def secret_param(param: str) -> bool:
    """Whether a kernel parameter's value is a secret: its name looks like one (vault_token=), its
    value does (URL credentials, a token: environment.SECRET_VALUE), or its value assigns a name
    that looks like one (a driver's registry string holding RmApiKey=...)."""
    from checks.environment import SECRET_NAME, SECRET_VALUE

    if "=" not in param:
        return False
    name, value = param.split("=", 1)
    return bool(SECRET_NAME.search(name) or SECRET_VALUE.search(value)
                or any(SECRET_NAME.search(inner) for inner in _INNER_NAME.findall(value)))


def _masked_param(param: str) -> str:
    from checks.environment import MASKED

    return f"{param.split('=', 1)[0]}={MASKED}" if secret_param(param) else param


def mask_cmdline_secrets(line: str) -> str:
    """A kernel command line with the value of every secret parameter (secret_param) masked;
    applied to every recording, redacted or not."""
    parts = _cmdline_parts(line)
    if parts is None:
        return line
    before, given, after = parts
    return before + " ".join(_masked_param(p) for p in given.split()) + after


class Redactor:
    """Serials, GPU/MIG UUIDs and fabric cluster UUIDs become stable placeholders (the same
    input gives the same placeholder everywhere in the file; a UUID keeps its shape, so
    CUDA_VISIBLE_DEVICES=GPU-... still names the same GPU); the hostname becomes
    `redacted-host` in the kernel log and the environment. Nothing else changes."""

    def __init__(self, scenario: dict[str, Any], host: str) -> None:
        self._uuids: dict[str, str] = {}
        self._serials: dict[str, str] = {}
        self._addresses: dict[str, str] = {}
        self._known_bare: set[str] = set()  # cluster UUIDs (no GPU-/MIG- prefix)
        gpus = [scenario.get("gpu_defaults") or {}, *scenario.get("gpus", [])]
        for gpu in gpus:
            serial = gpu.get("serial")
            if isinstance(serial, str) and serial and serial != "not_supported":
                self._serials.setdefault(serial, f"REDACTED-SERIAL-{len(self._serials) + 1}")
            fabric = gpu.get("fabric_info")
            if isinstance(fabric, dict) and isinstance(fabric.get("cluster_uuid"), str):
                self._known_bare.add(fabric["cluster_uuid"].lower())
            uuid = gpu.get("uuid")
            if isinstance(uuid, str) and (m := UUID_RE.fullmatch(uuid)):
                self._known_bare.add(m.group(2).lower())
        self._known_uuids = [u for u in (g.get("uuid") for g in gpus) if isinstance(u, str)]
        names = sorted({host, host.split(".")[0]} - {""}, key=len, reverse=True)
        self._host_re = re.compile(
            r"(?<![A-Za-z0-9_.-])(" + "|".join(map(re.escape, names)) +
            r")(?![A-Za-z0-9_-]|\.[A-Za-z0-9])") if names else None
        long = [s for s in self._serials if len(s) >= 6]
        self._serial_re = re.compile(r"(?<![0-9A-Za-z])(" + "|".join(map(re.escape, long)) +
                                     r")(?![0-9A-Za-z])") if long else None

    def _uuid(self, match: re.Match[str]) -> str:
        # Every UUID: the hardware's (GPU-, MIG-, fabric cluster) and any other (a filesystem's,
        # root=UUID=...), which identifies the machine as well.
        prefix, body = match.group(1) or "", match.group(2).lower()
        number = self._uuids.setdefault(body, f"{len(self._uuids) + 1:012d}")
        return f"{prefix}00000000-0000-0000-0000-{number}"

    def _placeholder(self, kind: str, key: str, make: Any) -> str:
        known = self._addresses.get(f"{kind}:{key}")
        if known is None:
            n = sum(1 for k in self._addresses if k.startswith(f"{kind}:")) + 1
            known = self._addresses[f"{kind}:{key}"] = make(n)
        return known

    def _ipv4(self, match: re.Match[str]) -> str:
        text = match.group(1)
        try:
            ipaddress.IPv4Address(text)
        except ValueError:
            return text
        if text in NOT_IDENTIFYING_IPS:
            return text
        # Documentation ranges (RFC 5737): never a real host's address.
        nets = ("192.0.2", "198.51.100", "203.0.113")
        return self._placeholder("v4", text, lambda n: f"{nets[min(n // 254, 2)]}.{n % 254 + 1}")

    def _ipv6(self, match: re.Match[str]) -> str:
        text = match.group(1)
        try:
            addr = ipaddress.IPv6Address(text.split("%")[0])
        except ValueError:
            return text
        if text.count(":") < 2 or str(addr) in NOT_IDENTIFYING_IPS:
            return text
        return self._placeholder("v6", str(addr), lambda n: f"2001:db8::{n:x}")  # RFC 3849

    def _mac(self, match: re.Match[str]) -> str:
        text, sep = match.group(1), match.group(2)
        octets = len(text.split(sep))
        return self._placeholder("mac", text.lower(), lambda n: sep.join(
            ["02", *["00"] * (octets - 3), f"{n >> 8 & 0xff:02x}", f"{n & 0xff:02x}"]))

    def addresses(self, value: str) -> str:
        """IPv4, IPv6 and MAC addresses replaced by stable placeholders."""
        value = MAC_RE.sub(self._mac, value)
        value = IPV4_RE.sub(self._ipv4, value)
        return IPV6_RE.sub(self._ipv6, value)

    def peer(self, value: str) -> str:
        """An IMEX peer: its address as a placeholder, a host name as redacted-peer-N."""
        out = self.addresses(value)
        if out != value or not value.strip():
            return out
        return self._placeholder("peer", value, lambda n: f"redacted-peer-{n}")

    def text(self, value: str, host_too: bool = False) -> str:
        if value in self._serials:
            return self._serials[value]
        value = self.addresses(UUID_RE.sub(self._uuid, value))
        if self._serial_re:
            value = self._serial_re.sub(lambda m: self._serials[m.group(1)], value)
        if host_too and self._host_re:
            value = self._host_re.sub(REDACTED_HOST, value)
        return value

    def _env_value(self, value: str) -> str:
        # CUDA accepts a unique UUID prefix (GPU-6f1b): name the whole placeholder instead.
        tokens = []
        for token in value.split(","):
            full = [u for u in self._known_uuids if token.strip() and
                    token.strip().startswith(("GPU-", "MIG-")) and u.startswith(token.strip())]
            tokens.append(full[0] if len(full) == 1 else token)
        return self.text(",".join(tokens), host_too=True)

    def apply(self, scenario: dict[str, Any]) -> dict[str, Any]:
        out = self._walk(scenario, host_too=False)
        host = out.get("host") or {}
        if isinstance(host.get("kernel_log"), list):
            host["kernel_log"] = [self.text(redact_cmdline(str(line)), host_too=True)
                                  for line in scenario["host"]["kernel_log"]]
        if isinstance(host.get("imex_nodes"), list):
            host["imex_nodes"] = [self.peer(str(p)) for p in scenario["host"]["imex_nodes"]]
        if isinstance(host.get("env"), dict):
            host["env"] = {k: self._env_value(v) for k, v in scenario["host"]["env"].items()}
        return out

    def _walk(self, value: Any, host_too: bool) -> Any:
        if isinstance(value, str):
            return self.text(value, host_too)
        if isinstance(value, dict):
            return {k: self._walk(v, host_too) for k, v in value.items()}
        if isinstance(value, list):
            return [self._walk(v, host_too) for v in value]
        return value
