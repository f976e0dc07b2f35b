"""The GPU-model lists of the docs, generated from checks/profiles/*.yaml (and, for the scenario
table, from the shipped scenarios), so a new profile shows up everywhere at once:

- README.md: one line naming every profile;
- docs/checks.md: every profile with its PCI device IDs, GPUs per node and NVSwitch;
- docs/blackwell.md: the Blackwell platforms (profiles with a `blackwell` section);
- docs/scenarios.md: which shipped scenarios select each profile.

    python -m checks.docgen.gpu_models            # print the tables
    python -m checks.docgen.gpu_models --write    # refresh the four documents in place
    python -m checks.docgen.gpu_models --check    # exit 1 when one is out of date
"""

from __future__ import annotations

import re
import sys
import textwrap
from collections.abc import Iterator

from checks import profiles
from checks.docgen.regions import ROOT, Region
from checks.docgen.regions import main as regions_main

PROG = "checks.docgen.gpu_models"
SOURCE = "checks/profiles/*.yaml"


def _models() -> Iterator[profiles.Profile]:
    """Every model profile, then generic (the fallback)."""
    names = profiles.available()
    for name in [n for n in names if n != profiles.GENERIC] + [profiles.GENERIC]:
        yield profiles.load(name)


def short_name(profile: profiles.Profile) -> str:
    """`NVIDIA H100 SXM5 80 GB (HGX, NVSwitch)` -> `H100 SXM5 80 GB`."""
    text = re.sub(r"\s*\(.*\)\s*$", "", profile.description).strip()
    return re.sub(r"^NVIDIA\s+", "", text)


def _ids(profile: profiles.Profile) -> str:
    ids = (profile.get("match") or {}).get("pci_device_ids") or []
    return ", ".join(f"`10de:{int(i):04x}`" for i in ids) or "-"


def readme_list() -> str:
    items = [f"`{p.name}` ({short_name(p)})" for p in _models()]
    return textwrap.fill(", ".join(items) + ".", width=100, break_on_hyphens=False)


def checks_table() -> str:
    rows = ["| profile | GPU (its `description`) | PCI IDs | GPUs per node | NVSwitch | compute capability |",
            "|---|---|---|---|---|---|"]
    for p in _models():
        nvswitch = {True: "yes", False: "no"}.get(p.get("nvswitch"), "-")
        rows.append(f"| `{p.name}` | {p.description} | {_ids(p)} | {p.get('gpus_per_node') or '-'} "
                    f"| {nvswitch} | {p.get('compute_capability') or '-'} |")
    return "\n".join(rows)


def _needs(p: profiles.Profile) -> str:
    needs = []
    if p.get("blackwell.open_module_required"):
        needs.append("open kernel module")
    if p.get("blackwell.fabric.unit"):
        needs.append(f"`{p.get('blackwell.fabric.unit')}` active")
    if p.get("blackwell.fabric.nvlsm_unit"):
        needs.append(f"NVLSM (`{p.get('blackwell.fabric.nvlsm_unit')}`)")
    for module in p.get("blackwell.fabric.modules") or []:
        needs.append(f"`{module}` loaded")
    if p.get("blackwell.nvl72.imex_unit"):
        needs.append(f"`{p.get('blackwell.nvl72.imex_unit')}` running with the domain's node list "
                     f"({p.get('blackwell.nvl72.trays_per_domain')} trays per domain)")
    return ", ".join(needs) or "-"


def blackwell_table() -> str:
    rows = ["| Platform (profile `description`) | Profile | PCI ID | GPUs/node | NVLink "
            "| Needs on the host |", "|---|---|---|---|---|---|"]
    for p in _models():
        if not p.get("blackwell.platform"):
            continue
        links, gbs = p.get("nvlink.links"), p.get("nvlink.link_gbs_per_direction")
        nvlink = f"{links} links" if links else "-"
        if links and gbs:
            nvlink += f" x {gbs} GB/s each way"
        rows.append(f"| {p.description} | `{p.name}` | {_ids(p)} | {p.get('gpus_per_node') or '-'} "
                    f"| {nvlink} | {_needs(p)} |")
    return "\n".join(rows)


def scenario_profiles() -> dict[str, list[str]]:
    """{profile: [shipped scenarios whose GPUs select it]}, detected as `python -m checks` does."""
    from checks.hw.fixture import FixtureBackend, shipped
    from checks.node.node_cli import choose_profile

    found: dict[str, list[str]] = {p.name: [] for p in _models()}
    for name in shipped():
        hw = FixtureBackend.from_file(name)
        if not any(d.is_nvidia_gpu for d in hw.pci_devices()):
            continue  # no GPU: generic by default, not a model's scenario
        found.setdefault(choose_profile(hw, None).name, []).append(name)
    return found


def scenarios_table() -> str:
    rows = ["| profile | shipped scenarios whose GPUs select it |", "|---|---|"]
    for profile, names in scenario_profiles().items():
        rows.append(f"| `{profile}` | {', '.join(f'`{n}`' for n in names) or 'none yet'} |")
    return "\n".join(rows)


REGIONS = [
    Region(ROOT / "README.md", "profiles", SOURCE, readme_list),
    Region(ROOT / "docs" / "checks.md", "profiles", SOURCE, checks_table),
    Region(ROOT / "docs" / "blackwell.md", "blackwell-profiles", SOURCE, blackwell_table),
    Region(ROOT / "docs" / "scenarios.md", "scenario-profiles", f"{SOURCE} and checks/scenarios/",
           scenarios_table),
]


def main(argv: list[str] | None = None) -> int:
    return regions_main(PROG, REGIONS, argv)


if __name__ == "__main__":
    sys.exit(main())
