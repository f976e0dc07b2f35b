"""The provisioning side's GPU-model tables, generated from checks/profiles/*.yaml: a GPU model is
one profile, and the preflight role (playbooks/roles/preflight/vars/main.yml) learns it from
here instead of from a second, hand-kept copy.

Generated, between `# NAME:begin` / `# NAME:end` comment lines of the vars file:

- `profile-models`: the `_preflight_gpu_models` rows, one per PCI device ID of every profile,
  named as NVML names the model (the profile's `match.names`, "NVIDIA " dropped);
- `profile-platforms`: the `_preflight_platforms` rules of the profiles with a `blackwell`
  section (their device IDs, `min_gpus` for an HGX board, the fabric they need).

Checked, not generated (the table also covers GPUs no profile describes): every profile's device
IDs fall in one `_preflight_gpu_architectures` range, of the architecture its
`compute_capability` names, and that range's kernel-module flavour is `open_required` exactly
when the profile says `blackwell.open_module_required`.

    python -m checks.docgen.preflight_models            # print the generated rows
    python -m checks.docgen.preflight_models --write    # refresh the vars file in place
    python -m checks.docgen.preflight_models --check    # exit 1 when it is out of date or disagrees
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from checks import profiles

ROOT = Path(__file__).resolve().parents[2]
VARS = ROOT / "playbooks" / "roles" / "preflight" / "vars" / "main.yml"
PROG = "checks.docgen.preflight_models"
COMMAND = f"python -m {PROG} --write"
SOURCE = "checks/profiles/*.yaml"

# Architecture of each compute capability a profile may name, as the range names of
# _preflight_gpu_architectures spell it. Source: NVIDIA's "CUDA GPU Compute Capability" table
# (developer.nvidia.com/cuda-gpus) and the CUDA C++ Programming Guide, "Compute Capabilities".
# Grace Hopper's GPU is compute capability 9.0 too.
ARCHITECTURES: dict[str, frozenset[str]] = {
    "6.0": frozenset({"Pascal"}),
    "6.1": frozenset({"Pascal"}),
    "7.0": frozenset({"Volta"}),
    "7.5": frozenset({"Turing"}),
    "8.0": frozenset({"Ampere"}),
    "8.6": frozenset({"Ampere"}),
    "8.9": frozenset({"Ada Lovelace"}),
    "9.0": frozenset({"Hopper", "Grace Hopper"}),
    "10.0": frozenset({"Blackwell"}),
    "10.3": frozenset({"Blackwell"}),
    "12.0": frozenset({"Blackwell"}),
}


class ModelError(Exception):
    """A profile the tables cannot be made from, or a vars file without its markers."""


def model_profiles() -> list[profiles.Profile]:
    """Every profile that names a GPU model (generic names none)."""
    out = [profiles.load(name) for name in profiles.available()]
    return [p for p in out if p.get("match.pci_device_ids")]


def device_ids(profile: profiles.Profile) -> list[str]:
    return [f"{int(i):04x}" for i in profile.get("match.pci_device_ids") or []]


def _literal(pattern: str, where: str) -> str:
    """`^NVIDIA H100 80GB HBM3$` -> `H100 80GB HBM3`; a pattern that is not a plain name is an error."""
    text = pattern.removeprefix("^").removesuffix("$")
    if re.search(r"[\\.^$*+?{}\[\]|()]", text):
        raise ModelError(f"{where}: match.names {pattern!r} is not a plain anchored name")
    return re.sub(r"^NVIDIA ", "", text)


def model_names(profile: profiles.Profile) -> dict[str, str]:
    """{device id: name}: the i-th name for the i-th ID when the counts agree, else the first name."""
    ids = device_ids(profile)
    where = f"checks/profiles/{profile.name}.yaml"
    names = [_literal(p, where) for p in profile.get("match.names") or []]
    if not names:
        raise ModelError(f"{where}: match.names is empty (the model's name as NVML prints it)")
    return {dev: names[i] if len(names) == len(ids) else names[0] for i, dev in enumerate(ids)}


def _scalar(text: str) -> str:
    """A YAML scalar that reads back as `text`."""
    return text if yaml.safe_load(f"k: {text}") == {"k": text} else json.dumps(text)


def models_rows() -> str:
    rows: dict[str, tuple[str, str]] = {}
    for profile in model_profiles():
        for dev, name in model_names(profile).items():
            if dev in rows:
                raise ModelError(f"PCI device {dev} is in two profiles: {rows[dev][0]} and {profile.name}")
            rows[dev] = (profile.name, name)
    return "\n".join(f'  "{dev}": {_scalar(name)}' for dev, (_, name) in sorted(rows.items()))


# The values of a profile's `blackwell.platform` and what the preflight role is told for each:
# hgx and nvl72 get a rule of their own (below); pcie (a PCIe Blackwell card: no NVSwitch, no
# NVLink domain, no fixed GPU count) gets none, because the catch-all `pcie` rule at the end of
# _preflight_platforms (nvswitch: false, fabric: none) already says what such a node needs.
PLATFORM_KINDS = ("hgx", "nvl72", "pcie")


def platform_rule(profile: profiles.Profile) -> dict[str, Any] | None:
    """The preflight platform rule of a profile with a `blackwell` section, else None (no
    section, or a PCIe card: see PLATFORM_KINDS)."""
    kind = profile.get("blackwell.platform")
    where = f"checks/profiles/{profile.name}.yaml"
    if kind is None:
        return None
    if kind not in PLATFORM_KINDS:
        raise ModelError(f"{where}: blackwell.platform {kind!r} is none of {', '.join(PLATFORM_KINDS)}")
    if kind == "pcie":
        if profile.get("gpus_per_node") is not None:
            raise ModelError(f"{where}: a pcie platform has no fixed GPU count (drop gpus_per_node)")
        return None
    if kind == "nvl72" and profile.get("blackwell.nvl72.imex_unit"):
        return {"name": f"{profile.name}-tray", "device_ids": device_ids(profile), "fabric": "imex"}
    if kind == "hgx" and profile.get("blackwell.fabric.unit"):
        # Fabric Manager with NVLSM (fourth-generation NVSwitches) is the nvlink5 stack; Fabric
        # Manager alone the nvswitch one.
        fabric = "nvlink5" if profile.get("blackwell.fabric.nvlsm_unit") else "nvswitch"
        gpus = profile.get("gpus_per_node")
        if not isinstance(gpus, int):
            raise ModelError(f"{where}: an hgx platform needs gpus_per_node (a full board)")
        return {"name": f"hgx-{profile.name}", "device_ids": device_ids(profile), "min_gpus": gpus,
                "fabric": fabric}
    raise ModelError(f"{where}: blackwell.platform {kind!r} without the fabric it needs "
                     "(hgx: blackwell.fabric.unit; nvl72: blackwell.nvl72.imex_unit)")


def platforms_rows() -> str:
    rules = [r for r in map(platform_rule, model_profiles()) if r]
    lines = []
    for rule in sorted(rules, key=lambda r: r["name"]):
        ids = ", ".join(f'"{dev}"' for dev in rule["device_ids"])
        extra = f", min_gpus: {rule['min_gpus']}" if "min_gpus" in rule else ""
        lines.append(f"  - {{name: {rule['name']}, device_ids: [{ids}]{extra}, fabric: {rule['fabric']}}}")
    return "\n".join(lines)


REGIONS: dict[str, Callable[[], str]] = {"profile-models": models_rows, "profile-platforms": platforms_rows}


def embed(text: str, name: str, rows: str) -> str:
    """`text` with the lines between `  # NAME:begin` and `  # NAME:end` replaced by `rows`."""
    begin = re.search(rf"^(?P<indent> *)# {re.escape(name)}:begin\n", text, re.MULTILINE)
    end = re.search(rf"^ *# {re.escape(name)}:end$", text, re.MULTILINE)
    if not begin or not end or end.start() < begin.end():
        raise ModelError(f"{VARS.relative_to(ROOT)}: markers '# {name}:begin' / '# {name}:end' missing")
    note = f"{begin['indent']}# generated by {COMMAND}; edit {SOURCE}\n"
    return text[:begin.end()] + note + rows + "\n" + text[end.start():]


def render(text: str) -> str:
    for name, rows in REGIONS.items():
        text = embed(text, name, rows())
    return text


def _range_of(dev: str, ranges: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in ranges if int(r["first"], 16) <= int(dev, 16) <= int(r["last"], 16)]


def disagreements(tables: dict[str, Any]) -> list[str]:
    """Where the vars file's architecture table contradicts a profile: one line each."""
    ranges = tables.get("_preflight_gpu_architectures") or []
    out = []
    for profile in model_profiles():
        where = f"checks/profiles/{profile.name}.yaml"
        capability = str(profile.get("compute_capability"))
        arch = ARCHITECTURES.get(capability)
        if arch is None:
            out.append(f"{where}: compute_capability {capability} has no architecture in {PROG}")
            continue
        open_required = profile.get("blackwell.open_module_required") is True
        for dev in device_ids(profile):
            found = _range_of(dev, ranges)
            if len(found) != 1:
                out.append(f"{where}: PCI device {dev} is in {len(found)} _preflight_gpu_architectures "
                           "ranges (needs exactly one)")
                continue
            if found[0]["name"] not in arch:
                out.append(f"{where}: PCI device {dev} falls in the {found[0]['name']} range, but compute "
                           f"capability {capability} is {'/'.join(sorted(arch))}")
            if (found[0]["kernel_modules"] == "open_required") != open_required:
                out.append(f"{where}: PCI device {dev}: the range says kernel_modules "
                           f"{found[0]['kernel_modules']}, the profile blackwell.open_module_required "
                           f"{profile.get('blackwell.open_module_required')}")
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args not in ([], ["--write"], ["--check"]):
        print(f"usage: python -m {PROG} [--write | --check] (got {' '.join(args)})", file=sys.stderr)
        return 2
    try:
        if not args:
            print("\n\n".join(f"# {name}\n{rows()}" for name, rows in REGIONS.items()))
            return 0
        current = VARS.read_text()
        fresh = render(current)
        problems = disagreements(yaml.safe_load(fresh))
    except (ModelError, profiles.ProfileError, OSError, yaml.YAMLError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    rel = VARS.relative_to(ROOT)
    if args == ["--write"] and fresh != current:
        VARS.write_text(fresh)
        print(f"wrote {rel}")
    elif args == ["--check"] and fresh != current:
        problems.insert(0, f"{rel} is out of date; run: {COMMAND}")
    for line in problems:
        print(f"error: {line}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
