"""Fleet JUnit XML: render/junit.py's suites (one per host report), plus what only the fleet
knows: a failing `straggler` test case in the host's suite, and a suite with an erroring `report`
test case for each host whose report is missing or unreadable."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from checks.fleet.aggregate import Fleet
from checks.render import junit


def _bump(suite: ET.Element, attr: str) -> None:
    suite.set(attr, str(int(suite.get(attr, "0")) + 1))


def to_xml(fleet: Fleet) -> ET.Element:
    root = junit.to_xml(fleet.reports)
    suites = {s.get("name"): s for s in root.iter("testsuite")}
    for s in fleet.stragglers:
        suite = suites[s.host]
        where = s.gpu.label() if s.gpu else "host"
        case = ET.SubElement(suite, "testcase", classname=f"{s.host}.fleet",
                             name=f"straggler {s.check}/{s.name} {where}", time="0")
        message = (f"{s.name} {s.value:g} is {s.deficit_pct:.1f} % from the fleet median "
                   f"{s.median:g} (limit {s.threshold_pct:g} %)")
        if s.status == "FAIL":
            ET.SubElement(case, "failure", message=message, type="straggler").text = message
            _bump(suite, "failures")
        else:
            ET.SubElement(ET.SubElement(case, "properties"), "property", name="status", value="WARN")
            ET.SubElement(case, "system-out").text = message
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
