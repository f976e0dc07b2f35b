"""Expected hosts from an Ansible inventory, read by Ansible itself (`ansible-inventory --list`),
so every inventory format and plugin Ansible knows works here too."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from checks.supervise import procs


class InventoryError(Exception):
    """The inventory could not be read (one-line message)."""


def _ansible_inventory() -> str:
    beside_python = Path(sys.executable).with_name("ansible-inventory")
    found = str(beside_python) if beside_python.exists() else shutil.which("ansible-inventory")
    if not found:
        raise InventoryError("ansible-inventory not found (install ansible-core, or use --expect-hosts)")
    return found


# ansible-inventory answers a file no plugin can parse with a warning, exit 0 and `{}`: these make
# it an error (exit 1, "Completely failed to parse inventory source ...").
STRICT_ENV = {"ANSIBLE_INVENTORY_UNPARSED_FAILED": "True",
              "ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED": "True"}


def _reason(stderr: str) -> str:
    """The parse error itself (the first warning names it), else the last line."""
    lines = [" ".join(line.split()) for line in stderr.splitlines() if line.strip()]
    cause = next((ln for ln in lines if "Failed to parse" in ln and ":" in ln.split("plugin", 1)[-1]),
                 None)
    return (cause or (lines or ["no output"])[-1]).removeprefix("[WARNING]: ").removeprefix("[ERROR]: ")


def hosts(path: str | Path, timeout_s: float = 120.0, group: str | None = None) -> list[str]:
    """Every host of the inventory at `path` (of `group` only, if given), sorted. An inventory
    that does not parse, or has no host (in `group`), is an InventoryError."""
    if not Path(path).exists():
        raise InventoryError(f"inventory {path} does not exist")
    cmd = [_ansible_inventory(), "-i", str(path), "--list"]
    try:
        proc = procs.run(cmd, timeout_s=timeout_s, text=True, env={**os.environ, **STRICT_ENV})
    except subprocess.TimeoutExpired:
        raise InventoryError(f"ansible-inventory -i {path} timed out after {timeout_s:g} s") from None
    if proc.returncode != 0:
        raise InventoryError(f"inventory {path} does not parse: {_reason(proc.stderr)}")
    try:
        data = json.loads(proc.stdout)
    except ValueError as exc:
        raise InventoryError(f"ansible-inventory -i {path}: unexpected output ({exc})") from None
    if not isinstance(data, dict):
        raise InventoryError(f"inventory {path}: unexpected ansible-inventory output")
    names: set[str] = set()
    if group is None:
        names.update(data.get("_meta", {}).get("hostvars", {}))
        groups = [g for g in data if g != "_meta"]
    else:
        groups, seen = [group], set[str]()
        while len(seen) < len(groups):  # the group and its children, transitively
            name = groups[len(seen)]
            seen.add(name)
            body = data.get(name)
            children = body.get("children", []) if isinstance(body, dict) else []
            groups += [c for c in children if c not in groups]
    for name in groups:
        body = data.get(name)
        if isinstance(body, dict):
            names.update(h for h in body.get("hosts", []) if isinstance(h, str))
    if not names:
        raise InventoryError(f"inventory {path} lists no hosts" + (f" in group {group}" if group else ""))
    return sorted(names)


def main(argv: list[str] | None = None) -> int:
    """`python -m checks.fleet.ansible_inventory FILE [GROUP]`: exit 0 when the inventory parses
    and lists at least one host (in GROUP) whose name is one node name, else one line and exit 2
    (`make verify` runs this before the playbook, which would skip every play and pass)."""
    from checks import report_schema

    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (1, 2):
        print("usage: python -m checks.fleet.ansible_inventory FILE [GROUP]", file=sys.stderr)
        return 2
    try:
        names = hosts(args[0], group=args[1] if len(args) > 1 else None)
    except InventoryError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    bad = next((p for n in names if (p := report_schema.host_problem(n))), None)
    if bad:
        print(f"error: inventory {args[0]}: {bad}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
