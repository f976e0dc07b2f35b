"""Terminal summary of a fleet run (rich): what did not pass, where, and the verdict."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from checks.render.terminal import STYLE as CHECK_STYLE
from checks.render.terminal import plain
from checks.report.aggregate import Fleet
from checks.report.fabric_summary import summarise

STYLE = {**CHECK_STYLE, "MISSING": "bold red"}
LISTED = 6  # hosts named per check before "+N more"


def _status(status: str) -> Text:
    return plain(status, STYLE.get(status, ""))


def _row(table: Table, *cells: str | Text) -> None:
    """A row of text from reports: never read as rich markup or control sequences."""
    table.add_row(*(c if isinstance(c, Text) else plain(c) for c in cells))


def render(fleet: Fleet, console: Console, verbose: bool = False) -> None:
    hosts = fleet.hosts if verbose else [h for h in fleet.hosts if h.status != "PASS"]
    if hosts:
        table = Table(title=f"hosts{'' if verbose else ' not passing'}", expand=False)
        for col in ("host", "status", "profile", "checks not passed, findings", "note"):
            table.add_column(col, overflow="fold")
        for h in hosts:
            found = [" ".join(filter(None, (f.kind, f.gpu.label() if f.gpu else None, f.figure)))
                     for f in h.findings]
            _row(table, h.host, _status(h.status), h.profile or "", ", ".join([*h.problems, *found]),
                 h.reason or "")
        console.print(table)

    if fleet.by_check:
        table = Table(title="checks not passed", expand=False)
        for col in ("check", "status", "hosts", "where"):
            table.add_column(col, overflow="fold")
        for spread in fleet.by_check:
            where = [f"{o.host}{' ' + ','.join(o.gpus) if o.gpus else ''}: {o.message}"
                     for o in spread.occurrences[:LISTED]]
            if len(spread.occurrences) > LISTED:
                where.append(f"+{len(spread.occurrences) - LISTED} more")
            _row(table, spread.check, _status(spread.status), str(len(spread.occurrences)),
                          "\n".join(where))
        console.print(table)

    if fleet.stragglers:
        table = Table(title="stragglers (below the median of their peers)", expand=False)
        for col in ("host", "GPU", "figure", "value", "median", "off by", "status"):
            table.add_column(col, justify="right" if col in ("value", "median", "off by") else "left")
        for s in fleet.stragglers:
            _row(table, s.host, s.gpu.label() if s.gpu else "host", f"{s.check}/{s.name}",
                          f"{s.value:.4g}", f"{s.median:.4g}",
                          f"{s.deficit_pct:.1f} % (>{s.threshold_pct:g})" if s.status == "FAIL"
                          else f"{s.deficit_pct:.1f} %", _status(s.status))
        console.print(table)

    if fleet.drifts:
        table = Table(title="drifting (below their own baseline)", expand=False)
        for col in ("host", "GPU", "figure", "value", "baseline", "off by", "status"):
            table.add_column(col, justify="right" if col in ("value", "baseline", "off by") else "left")
        for d in fleet.drifts:
            _row(table, d.host, f"{d.gpu.label()} {d.gpu.uuid or ''}" if d.gpu else "host",
                          f"{d.check}/{d.name}", f"{d.value:.4g}",
                          f"{d.baseline:.4g} ({d.baseline_kind})", f"{d.deficit_pct:.1f} %",
                          _status(d.status or ""))
        console.print(table)

    if fleet.digests and fleet.digests.odd:
        table = Table(title="reference digest differs from its group's majority", expand=False)
        for col in ("host", "GPU", "group", "digest", "majority", "status"):
            table.add_column(col, overflow="fold")
        for odd in fleet.digests.odd:
            _row(table, odd.host, odd.gpu.label() if odd.gpu else "host", odd.group.label(),
                          odd.digest[:12], (odd.majority or "none")[:12], _status(odd.status))
        console.print(table)

    if fleet.lemons:
        table = Table(title="lemons (GPUs failing run after run)", expand=False)
        for col in ("GPU UUID", "failed runs", "hosts", "checks"):
            table.add_column(col, overflow="fold")
        for lemon in fleet.lemons:
            _row(table, lemon.uuid, f"{lemon.failed_runs} of last {lemon.window}",
                          ", ".join(lemon.hosts), ", ".join(lemon.checks))
        console.print(table)

    fabric = summarise(fleet.hosts)
    if fabric:
        table = Table(title="multi-node fabric: nearest NIC per GPU, NCCL transports, per-rail "
                            "runs", expand=False)
        for col in ("host", "rails", "transports", "rail runs"):
            table.add_column(col, overflow="fold")
        for row in fabric:
            _row(table, row.host, row.rails or "-", row.transports or "-", row.rail_runs or "-")
        console.print(table)

    counts = "  ".join(f"{k} {v}" for k, v in fleet.summary.items() if v and k != "hosts")
    style = "bold red" if fleet.verdict == "FAIL" else "bold green"
    console.print(plain(f"{fleet.verdict}  run {fleet.run_id}: {fleet.summary['hosts']} hosts  {counts}",
                        style=style))
