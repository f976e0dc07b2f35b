"""JUnit XML: one testsuite per host, one testcase per check (CI systems read this)."""

from __future__ import annotations

import io
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from checks import safeio


def to_xml(reports: Iterable[Mapping[str, Any]]) -> ET.Element:
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


# Characters XML 1.0 cannot hold, not even escaped (C0 controls but tab, newline and carriage
# return; lone surrogates; U+FFFE/U+FFFF): a message or environment value carrying one would make
# the whole file unreadable to every JUnit consumer.
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _xml_safe(text: str) -> str:
    return _NOT_XML.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def sanitise(root: ET.Element) -> ET.Element:
    """Every text and attribute of the tree with the characters XML cannot hold written as \\xNN."""
    for el in root.iter():
        if el.text:
            el.text = _xml_safe(el.text)
        for key, value in el.attrib.items():
            el.set(key, _xml_safe(value))
    return root


def write_tree(root: ET.Element, path: str | Path) -> Path:
    sanitise(root)
    tree = ET.ElementTree(root)
    ET.indent(tree)
    buf = io.BytesIO()
    tree.write(buf, encoding="utf-8", xml_declaration=True)
    return safeio.write_bytes(path, buf.getvalue())


def write(reports: list[dict[str, Any]], path: str | Path) -> Path:
    return write_tree(to_xml(reports), path)
