"""Terminal summary of a fleet run (rich): what did not pass, where, and the verdict."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from checks.render.terminal import STYLE as CHECK_STYLE
from checks.render.terminal import plain
from checks.report import act_on
from checks.report.aggregate import Fleet
from checks.report.fabric_summary import summarise

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


def _act_on_rows(found: list[act_on.Row]) -> list[Row]:
    rows: list[Row] = []
    for r in found:
        cause = r.check + (f"\nalso: {', '.join(r.also)}" if r.also else "")
        if r.dependents:
            cause += f"\n+{len(r.dependents)} not measured because of it"
        code = r.fault_code or ("" if r.kind in ("check", "report") else r.kind)
        confirm = [*r.confirm, *([f"see {r.see()}"] if r.fault_code else [])]
        rows.append([r.host, r.gpu_text() or "host", _status(r.status), code, cause, r.message,
                     r.remedy or "", "\n".join(confirm)])
    return rows


def _check_rows(fleet: Fleet, folded: dict[tuple[str, str], str]) -> list[Row]:
    """By check, the causes; a check that was only not measured because of another one on a host
    is one row per cause at the end, "not measured because of <cause>"."""
    rows: list[Row] = []
    because: dict[str, set[str]] = {}  # cause -> the checks it left unmeasured
    for spread in fleet.by_check:
        own = [o for o in spread.occurrences if (o.host, spread.check) not in folded]
        for o in spread.occurrences:
            if (o.host, spread.check) in folded:
                because.setdefault(folded[(o.host, spread.check)], set()).add(spread.check)
        if not own:
            continue
        where = [f"{o.host}{' ' + ','.join(o.gpus) if o.gpus else ''}: {o.message}" for o in own[:LISTED]]
        if len(own) > LISTED:
            where.append(f"+{len(own) - LISTED} more")
        rows.append([spread.check, _status(spread.status), str(len(own)), "\n".join(where)])
    for cause, checks in because.items():
        rows.append([f"{len(checks)} checks", _status("ERROR"), "",
                     f"not measured because of {cause}: {', '.join(sorted(checks))}"])
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


# Below this many columns the eight columns of "hosts to act on" fold every cell into slivers
# (10 hosts took 230 lines of an 80-column pipe): each fault is then one line (host, GPU,
# status, code, cause) with what was seen, the remedy and the commands indented below it.
WIDE_COLUMNS = 140


def _act_on_blocks(console: Console, found: list[act_on.Row]) -> None:
    if not found:
        return
    console.print(plain("hosts to act on", "bold"))
    for r in found:
        code = r.fault_code or ("" if r.kind in ("check", "report") else r.kind)
        head = Text()
        head.append(f"{r.host}  ")
        head.append_text(_status(r.status))
        head.append("  " + "  ".join(filter(None, (code, r.check, r.gpu_text()))))
        console.print(head, overflow="fold")
        lines = [("seen", r.message)]
        if r.also:
            lines.append(("also", ", ".join(r.also)))
        if r.dependents:
            lines.append(("not measured", f"{len(r.dependents)} checks because of it"))
        if r.remedy:
            lines.append(("remedy", r.remedy))
        lines += [("confirm", c) for c in r.confirm]
        if r.fault_code:
            lines.append(("see", r.see()))
        for label, text in lines:
            console.print(plain(f"    {label}: {' '.join(str(text).split())}"), overflow="fold")


def render(fleet: Fleet, console: Console, verbose: bool = False) -> None:
    """The tables in the order an operator acts: what to do on which host first."""
    found = act_on.rows(fleet.hosts)
    if console.width < WIDE_COLUMNS:
        _act_on_blocks(console, found)
    else:
        _print(console, "hosts to act on", ("host", "GPU", "status", "code", "root cause",
                                            "what was seen", "remedy", "confirm with"),
               _act_on_rows(found))
    _print(console, f"hosts{'' if verbose else ' not passing'}",
           ("host", "status", "profile", "checks not passed, findings", "note"), _host_rows(fleet, verbose))
    _print(console, "checks not passed", ("check", "status", "hosts", "where"),
           _check_rows(fleet, act_on.folded_checks(found)))
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
    policies = fleet.site_policies
    if len(policies) > 1:  # one policy is the rule; more say some hosts judge with other numbers
        console.print(plain("site policies: " + ", ".join(
            f"{k} on {n} host{'s' if n > 1 else ''}" for k, n in policies.items())
            + " (hosts[].site in the JSON; docs/checks.md, 'Tuning for your site')", style="yellow"))
    style = "bold red" if fleet.verdict == "FAIL" else "bold green"
    console.print(plain(f"{fleet.verdict}  run {fleet.run_id}: {fleet.summary['hosts']} hosts  {counts}",
                        style=style))


def compact_line(row: act_on.Row) -> str:
    """One row to act on as one log line: what, where, the checks folded under it, the remedy
    and the first command that confirms it."""
    if row.kind == "report":
        return f"{row.status} {row.host}: {row.message}"
    if row.kind == "check":
        where = f" {row.gpu.label()}" if row.gpu else ""
        code = f" [{row.fault_code}]" if row.fault_code else ""
        line = f"{row.status} {row.host} {row.check}{where}{code}: {row.message}"
    else:
        line = f"{row.status} {row.host} {row.kind}: {row.message}"
    if row.also:
        line += f" (also seen by {', '.join(row.also)})"
    if row.dependents:
        line += (f" (+{len(row.dependents)} checks not measured because of it: "
                 f"{', '.join(row.dependents)})")
    if row.remedy:
        line += f" -> remedy: {row.remedy}"
    if row.confirm:
        line += f"; confirm: {row.confirm[0]}"
    if row.fault_code:
        line += f"; see {row.see()}"
    return line


def compact_lines(fleet: Fleet) -> list[str]:
    """The fleet for a log, in the order an operator acts: one line per row to act on (hosts
    without a report first, then the worst; a check not measured because of another one folded
    into that one's line), then the verdict. Text from reports is flattened."""
    def one_line(text: str) -> str:
        return " ".join(text.split())

    lines = [one_line(compact_line(row)) for row in act_on.rows(fleet.hosts)]
    counts = "  ".join(f"{k} {v}" for k, v in fleet.summary.items() if v and k != "hosts")
    lines.append(f"{fleet.verdict}  run {fleet.run_id}: {fleet.summary['hosts']} hosts  {counts}")
    return lines


def render_compact(fleet: Fleet, console: Console) -> None:
    for line in compact_lines(fleet):
        console.print(plain(line), soft_wrap=True)
