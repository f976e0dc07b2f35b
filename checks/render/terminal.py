"""Terminal table (rich)."""

from __future__ import annotations

import re
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

STYLE = {"PASS": "green", "WARN": "yellow", "FAIL": "bold red", "SKIP": "dim", "ERROR": "bold magenta"}
# Control characters a message or a name may carry (an escape sequence would drive the operator's
# terminal): shown as \\xNN. Newlines stay, they separate a message from its remedy.
_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f]")


def plain(value: object, style: str = "") -> Text:
    """A cell or title from data: never rich markup (`[/dev/nvidia4]` is text, not a tag), never a
    control sequence."""
    return Text(_CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(value)), style=style)


def _value(result: dict[str, Any]) -> str:
    value = result.get("value")
    if value is None or isinstance(value, dict | list):
        return ""
    if isinstance(value, float):
        value = f"{value:.4g}"
    elif isinstance(value, int) and not isinstance(value, bool):
        value = f"{value:,}"
    unit = result.get("unit") or ""
    return f"{value} {unit}".strip()


def _fold_skips(checks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Consecutive checks skipped for the same reason become one row listing their ids."""
    out: list[dict[str, Any]] = []
    for chk in checks:
        prev = out[-1] if out else None
        reason = chk["results"][0]["message"] if chk["status"] == "SKIP" else None
        if (reason and prev and prev["status"] == "SKIP"
                and prev["results"][0]["message"] == reason):
            prev["id"] = f"{prev['id']}, {chk['id']}"
        else:
            out.append(dict(chk))
    return out


def _collapse(results: list[dict[str, Any]]) -> list[tuple[dict[str, Any], int]]:
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in results:
        key = (r["status"], r["message"] if r["status"] != "PASS" else "")
        groups.setdefault(key, []).append(r)
    return [(members[0], len(members)) for members in groups.values()]


def render(report: dict[str, Any], console: Console, verbose: bool = False) -> None:
    table = Table(title=plain(f"{report['host']}  level={report['level']}  "
                              f"profile={report['profile']['name']}"), expand=False)
    table.add_column("check")
    table.add_column("status")
    table.add_column("device")
    table.add_column("value", justify="right")
    table.add_column("message", overflow="fold")
    checks = report["checks"] if verbose else _fold_skips(report["checks"])
    for chk in checks:
        results = chk["results"]
        # Every non-passing result gets a row; identical rows (same status and message, e.g. one
        # per GPU) and passing per-GPU rows collapse into one unless --verbose.
        shown = [(r, 1) for r in results] if verbose else _collapse(
            [r for r in results if r["status"] != "PASS"] or results)
        for i, (r, count) in enumerate(shown):
            device = r.get("device") or {}
            label = " ".join(str(x) for x in (
                f"GPU{device['index']}" if device.get("index") is not None else None,
                device.get("pci")) if x)
            message = r["message"]
            if count > 1:
                label = f"{count} GPUs" if device.get("index") is not None else f"x{count}"
            if r.get("remedy") and r["status"] in ("FAIL", "WARN", "ERROR"):
                message += f"\n→ {r['remedy']}"
                if count == 1 and device.get("serial"):  # what an RMA asks for
                    message += f" (serial {device['serial']})"
            table.add_row(plain(chk["id"] if i == 0 else ""), plain(r["status"], STYLE[r["status"]]),
                          plain(label), plain(_value(r)), plain(message))
    console.print(table)
    summary = "  ".join(f"{k} {v}" for k, v in report["summary"].items() if v)
    style = "bold red" if report["verdict"] == "FAIL" else "bold green"
    console.print(Text(f"{report['verdict']}  ({summary}; {report['duration_s']:.1f} s)", style=style))
