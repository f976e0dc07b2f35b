"""Terminal summary of a fleet run (rich): what did not pass, where, and the verdict."""

from __future__ import annotations

import re
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from checks.render.terminal import STYLE as CHECK_STYLE
from checks.render.terminal import plain
from checks.report.aggregate import Fleet
from checks.report.fabric_summary import summarise
from checks.report.figures import GpuRef

STYLE = {**CHECK_STYLE, "MISSING": "bold red"}
LISTED = 6  # hosts named per check before "+N more"


def _status(status: str) -> Text:
    return plain(status, STYLE.get(status, ""))


def _row(table: Table, *cells: str | Text) -> None:
    """A row of text from reports: never read as rich markup or control sequences."""
    table.add_row(*(c if isinstance(c, Text) else plain(c) for c in cells))


Row = list[str | Text]


def _print(console: Console, title: str, columns: tuple[str, ...], rows: list[Row],
           right: tuple[str, ...] = ()) -> None:
    if not rows:
        return
    table = Table(title=title, expand=False)
    for col in columns:
        if col in right:
            table.add_column(col, justify="right")
        else:
            table.add_column(col, overflow="fold")
    for row in rows:
        _row(table, *row)
    console.print(table)


def _host_rows(fleet: Fleet, verbose: bool) -> list[Row]:
    rows: list[Row] = []
    for h in fleet.hosts if verbose else [h for h in fleet.hosts if h.status != "PASS"]:
        found = [" ".join(filter(None, (f.kind, f.gpu.label() if f.gpu else None, f.figure)))
                 for f in h.findings]
        rows.append([h.host, _status(h.status), h.profile or "", ", ".join([*h.problems, *found]),
                     h.reason or ""])
    return rows


def _check_rows(fleet: Fleet) -> list[Row]:
    rows: list[Row] = []
    for spread in fleet.by_check:
        where = [f"{o.host}{' ' + ','.join(o.gpus) if o.gpus else ''}: {o.message}"
                 for o in spread.occurrences[:LISTED]]
        if len(spread.occurrences) > LISTED:
            where.append(f"+{len(spread.occurrences) - LISTED} more")
        rows.append([spread.check, _status(spread.status), str(len(spread.occurrences)), "\n".join(where)])
    return rows


def _straggler_rows(fleet: Fleet) -> list[Row]:
    def off_by(s: Any) -> str:
        text = f"{s.deficit_pct:.1f} %"
        return f"{text} (>{s.threshold_pct:g})" if s.status == "FAIL" else text

    return [[s.host, s.gpu.label() if s.gpu else "host", f"{s.check}/{s.name}", f"{s.value:.4g}",
             f"{s.median:.4g}", off_by(s), _status(s.status)] for s in fleet.stragglers]


def _drift_rows(fleet: Fleet) -> list[Row]:
    return [[d.host, f"{d.gpu.label()} {d.gpu.uuid or ''}" if d.gpu else "host", f"{d.check}/{d.name}",
             f"{d.value:.4g}", f"{d.baseline:.4g} ({d.baseline_kind})", f"{d.deficit_pct:.1f} %",
             _status(d.status or "")] for d in fleet.drifts]


def _digest_rows(fleet: Fleet) -> list[Row]:
    odd_ones = fleet.digests.odd if fleet.digests else []
    return [[odd.host, odd.gpu.label() if odd.gpu else "host", odd.group.label(), odd.digest[:12],
             (odd.majority or "none")[:12], _status(odd.status)] for odd in odd_ones]


