"""Fleet JUnit XML: render/junit.py's suites (one per host report), plus what only the fleet
knows: a test case per finding (straggler, drift, digest, lemon) in the host's suite, failing
for a FAIL finding, and a suite with an erroring `report`
test case for each host whose report is missing or unreadable.

In the order an operator acts (checks.report.act_on): the suites of the hosts to act on first,
and in each suite the root-cause test cases first, then the checks not measured because of one
of them (each names its cause: property `caused_by`, and its message says so), then the rest."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from checks import safeio
from checks.render import junit
from checks.report import act_on
from checks.report.aggregate import Fleet
from checks.report.findings import HostEntry


def _bump(suite: ET.Element, attr: str) -> None:
    suite.set(attr, str(int(suite.get(attr, "0")) + 1))


def _findings(suite: ET.Element, h: HostEntry) -> None:
    for f in h.findings:
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


def _suite(h: HostEntry) -> ET.Element:
    if h.report is None:
        suite = ET.Element("testsuite", name=h.host, tests="1", failures="0", errors="1", skipped="0",
                           time="0")
        case = ET.SubElement(suite, "testcase", classname=f"{h.host}.fleet", name="report", time="0")
        ET.SubElement(case, "error", message=h.reason or h.status, type=h.status).text = h.reason
        return suite
    suite = junit.to_xml([dict(h.report)])[0]  # dict(): a packed summary's checks unpacked once
    _findings(suite, h)
    return suite


# one host's suite to write: its entry, its rows to act on, (host, check) -> the cause it is folded under
SuiteJob = tuple[HostEntry, list[act_on.Row], dict[tuple[str, str], str]]
Mapper = Callable[[Callable[[SuiteJob], bytes], list[SuiteJob]], Iterable[bytes]]


def _jobs(fleet: Fleet) -> list[SuiteJob]:
    """The hosts' suites to build, in the order an operator acts: the hosts to act on first
    (act_on's order), then the others in the fleet's order, the hosts without a report after
    those with one."""
    found = act_on.rows(fleet.hosts)
    folded: dict[str, dict[tuple[str, str], str]] = {}
    for key, cause in act_on.folded_checks(found).items():
        folded.setdefault(key[0], {})[key] = cause
    host_rank: dict[str, int] = {}
    by_host: dict[str, list[act_on.Row]] = {}
    for i, row in enumerate(found):
        host_rank.setdefault(row.host, i)
        by_host.setdefault(row.host, []).append(row)
    hosts = [h for h in fleet.hosts if h.report is not None] + [h for h in fleet.hosts if h.report is None]
    return [(h, by_host.get(h.host, []), folded.get(h.host, {}))
            for h in sorted(hosts, key=lambda h: host_rank.get(h.host, len(found)))]


def _ordered_suite(job: SuiteJob) -> ET.Element:
    h, rows, folded = job
    suite = _suite(h)
    if rows:  # a host with nothing to act on keeps its order
        _order_cases(suite, rows, folded)
    return suite


def suites(fleet: Fleet) -> Iterator[ET.Element]:
    """The fleet's test suites, one host at a time (_jobs' order)."""
    return map(_ordered_suite, _jobs(fleet))


def to_xml(fleet: Fleet) -> ET.Element:
    root = ET.Element("testsuites", name="nodecert")
    root.extend(suites(fleet))
    return root


def suite_text(job: SuiteJob) -> bytes:
    """One host's suite as junit.write_tree writes it within the file (sanitised, indented).
    Module-level, so that a process pool can run it (chunks' `map_`)."""
    suite = _ordered_suite(job)
    junit.sanitise(suite)
    ET.indent(suite, space="  ", level=1)
    return ET.tostring(suite, encoding="unicode").encode("utf-8")


def chunks(fleet: Fleet, map_: Mapper | None = None) -> Iterator[bytes]:
    """The JUnit file as junit.write_tree writes to_xml's tree, one suite at a time: the fleet's
    XML is never built whole (10 000 hosts' suites hold every result's message). `map_` (the
    builtin map by default) may build the suites in other processes, in order."""
    yield b"<?xml version='1.0' encoding='utf-8'?>\n"
    before = b'<testsuites name="nodecert">\n  '
    for text in (map_ or map)(suite_text, _jobs(fleet)):
        yield before + text
        before = b"\n  "
    yield b'<testsuites name="nodecert" />' if before.startswith(b"<") else b"\n</testsuites>"


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


def write(fleet: Fleet, path: str | Path, map_: Mapper | None = None) -> Path:
    return safeio.write_bytes(path, chunks(fleet, map_))
