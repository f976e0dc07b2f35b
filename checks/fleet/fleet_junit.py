"""Fleet JUnit XML: render/junit.py's suites (one per host report), plus what only the fleet
knows: a test case per finding (straggler, drift, digest, lemon) in the host's suite, failing
for a FAIL finding, and a suite with an erroring `report`
test case for each host whose report is missing or unreadable."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from checks.render import junit
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
    return root


def write(fleet: Fleet, path: str | Path) -> Path:
    return junit.write_tree(to_xml(fleet), path)