def render(fleet: Fleet, console: Console, verbose: bool = False) -> None:
    _print(console, f"hosts{'' if verbose else ' not passing'}",
           ("host", "status", "profile", "checks not passed, findings", "note"), _host_rows(fleet, verbose))
    _print(console, "checks not passed", ("check", "status", "hosts", "where"), _check_rows(fleet))
    _print(console, "stragglers (below the median of their peers)",
           ("host", "GPU", "figure", "value", "median", "off by", "status"), _straggler_rows(fleet),
           right=("value", "median", "off by"))
    _print(console, "drifting (below their own baseline)",
           ("host", "GPU", "figure", "value", "baseline", "off by", "status"), _drift_rows(fleet),
           right=("value", "baseline", "off by"))
    _print(console, "reference digest differs from its group's majority",
           ("host", "GPU", "group", "digest", "majority", "status"), _digest_rows(fleet))
    _print(console, "lemons (GPUs failing run after run)", ("GPU UUID", "failed runs", "hosts", "checks"),
           [[lemon.uuid, f"{lemon.failed_runs} of last {lemon.window}", ", ".join(lemon.hosts),
             ", ".join(lemon.checks)] for lemon in fleet.lemons])
    _print(console, "multi-node fabric: nearest NIC per GPU, NCCL transports, per-rail runs",
           ("host", "rails", "transports", "rail runs"),
           [[row.host, row.rails or "-", row.transports or "-", row.rail_runs or "-"]
            for row in summarise(fleet.hosts)])
    counts = "  ".join(f"{k} {v}" for k, v in fleet.summary.items() if v and k != "hosts")
    style = "bold red" if fleet.verdict == "FAIL" else "bold green"
    console.print(plain(f"{fleet.verdict}  run {fleet.run_id}: {fleet.summary['hosts']} hosts  {counts}",
                        style=style))


_SEE = re.compile(r"\(see ([a-z0-9][a-z0-9-]*)\)$")


def _fault_lines(host: str, checks: list[dict[str, Any]]) -> list[str]:
    """One line per check not passed; a check whose every bad result only points at another
    failing check ("not measured: ... (see gpu-count)") is folded into that check's line."""
    rows: list[tuple[str, str, str]] = []  # check id, line, the check it defers to
    for chk in checks:
        bad = [r for r in chk["results"] if r["status"] in ("FAIL", "ERROR", "WARN")]
        if not bad:
            continue
        worst = max(bad, key=lambda r: ("WARN", "ERROR", "FAIL").index(r["status"]))
        gpus = sorted({ref.label() for r in bad if (ref := GpuRef.from_device(r.get("device")))})
        where = f" {','.join(gpus)}" if gpus else ""
        code = f" [{worst['fault_code']}]" if worst.get("fault_code") else ""
        causes = {m.group(1) if (m := _SEE.search(r["message"].strip())) else "" for r in bad}
        cause = causes.pop() if len(causes) == 1 else ""
        line = f"{worst['status']} {host} {chk['id']}{where}{code}: {worst['message']}"
        rows.append((chk["id"], line, cause))
    failing = {check for check, _, _ in rows}
    folded: dict[str, list[str]] = {}
    for check, _, cause in rows:
        if cause in failing and cause != check:
            folded.setdefault(cause, []).append(check)
    lines = []
    for check, line, cause in rows:
        if cause in failing and cause != check:
            continue
        under = folded.get(check, [])
        lines.append(f"{line}" + (f" (+{len(under)} checks not measured because of it: {', '.join(under)})"
                                   if under else ""))
    return lines


def compact_lines(fleet: Fleet) -> list[str]:
    """The fleet for a log: one line per host and check not passed (worst result, its GPUs and
    fault code; checks not measured because of another one folded into its line), one per fleet
    finding, one per host without a report, then the verdict. Text from reports is flattened."""
    def one_line(text: str) -> str:
        return " ".join(text.split())

    lines: list[str] = []
    for h in fleet.hosts:
        if h.report is None and h.status != "PASS":
            lines.append(one_line(f"{h.status} {h.host}: {h.reason or 'no report'}"))
        lines.extend(one_line(line) for line in _fault_lines(h.host, (h.report or {}).get("checks", [])))
        lines.extend(one_line(f"{f.status} {h.host} {f.kind}: {f.reason}") for f in h.findings)
    counts = "  ".join(f"{k} {v}" for k, v in fleet.summary.items() if v and k != "hosts")
    lines.append(f"{fleet.verdict}  run {fleet.run_id}: {fleet.summary['hosts']} hosts  {counts}")
    return lines


def render_compact(fleet: Fleet, console: Console) -> None:
    for line in compact_lines(fleet):
        console.print(plain(line), soft_wrap=True)
