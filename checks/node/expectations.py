"""What provisioning put on this node, as the defaults of `python -m checks`'s expectations.

The pytorch role writes /etc/nodecert/expect.yaml from the same variables that provisioned the
node (nvidia_driver_branch, cuda_toolkit_version, the GPUs preflight counted on the PCI bus and
their PCI IDs, which name the model), so
a run by hand, by Slurm's health check or by `make verify` expects what `make provision`
installed without anyone repeating it. Options on the command line win;
`--simulate` ignores the file (a scenario is not this node). NODECERT_EXPECTATIONS names another
file; an empty value turns the file off.

    # Managed by Ansible (nodecert pytorch role)
    gpus: 8
    gpu_ids: ["10de:2330"]
    driver: "580"
    cuda: "12.8"
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from checks import safeyaml

DEFAULT_PATH = Path("/etc/nodecert/expect.yaml")
ENV = "NODECERT_EXPECTATIONS"
MAX_BYTES = 64 << 10
DRIVER = re.compile(r"^\d{3}(\.\d+){0,2}$")
CUDA = re.compile(r"^\d{1,2}\.\d{1,2}$")
PCI_ID = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{4}$")
KEYS = ("gpus", "gpu_ids", "driver", "cuda")


class ExpectationsError(Exception):
    """The expectations file is unreadable or malformed (one line naming the file and key)."""


@dataclass(frozen=True)
class Expectations:
    gpus: int | None = None
    gpu_ids: tuple[str, ...] | None = None  # vendor:device of the GPUs, e.g. ("10de:2330",)
    driver: str | None = None
    cuda: str | None = None
    source: str | None = None  # the file they came from, for the report


def path() -> Path | None:
    value = os.environ.get(ENV)
    if value is None:
        return DEFAULT_PATH
    return Path(value) if value else None


def _field(data: dict[str, Any], key: str, where: str) -> Any:
    value = data.get(key)
    if value is None:
        return None
    if key == "gpus":
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 1024:
            raise ExpectationsError(f"{where}: gpus must be a whole number from 0 to 1024 (got {value!r})")
        return value
    if key == "gpu_ids":
        try:
            return gpu_ids(value)
        except ValueError as exc:
            raise ExpectationsError(f"{where}: {exc}") from None
    text = str(value)
    if not (DRIVER if key == "driver" else CUDA).match(text):
        example = '"580" or "580.95.05"' if key == "driver" else '"12.8"'
        raise ExpectationsError(f"{where}: {key} must look like {example} (got {text!r})")
    return text


def gpu_ids(value: Any) -> tuple[str, ...]:
    """PCI IDs as lspci -n prints them ("10de:2330"), lower case, sorted, each once, from a list
    or a comma-separated string; ValueError names what is wrong."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not items:
        raise ValueError(f"gpu_ids must be a list such as [\"10de:2330\"] (got {value!r})")
    ids = sorted({str(item).strip().lower() for item in items})
    bad = [i for i in ids if not PCI_ID.match(i)]
    if bad:
        raise ValueError(f"gpu_ids must look like \"10de:2330\" (got {bad[0]!r})")
    return tuple(ids)


def load(file: Path | None = None) -> Expectations:
    """The file's expectations; empty ones when there is no file."""
    file = file if file is not None else path()
    if file is None or not file.exists():
        return Expectations()
    where = str(file)
    try:
        if not file.is_file():
            raise ExpectationsError(f"{where}: not a regular file")
        raw = file.read_bytes()[: MAX_BYTES + 1]
        if len(raw) > MAX_BYTES:
            raise ExpectationsError(f"{where}: larger than {MAX_BYTES} bytes")
        data = safeyaml.load(raw.decode("utf-8")) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ExpectationsError(f"{where}: cannot read: {' '.join(str(exc).split())[:200]}") from None
    if not isinstance(data, dict):
        raise ExpectationsError(f"{where}: must be a mapping of {', '.join(KEYS)}")
    unknown = sorted(set(map(str, data)) - set(KEYS))
    if unknown:
        raise ExpectationsError(f"{where}: unknown key {', '.join(unknown)} (known: {', '.join(KEYS)})")
    return Expectations(**{key: _field(data, key, where) for key in KEYS}, source=where)
