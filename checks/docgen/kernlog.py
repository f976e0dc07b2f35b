"""docs/kernel-log.md's XID, driver-status, SXid and AER tables and the corpus count, generated from
the data in checks/kernlog/ (the policy every kernel-log check reads) so the doc cannot drift from
it.

    python -m checks.docgen.kernlog            # print the generated sections
    python -m checks.docgen.kernlog --write    # refresh docs/kernel-log.md in place
    python -m checks.docgen.kernlog --check    # exit 1 when docs/kernel-log.md is out of date
"""

from __future__ import annotations

import sys
from collections import Counter
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from checks.docgen.regions import replace_between
from checks.kernlog import aer_policy, nvstatus_policy, sxid_policy, xid_policy

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "kernel-log.md"
GENERATOR = "python -m checks.docgen.kernlog --write"
# The kernel wordings the corpus can hold (see checks/kernlog/corpus.yaml), oldest first.
GENERATIONS = ("4.x (before 4.19)", "4.19-5.x", "6.0-6.7", "6.8+", "7.x", "any")


def corpus() -> dict[str, Any]:
    text = (resources.files("checks") / "kernlog" / "corpus.yaml").read_text(encoding="utf-8")
    data = yaml.safe_load(text)
    if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
        raise ValueError("checks/kernlog/corpus.yaml: needs a list under 'entries'")
    return data


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def xid_table() -> str:
    policy = xid_policy()
    rows = ["| XID | name | catalog action | verdict | why (when not the rule) |",
            "|---|---|---|---|---|"]
    for row in sorted(policy.rows.values(), key=lambda r: r.xid):
        why = row.reason or ("" if row.source == "catalog" else row.source)
        rows.append(f"| {row.xid} | `{row.name}` | {row.action or '-'} | {row.verdict} "
                    f"| {_cell(why)} |")
    rule = ", ".join(f"{action} → {verdict}" for action, verdict in policy.rule.items())
    return (f"Rule (catalog immediate action → verdict): {rule}. A WARN XID whose line carries "
            f"{' or '.join(f'`{t}`' for t in policy.driver_reset_request)} fails.\n\n"
            + "\n".join(rows))


def sxid_table() -> str:
    policy = sxid_policy()
    rows = ["| SXid | name | guide section | verdict | why |", "|---|---|---|---|---|"]
    for row in sorted(policy.rows.values(), key=lambda r: r.sxid):
        rows.append(f"| {row.sxid} | {_cell(row.name)} | {row.section.replace('_', ' ')} "
                    f"| {row.verdict} | {_cell(row.reason)} |")
    return "\n".join(rows)


def aer_table() -> str:
    policy = aer_policy()
    rows = ["| kind | kernels before 6.8 print | 6.8 and later print |", "|---|---|---|"]
    for sev in policy.severities:
        rows.append(f"| {sev['kind']} | `{sev['before_6_8']}` | `{sev['since_6_8']}` |")
    roles = ["", "| uncorrected (fatal or non-fatal) on | verdict |", "|---|---|"]
    names = {"gpu": "a GPU", "nvswitch": "an NVSwitch",
             "upstream": "a bridge or root port above a GPU or NVSwitch", "other": "another device"}
    for role, verdict in policy.uncorrected.items():
        roles.append(f"| {names[role]} | {verdict} |")
    return "\n".join(rows + roles)


def nvstatus_table() -> str:
    """The remedy kinds, then every status that carries one (the other rows are not judged)."""
    policy = nvstatus_policy()
    kinds = ["| remedy | verdict | what the line says | what to do |", "|---|---|---|---|"]
    for name, kind in policy.remedies.items():
        if name != "none":
            kinds.append(f"| {name} | {kind.verdict} | {_cell(kind.meaning)} | {_cell(kind.text)} |")
    rows = ["| status | code | remedy | why |", "|---|---|---|---|"]
    for row in sorted(policy.rows.values(), key=lambda r: r.code):
        if row.remedy != "none":
            rows.append(f"| `{row.name}` | 0x{row.code:08X} | {row.remedy} | {_cell(row.why)} |")
    quiet = sum(1 for r in policy.rows.values() if r.remedy == "none")
    return ("\n".join(kinds) + "\n\n" + "\n".join(rows)
            + f"\n\nThe other {quiet} statuses of the table are not judged (`remedy: none`).")


def corpus_table() -> str:
    entries = corpus()["entries"]
    lines = Counter[str]()
    reports = Counter[str]()
    for entry in entries:
        lines[entry["generation"]] += len(entry["lines"])
        reports[entry["generation"]] += 1
    rows = ["| kernel wording | entries | lines |", "|---|---|---|"]
    for generation in GENERATIONS:
        rows.append(f"| {generation} | {reports[generation]} | {lines[generation]} |")
    rows.append(f"| total | {sum(reports.values())} | {sum(lines.values())} |")
    return "\n".join(rows)


SECTIONS = {"xid": xid_table, "nvstatus": nvstatus_table, "sxid": sxid_table, "aer": aer_table,
            "corpus": corpus_table}


def render(text: str) -> str:
    for name, table in SECTIONS.items():
        text = replace_between(text, f"kernlog-{name}", table(),
                               f"generated by {GENERATOR}; edit checks/kernlog/", DOC.name)
    return text


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args not in ([], ["--write"], ["--check"]):
        print(f"usage: python -m checks.docgen.kernlog [--write | --check] (got {' '.join(args)})",
              file=sys.stderr)
        return 2
    current = DOC.read_text()
    fresh = render(current)
    if args == ["--write"]:
        DOC.write_text(fresh)
        print(f"wrote {DOC.relative_to(ROOT)}")
    elif args == ["--check"]:
        if fresh != current:
            print(f"{DOC.relative_to(ROOT)} is out of date: run {GENERATOR}", file=sys.stderr)
            return 1
    else:
        print("\n\n".join(table() for table in SECTIONS.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
