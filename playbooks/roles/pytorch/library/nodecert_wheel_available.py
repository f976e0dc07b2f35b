#!/usr/bin/python
# Copyright: nodecert contributors
# Apache License 2.0 (see pyproject.toml)
"""Ansible module: ask a wheel index (or wheel directories) whether a package version has a wheel
this node can install, before anything is installed."""

from __future__ import annotations

DOCUMENTATION = r"""
module: nodecert_wheel_available
short_description: Find a wheel of a package version for the node's Python and architecture
description:
  - Reads the PEP 503 simple page C(<index_url>/<package>/) and/or lists the C(find_links)
    directories, and keeps the wheels of C(version) whose tags fit C(python_version) and
    C(architecture). Changes nothing; runs the same in check mode. Fails, naming what the
    index does offer, when no wheel fits.
options:
  package: {description: Distribution name, type: str, required: true}
  version: {description: Exact version (a local label such as +cu128 is accepted), type: str, required: true}
  python_version: {description: major.minor of the interpreter the venv is made from, type: str, required: true}
  architecture: {description: Machine as uname reports it (x86_64, aarch64), type: str, required: true}
  index_url: {description: Simple index root; empty for none, type: str, default: ""}
  find_links: {description: Directories of wheels, type: list, elements: path, default: []}
  timeout: {description: Seconds for the index request, type: int, default: 30}
"""

RETURN = r"""
wheels:
  description: File names of the fitting wheels.
  returned: always
  type: list
"""

import os
import re
import urllib.error
import urllib.request
from html.parser import HTMLParser

from ansible.module_utils.basic import AnsibleModule


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            href = dict(attrs).get("href") or ""
            self.names.append(urllib.request.url2pathname(href.split("#", 1)[0].rsplit("/", 1)[-1]))


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def fits(filename: str, package: str, version: str, python_version: str, architecture: str) -> bool:
    """Whether a wheel file name is package==version for this CPython and machine (PEP 427 names:
    name-version(-build)?-python-abi-platform.whl)."""
    if not filename.endswith(".whl"):
        return False
    parts = filename[:-4].split("-")
    if len(parts) not in (5, 6) or _normalise(parts[0]) != _normalise(package):
        return False
    if parts[1].split("+", 1)[0] != version.split("+", 1)[0] or ("+" in version and parts[1] != version):
        return False
    pythons, platforms = parts[-3].split("."), parts[-1].split(".")
    cp = "cp" + python_version.replace(".", "")
    python_ok = cp in pythons or any(p in ("py3", "py2.py3") for p in pythons) or "abi3" in parts[-2]
    platform_ok = any(p == "any" or p.endswith("_" + architecture) for p in platforms)
    return python_ok and platform_ok


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "package": {"type": "str", "required": True},
            "version": {"type": "str", "required": True},
            "python_version": {"type": "str", "required": True},
            "architecture": {"type": "str", "required": True},
            "index_url": {"type": "str", "default": ""},
            "find_links": {"type": "list", "elements": "path", "default": []},
            "timeout": {"type": "int", "default": 30},
        },
        supports_check_mode=True,
    )
    p = module.params
    names: list[str] = []
    looked: list[str] = []
    for directory in p["find_links"]:
        looked.append(directory)
        try:
            names += os.listdir(directory)
        except OSError as exc:
            module.fail_json(msg=f"cannot list the wheel directory {directory}: {exc.strerror}")
    if p["index_url"]:
        url = p["index_url"].rstrip("/") + "/" + p["package"] + "/"
        looked.append(url)
        try:
            with urllib.request.urlopen(url, timeout=p["timeout"]) as response:
                parser = _Links()
                parser.feed(response.read().decode("utf-8", "replace"))
                names += parser.names
        except (urllib.error.URLError, OSError) as exc:
            module.fail_json(msg=f"could not read the wheel index {url}: {getattr(exc, 'reason', exc)}")
    wheels = sorted({n for n in names if fits(n, p["package"], p["version"], p["python_version"], p["architecture"])})
    if not wheels:
        same_python = sorted(
            {
                n.split("-")[1]
                for n in names
                if n.endswith(".whl") and _normalise(n.split("-")[0]) == _normalise(p["package"])
                and fits(n, p["package"], n.split("-")[1], p["python_version"], p["architecture"])
            }
        )
        module.fail_json(
            msg=(
                f"no {p['package']} {p['version']} wheel for Python {p['python_version']} on "
                f"{p['architecture']} in {', '.join(looked) or 'no index'}; versions there for this "
                f"Python and machine: {', '.join(same_python[-8:]) or 'none'}"
            ),
            wheels=[],
        )
    module.exit_json(changed=False, wheels=wheels)


if __name__ == "__main__":
    main()
