"""The check tables of docs/checks.md and docs/scenarios.md that say where things are, derived
from the registry and from real runs of the shipped scenarios (checks/docgen/derive.py):

- docs/checks.md `check-sources`: every check, the module that defines it (a link) and the
  shipped scenarios that show it failing;
- docs/checks.md `peer-checks`: the checks that only `peer-*` scenarios (the node checks
  operators' suites run) make fail or warn, with what each reads (the GPU fields its `nvml=`
  declares, the hardware-layer calls in its source) and the profile keys it is judged by;
- docs/scenarios.md `fault-scenarios`: the `fault-*` scenarios (and the healthy bases and
  `unknown-gpu-model`) with every check a burn-in level run of them does not pass.

    python -m checks.docgen.check_index            # print the tables
    python -m checks.docgen.check_index --write    # refresh both documents in place
    python -m checks.docgen.check_index --check    # exit 1 when one is out of date
"""

from __future__ import annotations

import json
import sys

from checks.docgen import derive
from checks.docgen.regions import ROOT, Region
from checks.docgen.regions import main as regions_main
from checks.hw.base import GPU_FIELDS

PROG = "checks.docgen.check_index"
CHECKS_DOC = ROOT / "docs" / "checks.md"
SCENARIOS_DOC = ROOT / "docs" / "scenarios.md"
SHOWN = 3  # scenarios named per check; the rest are counted
FAULT_TABLE_EXTRA = ("h100-sxm-8x-healthy", "cpu-only-healthy", "unknown-gpu-model")


def _names(names: list[str], limit: int = SHOWN) -> str:
    shown = ", ".join(f"`{n}`" for n in names[:limit])
    return f"{shown} (+{len(names) - limit} more)" if len(names) > limit else shown


def sources_table() -> str:
    rows = ["| check | code | defined in | shipped scenarios that show it failing |",
            "|---|---|---|---|"]
    for chk in derive.checks():
        func = chk.func.__name__
        shown = derive.scenarios_showing(chk.id)
        rows.append(f"| `{chk.id}` | {chk.code} | {derive.source_link(chk, CHECKS_DOC)} `{func}` "
                    f"| {_names(shown) or 'none yet'} |")
    return "\n".join(rows)


def peer_checks() -> list[str]:
    """Check ids that `peer-*` scenarios, and no other shipped scenario, make fail or warn."""
    by_check: dict[str, set[bool]] = {}
    for name, verdict in derive.scenario_verdicts().items():
        for check_id in verdict:
            by_check.setdefault(check_id, set()).add(name.startswith("peer-"))
    return [c.id for c in derive.checks() if by_check.get(c.id) == {True}]


def peer_table() -> str:
    rows = ["| check | code | level | defined in | reads (GPU fields; hardware layer) "
            "| judged by (profile keys) | `peer-*` scenarios |", "|---|---|---|---|---|---|---|"]
    checks = {c.id: c for c in derive.checks()}
    for check_id in peer_checks():
        chk = checks[check_id]
        reads = [f"`{f}`" for f in GPU_FIELDS if f in chk.nvml]  # as declared, in field order
        reads += [f"`hw.{m}()`" for m in derive.hw_methods(chk)]
        keys = ", ".join(f"`{k}`" for k in derive.profile_keys_read(chk)) or "-"
        peers = [n for n in derive.scenarios_showing(check_id) if n.startswith("peer-")]
        rows.append(f"| `{check_id}` | {chk.code} | {chk.level} | {derive.source_link(chk, CHECKS_DOC)} "
                    f"| {', '.join(reads) or '-'} | {keys} | {_names(peers, 9)} |")
    return "\n".join(rows)


def _what(description: str) -> str:
    """A scenario description's first clause: up to the first ', ' / ': ' / '; ' outside
    parentheses, or its first sentence."""
    text = " ".join(description.split())
    depth = 0
    for i, ch in enumerate(text):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0 and text[i:i + 2] in (", ", ": ", "; ", ". "):
            return text[:i].replace("|", "/")
    return text.rstrip(".").replace("|", "/")


def fault_table() -> str:
    from checks.hw.fixture import load_scenario

    verdicts = derive.scenario_verdicts()
    names = [*(n for n in FAULT_TABLE_EXTRA if n in verdicts),
             *sorted(n for n in verdicts if n.startswith("fault-"))]
    rows = ["| scenario | what it is (its description, first clause) | caught by (not PASS or SKIP) |",
            "|---|---|---|"]
    for name in names:
        verdict = verdicts[name]
        caught = ", ".join(f"`{c}` {s}" for c, s in sorted(
            verdict.items(), key=lambda cs: (derive.RANK[cs[1]], cs[0])))
        what = _what(str(load_scenario(name).get("description", "")))
        rows.append(f"| `{name}` | {what} | {caught or 'nothing'} |")
    return "\n".join(rows)


def _value(value: object) -> str:
    text = json.dumps(value, separators=(", ", ": "))
    return "(see generic.yaml)" if len(text) > 40 else text.replace("|", "/")


def thresholds_table() -> str:
    """Per quick-level check, the profile keys its code names and their generic defaults."""
    from checks import profiles

    generic = profiles.load(profiles.GENERIC)
    rows = ["| check | profile keys it reads = generic default |", "|---|---|"]
    for chk in derive.checks():
        keys = derive.profile_keys_read(chk)
        if chk.level != "quick" or not keys:
            continue
        shown = ", ".join(f"`{k}` = {_value(generic.get(k))}" if generic.get(k) is not None
                          else f"`{k}` (model profiles only)" for k in keys)
        rows.append(f"| `{chk.id}` | {shown} |")
    return "\n".join(rows)


REGIONS = [
    Region(CHECKS_DOC, "check-sources", "the @check registrations (checks/node/suite/) and "
           "checks/scenarios/", sources_table),
    Region(CHECKS_DOC, "threshold-defaults", "checks/profiles/generic.yaml and the checks",
           thresholds_table),
    Region(CHECKS_DOC, "peer-checks", "the @check registrations and the peer-* scenarios", peer_table),
    Region(SCENARIOS_DOC, "fault-scenarios", "checks/scenarios/fault-*.yaml", fault_table),
]


def main(argv: list[str] | None = None) -> int:
    return regions_main(PROG, REGIONS, argv)


if __name__ == "__main__":
    sys.exit(main())
