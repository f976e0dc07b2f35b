"""Shared by test_field_corpus and test_node_types: run a scenario through `checks.node.node_cli.main` and
compare the JSON report with an expected verdict (status per check id, device per fault)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema

from checks.node import node_cli as cli
from checks.report_schema import schema

OK = frozenset({"PASS", "SKIP"})


@dataclass(frozen=True)
class Case:
    """Expected verdict: `expect` maps check id -> status (or set of acceptable statuses);
    `devices` maps check id -> {PCI address: status(es)} that must appear, and no other device
    of that check may be other than PASS/SKIP; `free` checks are not asserted."""

    scenario: str
    expect: dict[str, str | frozenset[str]] = field(default_factory=dict)
    devices: dict[str, dict[str, str | frozenset[str]]] = field(default_factory=dict)
    free: frozenset[str] = frozenset()
    args: tuple[str, ...] = ()

    @property
    def id(self) -> str:
        return " ".join((self.scenario, *self.args))


def _allowed(want: str | frozenset[str]) -> frozenset[str]:
    return frozenset({want}) if isinstance(want, str) else want


def run(scenario: str, tmp_path: Path, *args: str) -> tuple[int, dict[str, Any]]:
    out = tmp_path / f"{Path(scenario).stem}.json"
    code = cli.main(["--simulate", scenario, "--level", "quick", *args, "--json", str(out), "-q"])
    return code, json.loads(out.read_text())


def by_pci(check: dict[str, Any]) -> dict[str | None, list[str]]:
    found: dict[str | None, list[str]] = {}
    for result in check["results"]:
        found.setdefault((result.get("device") or {}).get("pci"), []).append(result["status"])
    return found


def verdict_problems(report: dict[str, Any], case: Case) -> list[str]:
    """Every way the report differs from the expected verdict, one line each."""
    checks = {c["id"]: c for c in report["checks"]}
    problems = []
    for check_id in sorted(set(case.expect) - set(checks)):
        problems.append(f"{check_id}: not in the report")
    for check_id, chk in checks.items():
        if check_id in case.free:
            continue
        allowed = _allowed(case.expect.get(check_id, OK))
        if chk["status"] not in allowed:
            first = next((r["message"] for r in chk["results"] if r["status"] == chk["status"]), "")
            problems.append(f"{check_id}: {chk['status']} ({first}), expected "
                            f"{'/'.join(sorted(allowed))}")
    for check_id, wanted in case.devices.items():
        if check_id not in checks:
            continue
        found = by_pci(checks[check_id])
        for pci, want in wanted.items():
            if not set(found.get(pci, [])) & _allowed(want):
                problems.append(f"{check_id}: no {'/'.join(sorted(_allowed(want)))} result "
                                f"naming {pci} (got {found.get(pci, 'none')})")
        others = sorted(str(p) for p, sts in found.items()
                        if p not in wanted and set(sts) - OK)
        if others:
            problems.append(f"{check_id}: also flags {', '.join(others)}")
    return problems


def assert_report_consistent(code: int, report: dict[str, Any]) -> None:
    jsonschema.validate(report, schema())
    statuses = {c["status"] for c in report["checks"]}
    assert code == (1 if statuses & {"FAIL", "ERROR"} else 0)
    for chk in report["checks"]:
        for result in chk["results"]:
            if result["status"] in ("FAIL", "WARN"):
                assert result["remedy"], f"{chk['id']} {result['status']} gives no remedy"


def W(*statuses: str) -> frozenset[str]:
    return frozenset(statuses)
