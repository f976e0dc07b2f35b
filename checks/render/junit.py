"""JUnit XML: one testsuite per host, one testcase per check (CI systems read this)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any


def to_xml(reports: list[dict[str, Any]]) -> ET.Element:
    root = ET.Element("testsuites", name="nodecert")
    for report in reports:
        suite = ET.SubElement(root, "testsuite", name=report["host"],
                              tests=str(len(report["checks"])),
                              failures=str(report["summary"]["FAIL"]),
                              errors=str(report["summary"]["ERROR"]),
                              skipped=str(report["summary"]["SKIP"]),
                              time=f"{report['duration_s']:.3f}")
        for chk in report["checks"]:
            case = ET.SubElement(suite, "testcase", classname=f"{report['host']}.{chk['level']}",
                                 name=chk["id"], time=f"{chk['duration_s']:.3f}")
            bad = [r for r in chk["results"] if r["status"] != "PASS"]
            text = "\n".join(
                f"[{r['status']}] {r['message']}" + (f" (remedy: {r['remedy']})" if r.get("remedy") else "")
                for r in bad)
            status = chk["status"]
            if status == "SKIP":
                ET.SubElement(case, "skipped", message=chk["results"][0]["message"])
            elif status == "ERROR":
                ET.SubElement(case, "error", message=bad[0]["message"], type=chk["code"]).text = text
            elif status == "FAIL":
                ET.SubElement(case, "failure", message=bad[0]["message"], type=chk["code"]).text = text
            # WARN passes, as it does in the exit code; the property keeps it visible.
            props = ET.SubElement(case, "properties")
            ET.SubElement(props, "property", name="status", value=status)
            ET.SubElement(case, "system-out").text = "\n".join(
                f"[{r['status']}] {r['message']}" for r in chk["results"])
    return root


def write_tree(root: ET.Element, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tree = ET.ElementTree(root)
    ET.indent(tree)
    tree.write(path, encoding="utf-8", xml_declaration=True)
    return path


def write(reports: list[dict[str, Any]], path: str | Path) -> Path:
    return write_tree(to_xml(reports), path)
