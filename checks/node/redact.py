"""Redaction for `python -m checks record --redact`: a recording that can be shared.

Only what identifies the machine is replaced: GPU serials, GPU-/MIG- UUIDs, fabric cluster UUIDs
and the hostname. Everything the checks judge stays as read, so the verdict does not change.
"""

from __future__ import annotations

import re
from typing import Any

REDACTED_HOST = "redacted-host"
UUID_RE = re.compile(r"(?<![0-9A-Za-z])(GPU-|MIG-)?([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-"
                     r"[0-9a-fA-F]{4}-[0-9a-fA-F]{12})(?![0-9A-Za-z])")


class Redactor:
    """Serials, GPU/MIG UUIDs and fabric cluster UUIDs become stable placeholders (the same
    input gives the same placeholder everywhere in the file; a UUID keeps its shape, so
    CUDA_VISIBLE_DEVICES=GPU-... still names the same GPU); the hostname becomes
    `redacted-host` in the kernel log and the environment. Nothing else changes."""

    def __init__(self, scenario: dict[str, Any], host: str) -> None:
        self._uuids: dict[str, str] = {}
        self._serials: dict[str, str] = {}
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
        prefix, body = match.group(1) or "", match.group(2).lower()
        if not prefix and body not in self._known_bare:
            return match.group(0)  # some other UUID (a filesystem's): not the hardware's identity
        number = self._uuids.setdefault(body, f"{len(self._uuids) + 1:012d}")
        return f"{prefix}00000000-0000-0000-0000-{number}"

    def text(self, value: str, host_too: bool = False) -> str:
        if value in self._serials:
            return self._serials[value]
        value = UUID_RE.sub(self._uuid, value)
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
            host["kernel_log"] = [self.text(line, host_too=True)
                                  for line in scenario["host"]["kernel_log"]]
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
