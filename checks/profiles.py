"""Per-GPU-model thresholds, kept as data in checks/profiles/*.yaml.

A profile `extends:` another (normally `generic`); mappings merge. It is chosen by --profile,
else by the NVIDIA GPUs' PCI device IDs (readable with no driver), else by NVML's model name.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from checks import resources, safeyaml

PROFILE_DIR = resources.data("profiles")
SCHEMA = resources.data("schema", "profile.schema.json")
# The shipped profiles' texts the tests validated (checks/docgen/profile_digests.py): one of these
# is not validated again at run time.
DIGESTS = resources.data("schema", "profile-digests.json")
# libyaml when PyYAML has it: detection parses every profile (most extend generic) on each run,
# ~0.5 CPU s in pure Python, the largest part of the health check's quick level.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
GENERIC = "generic"


class ProfileError(Exception):
    """Unknown or malformed profile (one-line message)."""


@dataclass
class Profile:
    name: str
    data: dict[str, Any]
    # Why this profile was chosen (e.g. "PCI device 0x2330"), or why it fell back to generic.
    reason: str = ""
    unknown_models: list[str] = field(default_factory=list)

    def get(self, dotted: str, default: Any = None) -> Any:
        node: Any = self.data
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    def require(self, dotted: str) -> Any:
        value = self.get(dotted)
        if value is None:
            raise ProfileError(f"profile {self.name} has no '{dotted}'")
        return value

    @property
    def description(self) -> str:
        return str(self.data.get("description", self.name))


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over` laid on a copy of `base`: mappings merge key by key, anything else replaces."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def available() -> list[str]:
    return resources.stems("profiles")


@functools.cache
def _validator() -> Any:
    import jsonschema

    return jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text()))


@functools.cache
def _fast_validator() -> Any:
    """jsonschema-rs's compiled schema, None without it: it says whether a profile is valid
    (~0.1 ms, where importing the pure-Python jsonschema alone takes ~60); jsonschema says why not."""
    try:
        import jsonschema_rs
    except ImportError:
        return None
    return jsonschema_rs.validator_for(json.loads(SCHEMA.read_text()))


def validate(data: dict[str, Any], where: str) -> None:
    """Every key known to the profile schema, every value of its type: else one line naming the
    file and the key (a typo would otherwise silently leave the generic default in force)."""
    fast = _fast_validator()
    if fast is not None and fast.is_valid(data):
        return
    errors = sorted(_validator().iter_errors(data), key=lambda e: list(map(str, e.absolute_path)))
    if not errors:
        return
    error = errors[0]
    key = ".".join(str(p) for p in error.absolute_path)
    if error.validator == "additionalProperties":
        known = set((error.schema.get("properties") or {}).keys())
        unknown = sorted(set(error.instance) - known) if isinstance(error.instance, dict) else []
        names = ", ".join(f"{key + '.' if key else ''}{u}" for u in unknown)
        raise ProfileError(f"{where}: unknown key {names} "
                           "(the keys are in checks/schema/profile.schema.json)")
    # A rule of the schema that says what it asks for (a `description` beside the rule).
    why = error.schema.get("description") if isinstance(error.schema, dict) else None
    raise ProfileError(f"{where}: {key or 'top level'}: {' '.join(error.message.split())[:200]}"
                       + (f" ({why})" if why and error.validator == "required" else ""))


def not_finite(node: Any, where: str = "") -> str | None:
    """The dotted key of the first number that is NaN or infinite (`.nan` in YAML): a threshold
    every comparison with is false can never fail."""
    if isinstance(node, float) and not math.isfinite(node):
        return where or "(top level)"
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in items:
        found = not_finite(value, f"{where}.{key}" if where else str(key))
        if found:
            return found
    return None


def load(name: str, _seen: tuple[str, ...] = ()) -> Profile:
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", name) or ".." in name:
        raise ProfileError(f"unknown profile {name!r}; available: {', '.join(available())}")
    path = PROFILE_DIR / f"{name}.yaml"
    if not path.is_file():
        raise ProfileError(f"unknown profile {name!r}; available: {', '.join(available())}")
    if name in _seen:
        raise ProfileError(f"profile {name}: 'extends' loops")
    try:
        stat = Path(str(path)).stat()  # installed from a wheel: plain files on disk
        data = copy.deepcopy(_parse(str(path), stat.st_mtime_ns, stat.st_size, name))
    except (yaml.YAMLError, RecursionError, UnicodeDecodeError) as exc:
        raise ProfileError(f"{path}: cannot parse: {' '.join(str(exc).split())}") from exc
    parent = data.pop("extends", None)
    if parent:
        data = merge(load(parent, (*_seen, name)).data, data)
    data["name"] = name
    return Profile(name=name, data=data)


def _has_alias(text: str) -> bool:
    return "*" in text and any(isinstance(event, yaml.AliasEvent)
                               for event in yaml.parse(text, Loader=_LOADER))


@functools.lru_cache(maxsize=256)
def _parse(path: str, _mtime_ns: int, _size: int, name: str) -> Any:
    """One profile file parsed and validated once per process (and again when it changes)."""
    # libyaml's safe loader where the text has no alias (an alias needs '*'; libyaml's parser,
    # which expands nothing, tells a '*' in a comment or a string from one): fast, and nothing to
    # expand; else checks/safeyaml.py's bounded loader, which refuses an alias bomb.
    raw = Path(path).read_bytes()
    text = raw.decode()
    data = yaml.load(text, Loader=_LOADER) if not _has_alias(text) else safeyaml.load(text)
    if not isinstance(data, dict):
        raise ProfileError(f"{path}: top level must be a mapping")
    bad = not_finite(data)
    if bad:
        raise ProfileError(f"{path}: {bad}: not a finite number")
    if _validated().get(name) != hashlib.sha256(raw).hexdigest():
        validate(data, f"checks/profiles/{name}.yaml")
    return data


@functools.cache
def _validated() -> dict[str, str]:
    """name -> SHA-256 of the shipped profile texts the tests validated; {} without the table."""
    try:
        found = json.loads(Path(str(DIGESTS)).read_text()).get("sha256")
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _matches(profile: Profile, device_ids: Iterable[int], names: Iterable[str]) -> str | None:
    match = profile.get("match") or {}
    ids = {int(i) for i in match.get("pci_device_ids", [])}
    for dev in device_ids:
        if dev in ids:
            return f"PCI device 0x{dev:04x}"
    for pattern in match.get("names", []):
        for name in names:
            if re.search(pattern, name, re.IGNORECASE):
                return f"model name {name!r}"
    return None


def detect(device_ids: list[int], names: list[str]) -> Profile:
    """The model profile matching these GPUs; generic (with the unknown models listed) if none."""
    candidates = [load(n) for n in available() if n != GENERIC]
    for profile in candidates:
        why = _matches(profile, device_ids, names)
        if why:
            profile.reason = f"detected from {why}"
            return profile
    generic = load(GENERIC)
    if device_ids or names:
        generic.unknown_models = sorted({*(f"0x{d:04x}" for d in device_ids), *names})
        generic.reason = f"no model profile matches {', '.join(generic.unknown_models)}"
    else:
        generic.reason = "no NVIDIA GPU found"
    return generic
