"""Fleet JUnit XML: render/junit.py's suites (one per host report), plus what only the fleet
knows: a test case per finding (straggler, drift, digest, lemon) in the host's suite, failing
for a FAIL finding, and a suite with an erroring `report`
test case for each host whose report is missing or unreadable.

In the order an operator acts (checks.report.act_on): the suites of the hosts to act on first,
and in each suite the root-cause test cases first, then the checks not measured because of one
of them (each names its cause: property `caused_by`, and its message says so), then the rest."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from checks.render import junit
from checks.report import act_on
from checks.report.aggregate import Fleet


def _bump(suite: ET.Element, attr: str) -> None:
    suite.set(attr, str(int(suite.get(attr, "0")) + 1))


def to_xml(fleet: Fleet) -> ET.Element:
    root = junit.to_xml(fleet.reports)
    suites = {s.get("name"): s for s in root.iter("testsuite")}
    for h in fleet.hosts:
        for f in h.findings if h.host in suites else ():
            suite = suites[h.host]
            where = f.gpu.label() if f.gpu else "host"
            what = f"{f.check}/{f.figure}" if f.figure else f.check
            case = ET.SubElement(suite, "testcase", classname=f"{h.host}.fleet",
                                 name=f"{f.kind} {what} {where}", time="0")
            if f.status == "FAIL":
                ET.SubElement(case, "failure", message=f.reason, type=f.kind).text = f.reason
                _bump(suite, "failures")
            else:
                ET.SubElement(ET.SubElement(case, "properties"), "property", name="status", value="WARN")
                ET.SubElement(case, "system-out").text = f.reason
            _bump(suite, "tests")
    for h in fleet.hosts:
        if h.report is None:
            suite = ET.SubElement(root, "testsuite", name=h.host, tests="1", failures="0",
                                  errors="1", skipped="0", time="0")
            case = ET.SubElement(suite, "testcase", classname=f"{h.host}.fleet", name="report", time="0")
            ET.SubElement(case, "error", message=h.reason or h.status, type=h.status).text = h.reason
    _order(root, fleet)
    return root


def _order(root: ET.Element, fleet: Fleet) -> None:
    found = act_on.rows(fleet.hosts)
    folded = act_on.folded_checks(found)
    host_rank: dict[str, int] = {}
    for i, row in enumerate(found):
        host_rank.setdefault(row.host, i)
    suites = list(root)
    by_host: dict[str, list[act_on.Row]] = {}
    for row in found:
        by_host.setdefault(row.host, []).append(row)
    for suite in suites:
        if suite.get("name") in by_host:  # a host with nothing to act on keeps its order
            _order_cases(suite, by_host[suite.get("name") or ""], folded)
    root[:] = sorted(suites, key=lambda s: host_rank.get(s.get("name") or "", len(found)))


def _order_cases(suite: ET.Element, found: list[act_on.Row], folded: dict[tuple[str, str], str]) -> None:
    host = suite.get("name") or ""
    rank: dict[str, int] = {}
    for i, row in enumerate(found):
        for check in (row.check, *row.also) if row.kind == "check" else ():
            rank.setdefault(check, i)
        for check in row.dependents:
            rank.setdefault(check, len(found) + i)

    def key(case: ET.Element) -> int:
        name = case.get("name") or ""
        if (case.get("classname") or "").endswith(".fleet"):  # a finding: its kind's first row
            return next((i for i, r in enumerate(found) if name.startswith(f"{r.kind} ")), 2 * len(found))
        return rank.get(name, 2 * len(found))

    dependents = {r.check: r.dependents for r in found if r.kind == "check" and r.dependents}
    cases = sorted(suite, key=key)  # stable: the report's order within a rank
    for case in cases:
        name = case.get("name") or ""
        if name in dependents:
            _property(case, "not_measured_because_of_it", ",".join(dependents[name]))
        cause = folded.get((host, name))
        if cause is None:
            continue
        _property(case, "caused_by", cause)
        for bad in (case.find("error"), case.find("failure")):
            if bad is not None:
                bad.set("message", f"not measured because {cause} failed: {bad.get('message', '')}")
    suite[:] = cases


def _property(case: ET.Element, name: str, value: str) -> None:
    props = case.find("properties")
    if props is None:
        props = ET.SubElement(case, "properties")
    ET.SubElement(props, "property", name=name, value=value)


def write(fleet: Fleet, path: str | Path) -> Path:
    return junit.write_tree(to_xml(fleet), path)
