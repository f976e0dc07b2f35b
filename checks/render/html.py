"""A self-contained HTML report (inline CSS, JS and SVG; no server, no CDN) for one host or a fleet.

    html.write([report], "report.html")            # one host, from `python -m checks --html`
    html.write_fleet(fleet, "reports/run/fleet.html")
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from checks import __version__, safeio
from checks.report import act_on, svg
from checks.report.aggregate import Fleet, from_reports
from checks.report.fabric_summary import summarise as fabric_rows
from checks.report.figures import Curve, Figure, higher_is_better
from checks.report.stragglers import MIN_PEERS, WARN_FRACTION, FigureStats

COLORS = {"PASS": "#1a7f37", "WARN": "#bf8700", "FAIL": "#cf222e", "ERROR": "#8250df",
          "MISSING": "#6e7781", "SKIP": "#8c959f"}
BAR = "#54aeff"
MAX_BARS = 256          # more GPUs or hosts than this: a histogram instead of one bar each
MAX_HOST_DETAILS = 16   # hosts whose every check result is listed
MAX_LISTED = 50         # hosts listed per failing check before "and N more"
MAX_SPARKLINES = 12     # GPU figures drawn with their history: drifting ones, then the nearest
# How to plot a check's curve: x key, y key, log-x, axis labels. Others: first two keys, linear.
CURVES = {
    "nccl-allreduce": ("bytes", "busbw_gbs", True, "message size", "bus bandwidth (GB/s)"),
    "dataloader-scaling": ("workers", "samples_per_s", False, "DataLoader workers", "samples/s"),
}
CURVE_TITLES = {"nccl-allreduce": "All-reduce bus bandwidth vs message size",
                "dataloader-scaling": "DataLoader throughput vs workers"}

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:#1f2328;background:#f6f8fa}
header{background:#fff;border-bottom:1px solid #d0d7de;padding:16px 24px}
header h1{font-size:20px;margin:0 0 4px}
main{padding:8px 24px 32px;max-width:1360px}
section{background:#fff;border:1px solid #d0d7de;border-radius:6px;margin:16px 0;padding:12px 16px}
h2{font-size:16px;margin:4px 0 10px}
table{border-collapse:collapse;width:100%}
th,td{text-align:left;padding:4px 8px;border-bottom:1px solid #eaeef2;vertical-align:top}
th{background:#f6f8fa;font-weight:600}
td.num{text-align:right;font-variant-numeric:tabular-nums}
.badge{display:inline-block;border-radius:10px;padding:0 8px;color:#fff;font-weight:600;font-size:12px}
.chips span{margin-right:12px}
.meta{color:#57606a}
.grid2{display:grid;grid-template-columns:repeat(auto-fit,minmax(620px,1fr));gap:12px}
.chart{max-width:100%;height:auto;background:#fff}
.chart .title{font-weight:600;font-size:13px}
.chart .tick,.chart .legend,.chart .rule-label{font-size:11px;fill:#57606a}
.chart .label{font-size:12px;fill:#1f2328}
.chart .grid{stroke:#eaeef2}
.chart .axis{stroke:#57606a}
.chart .bar:hover,.chart .series:hover{opacity:.7}
.empty{color:#57606a;font-style:italic}
.spark{vertical-align:middle}
code{font-size:12px}
.filters{margin-bottom:8px}
details{margin:6px 0}
summary{cursor:pointer;font-weight:600}
"""

JS = """
function filterHosts(){
  const q=document.getElementById('host-filter').value.toLowerCase();
  const bad=document.getElementById('problems-only').checked;
  document.querySelectorAll('#hosts tbody tr').forEach(function(tr){
    tr.hidden=(q&&!tr.dataset.host.includes(q))||(bad&&tr.dataset.status==='PASS');
  });
}
document.addEventListener('DOMContentLoaded',function(){
  const box=document.getElementById('host-filter');
  if(box){box.addEventListener('input',filterHosts);
    document.getElementById('problems-only').addEventListener('change',filterHosts);filterHosts();}
});
"""


def _el(parent: ET.Element, tag: str, text: Any = None, **attrs: Any) -> ET.Element:
    el = ET.SubElement(parent, tag, {k.rstrip("_").replace("_", "-"): str(v) for k, v in attrs.items()
                                     if v is not None and v is not False})
    if text is not None:
        el.text = str(text)
    return el


def _badge(parent: ET.Element, status: str) -> None:
    _el(parent, "span", status, class_="badge", style=f"background:{COLORS.get(status, '#57606a')}")


def _table(parent: ET.Element, headers: Sequence[str], table_id: str | None = None) -> ET.Element:
    table = _el(parent, "table", id=table_id)
    row = _el(_el(table, "thead"), "tr")
    for h in headers:
        _el(row, "th", h)
    return _el(table, "tbody")


def _header(root: ET.Element, fleet: Fleet) -> None:
    header = _el(root, "header")
    single = len(fleet.hosts) == 1
    title = f"nodecert report: {fleet.hosts[0].host}" if single else "nodecert fleet report"
    h1 = _el(header, "h1", title + " ")
    _badge(h1, fleet.verdict)
    meta = [f"run {fleet.run_id}" if fleet.run_id else None, f"generated {fleet.generated_at[:19]}Z",
            f"nodecert {__version__}"]
    if single and fleet.hosts[0].report:
        rep = fleet.hosts[0].report
        meta[1:1] = [f"level {rep.get('level')}", f"profile {rep['profile']['name']}",
                     f"backend {rep.get('backend')}"]
    _el(header, "div", " · ".join(m for m in meta if m), class_="meta")
    chips = _el(header, "div", class_="chips")
    for status, count in fleet.summary.items():
        if status == "hosts":
            _el(chips, "span", f"{count} host{'s' if count != 1 else ''}")
        elif count:
            _el(chips, "span", f"{status} {count}", style=f"color:{COLORS[status]};font-weight:600")


def _hosts(main: ET.Element, fleet: Fleet) -> None:
    sec = _el(main, "section")
    _el(sec, "h2", "Hosts")
    if len(fleet.hosts) > 1:
        filters = _el(sec, "div", class_="filters")
        _el(filters, "input", id="host-filter", type="search", placeholder="filter hosts")
        label = _el(filters, "label", " ")
        _el(label, "input", id="problems-only", type="checkbox", checked=len(fleet.hosts) > 50)
        label[-1].tail = " only hosts that did not pass"
    body = _table(sec, ["host", "status", "profile", "PASS", "WARN", "FAIL", "SKIP", "ERROR",
                        "checks not passed", "note"], "hosts")
    order = {"MISSING": 0, "ERROR": 1, "FAIL": 2, "WARN": 3, "PASS": 4}
    slow: dict[str, list[str]] = defaultdict(list)
    for s in fleet.stragglers:
        slow[s.host].append(f"{s.name} ({s.gpu.label() if s.gpu else 'host'}) straggler")
    for d in fleet.drifts:
        slow[d.host].append(f"{d.name} ({d.gpu.label() if d.gpu else 'host'}) drifting")
    for odd in fleet.digests.odd if fleet.digests else ():
        slow[odd.host].append(f"digest ({odd.gpu.label() if odd.gpu else 'host'}) differs")
    for h in sorted(fleet.hosts, key=lambda h: (order[h.status], h.host)):
        tr = _el(body, "tr", data_host=h.host.lower(), data_status=h.status)
        _el(tr, "td", h.host)
        _badge(_el(tr, "td"), h.status)
        _el(tr, "td", h.profile or "")
        for status in ("PASS", "WARN", "FAIL", "SKIP", "ERROR"):
            _el(tr, "td", (h.summary or {}).get(status, ""), class_="num")
        _el(tr, "td", ", ".join([*h.problems, *slow[h.host]]))
        _el(tr, "td", h.reason or "")


def _fabric(main: ET.Element, fleet: Fleet) -> None:
    """Rails map and NCCL transports per host (issue 11), when any report has them."""
    rows = fabric_rows(fleet.hosts)
    if not rows:
        return
    sec = _el(main, "section")
    _el(sec, "h2", "Multi-node fabric: nearest NIC per GPU, NCCL transports, per-rail runs")
    body = _table(sec, ["host", "rails", "transports", "rail runs (lowest busbw, worst status)"])
    for row in rows:
        tr = _el(body, "tr")
        _el(tr, "td", row.host)
        _el(tr, "td", row.rails or "-")
        _el(tr, "td", row.transports or "-")
        _el(tr, "td", row.rail_runs or "-")


def _act_on(main: ET.Element, rows: list[act_on.Row]) -> None:
    """First: one row per fault to act on, the root cause with its remedy and the commands that
    confirm it; the checks not measured because of it folded into its row."""
    sec = _el(main, "section")
    _el(sec, "h2", "Hosts to act on")
    if not rows:
        _el(sec, "p", "Nothing to act on: every host passed.", class_="empty")
        return
    body = _table(sec, ["host", "GPU", "status", "fault code", "root cause", "what was seen", "remedy",
                        "confirm with"], "act-on")
    for row in rows:
        tr = _el(body, "tr", data_host=row.host.lower(), data_check=row.check)
        _el(tr, "td", row.host)
        _el(tr, "td", row.gpu_text() or "host")
        _badge(_el(tr, "td"), row.status)
        _el(tr, "td", row.fault_code or ("" if row.kind in ("check", "report") else row.kind))
        cause = _el(tr, "td")
        _el(cause, "b", row.check)
        if row.also:
            _el(cause, "div", f"also seen by {', '.join(row.also)}", class_="meta")
        if row.dependents:
            det = _el(cause, "details", class_="dependents")
            _el(det, "summary", f"{len(row.dependents)} check{'s' if len(row.dependents) != 1 else ''} "
                                "not measured because of it")
            _el(det, "div", ", ".join(row.dependents), class_="meta")
        _el(tr, "td", row.message)
        _el(tr, "td", row.remedy or "")
        confirm = _el(tr, "td")
        for command in row.confirm:
            _el(_el(confirm, "div"), "code", command)
        if row.fault_code:
            _el(confirm, "div", f"see {row.see()}", class_="meta")


def _by_check(main: ET.Element, fleet: Fleet, folded: dict[tuple[str, str], str]) -> None:
    """Checks not passed, by check; a check that only could not measure because another check
    failed on that host is listed apart, under the check it was not measured because of."""
    sec = _el(main, "section")
    _el(sec, "h2", "Checks not passed, by check and host")
    if not fleet.by_check:
        _el(sec, "p", "Every check passed on every host with a report.", class_="empty")
        return
    body = _table(sec, ["check", "code", "status", "hosts", "where"])
    dependent: list[tuple[str, str, str, str]] = []  # check, code, host, cause
    for spread in fleet.by_check:
        own = [o for o in spread.occurrences if (o.host, spread.check) not in folded]
        dependent += [(spread.check, spread.code, o.host, folded[(o.host, spread.check)])
                      for o in spread.occurrences if (o.host, spread.check) in folded]
        if not own:
            continue
        tr = _el(body, "tr")
        _el(tr, "td", spread.check)
        _el(tr, "td", spread.code)
        _badge(_el(tr, "td"), spread.status)
        _el(tr, "td", len(own), class_="num")
        where = _el(tr, "td")
        for occ in own[:MAX_LISTED]:
            line = _el(where, "div")
            _el(line, "b", occ.host)
            line[-1].tail = f" {' '.join(occ.gpus)} [{occ.status}] {occ.message}"
        if len(own) > MAX_LISTED:
            _el(where, "div", f"… and {len(own) - MAX_LISTED} more hosts")
    if dependent:
        det = _el(sec, "details")
        _el(det, "summary", f"{len(dependent)} results not measured because another check failed")
        body = _table(det, ["check", "code", "host", "not measured because of"])
        for check, code, host, cause in dependent:
            tr = _el(body, "tr")
            for text in (check, code, host, cause):
                _el(tr, "td", text)


def _stragglers_and_lemons(main: ET.Element, fleet: Fleet) -> None:
    sec = _el(main, "section")
    _el(sec, "h2", "Stragglers (figures far from the median of their peers)")
    if fleet.stragglers:
        body = _table(sec, ["host", "GPU", "figure", "value", "median", "below median", "status"])
        for s in fleet.stragglers:
            tr = _el(body, "tr")
            _el(tr, "td", s.host)
            _el(tr, "td", f"{s.gpu.label()} {s.gpu.uuid or ''}" if s.gpu else "host")
            _el(tr, "td", f"{s.check} / {s.name}")
            _el(tr, "td", svg.fmt(s.value), class_="num")
            _el(tr, "td", svg.fmt(s.median), class_="num")
            _el(tr, "td", f"{s.deficit_pct:.1f} % (limit {s.threshold_pct:g} %)", class_="num")
            _badge(_el(tr, "td"), s.status)
    else:
        _el(sec, "p", "No GPU or host is more than half the straggler limit from its peers' median "
                      "(or no figures were measured).", class_="empty")
    if len(fleet.hosts) == 1 and not fleet.lemons:
        return  # the history is a fleet matter
    sec = _el(main, "section")
    _el(sec, "h2", "Lemons (GPUs failing again and again, by UUID)")
    if fleet.lemons:
        body = _table(sec, ["GPU UUID", "failed runs", "hosts", "checks", "last failed run"])
        for lemon in fleet.lemons:
            tr = _el(body, "tr")
            _el(tr, "td", lemon.uuid)
            _el(tr, "td", f"{lemon.failed_runs} of the last {lemon.window}", class_="num")
            _el(tr, "td", ", ".join(lemon.hosts))
            _el(tr, "td", ", ".join(lemon.checks))
            _el(tr, "td", lemon.last_failed_run)
    else:
        _el(sec, "p", "None (or no run history: see --history).", class_="empty")


def _drift(main: ET.Element, fleet: Fleet) -> None:
    if len(fleet.hosts) == 1 and not fleet.drift:
        return  # the history is a fleet matter
    sec = _el(main, "section")
    _el(sec, "h2", "Memory of every GPU: figures against the GPU's own baseline")
    bad = fleet.drifts
    if bad:
        names = sorted({f"{d.host} {d.gpu.label() if d.gpu else 'host'}" for d in bad})
        _el(sec, "p", f"Drifting: {', '.join(names)}.")
    if not fleet.drift:
        _el(sec, "p", "No GPU has enough history yet (or no run history: see --history).",
            class_="empty")
        return
    shown = [*bad, *[d for d in fleet.drift if not d.status][:max(0, MAX_SPARKLINES - len(bad))]]
    body = _table(sec, ["host", "GPU", "figure", "runs (last = this run)", "baseline", "this run",
                        "below baseline", "status"])
    for d in shown:
        tr = _el(body, "tr")
        _el(tr, "td", d.host)
        _el(tr, "td", f"{d.gpu.label()} {d.gpu.uuid or ''}" if d.gpu else "host")
        _el(tr, "td", f"{d.check} / {d.name}")
        scale = -1 if higher_is_better(d.name) else 1  # the limits lie on the figure's bad side
        warn = d.baseline * (1 + scale * d.warn_pct / 100)
        fail = d.baseline * (1 + scale * d.fail_pct / 100)
        cell = _el(tr, "td")
        cell.append(svg.sparkline(list(d.series), baseline=d.baseline, warn=warn, fail=fail,
                                  color=COLORS.get(d.status or "PASS", BAR),
                                  tooltip=" → ".join(svg.fmt(v) for v in d.series)))
        _el(tr, "td", f"{svg.fmt(d.baseline)} ({d.baseline_kind}{f' of {d.runs}' if d.runs > 1 else ''})",
            class_="num")
        _el(tr, "td", svg.fmt(d.value), class_="num")
        _el(tr, "td", f"{d.deficit_pct:.1f} % (warn {d.warn_pct:g}, fail {d.fail_pct:g})", class_="num")
        _badge(_el(tr, "td"), d.status or "PASS")
    if len(fleet.drift) > len(shown):
        _el(sec, "p", f"… and {len(fleet.drift) - len(shown)} more GPU figures within their limits.",
            class_="meta")


def _digests(main: ET.Element, fleet: Fleet) -> None:
    analysis = fleet.digests
    if analysis is None or not analysis.groups:
        if len(fleet.hosts) > 1:
            sec = _el(main, "section")
            _el(sec, "h2", "Same bits everywhere: reference digests")
            _el(sec, "p", "No reference-digest results in these reports (it runs at --level "
                          "standard on GPU hosts).", class_="empty")
        return
    sec = _el(main, "section")
    _el(sec, "h2", "Same bits everywhere: reference digests by GPU model and software stack")
    body = _table(sec, ["GPU model", "driver", "CUDA", "torch", "reference", "hosts", "GPUs",
                        "majority digest", "other digests"])
    for g in analysis.groups:
        tr = _el(body, "tr")
        for text in (g.key.model, g.key.driver, g.key.cuda, g.key.torch, g.key.reference):
            _el(tr, "td", text)
        _el(tr, "td", len(g.hosts), class_="num")
        _el(tr, "td", len(g.entries), class_="num")
        _el(_el(tr, "td"), "code", g.majority[:16] if g.majority else "none (split)")
        _el(tr, "td", ", ".join(f"{d[:12]} ×{n}" for d, n in g.counts if d != g.majority) or "")
    if analysis.odd:
        _el(sec, "p", "GPUs whose digest differs from their group's majority:")
        body = _table(sec, ["host", "GPU", "digest", "group majority", "status"])
        for odd in analysis.odd:
            tr = _el(body, "tr")
            _el(tr, "td", odd.host)
            _el(tr, "td", f"{odd.gpu.label()} {odd.gpu.uuid or ''}" if odd.gpu else "host")
            _el(_el(tr, "td"), "code", odd.digest[:16])
            _el(_el(tr, "td"), "code", odd.majority[:16] if odd.majority else "none")
            _badge(_el(tr, "td"), odd.status)
    else:
        _el(sec, "p", "Every GPU computed its group's digest.", class_="empty")


def _curve_charts(curves: list[Curve], highlight: dict[str, str]) -> list[ET.Element]:
    by_check: dict[str, list[Curve]] = defaultdict(list)
    for c in curves:
        by_check[c.check].append(c)
    charts = []
    for check, group in sorted(by_check.items()):
        keys = list(group[0].points[0])
        x_key, y_key, log_x, x_label, y_label = CURVES.get(
            check, (keys[0], keys[1] if len(keys) > 1 else keys[0], False, keys[0], keys[-1]))
        few = len(group) <= len(svg.PALETTE)
        series = []
        for i, c in enumerate(group):
            name = c.host + (f" {c.gpu.label()}" if c.gpu else "")
            pts = [(p[x_key], p[y_key]) for p in c.points if x_key in p and y_key in p]
            if not pts:
                continue
            if few:
                series.append(svg.Series(name, pts, svg.PALETTE[i]))
            elif c.host in highlight:
                series.append(svg.Series(name, pts, COLORS[highlight[c.host]], width=2.5))
            else:
                series.append(svg.Series(name, pts, svg.MUTED, width=1, opacity=0.35))
        if series:
            charts.append(svg.line_chart(
                series, title=CURVE_TITLES.get(check, f"{check}: {y_key} vs {x_key}"),
                x_label=x_label, y_label=y_label, log_x=log_x,
                x_format=svg.fmt_bytes if x_key == "bytes" else svg.fmt))
    return charts


def _figure_chart(stats: FigureStats, members: list[Figure],
                  slow: dict[tuple[str, str, str, str], str]) -> ET.Element:
    """Bars (or a histogram) of one peer group, the median and the WARN/FAIL limits across;
    `slow` maps (check, figure, host, GPU label) to the straggler status, for the bar colour."""
    med = stats.median
    sign = -1 if stats.higher_is_better else 1
    warn_at = med * (1 + sign * stats.threshold_pct * WARN_FRACTION / 100)
    fail_at = med * (1 + sign * stats.threshold_pct / 100)
    bound = "<" if stats.higher_is_better else ">"
    rules = [svg.Rule(med, "median", "#0969da"),
             svg.Rule(warn_at, f"WARN {bound}", COLORS["WARN"], "4 3"),
             svg.Rule(fail_at, f"FAIL {bound}", COLORS["FAIL"], "4 3")]
    scope = "per GPU" if stats.key.scope == "gpu" else "per host"
    title = f"{stats.key.name} {scope} ({stats.key.check}, {stats.key.profile}, {stats.count} values)"

    def color(host: str, label: str) -> str:
        status = slow.get((stats.key.check, stats.key.name, host, label))
        return COLORS[status] if status else BAR

    if len(members) <= MAX_BARS:
        ordered = sorted(members, key=lambda f: (f.host, -1 if f.gpu is None else f.gpu.index or 0))
        bars = [svg.Bar(f"{f.host} {f.gpu.label()}" if f.gpu else f.host, f.value,
                        color(f.host, f.gpu.label() if f.gpu else "host"))
                for f in ordered]
        hosts = [f.host for f in ordered]
        if len(set(hosts)) == 1:  # one host: label each GPU
            bars = [svg.Bar(f.gpu.label() if f.gpu else f.host, b.value, b.color, b.label)
                    for f, b in zip(ordered, bars, strict=True)]
        return svg.bar_chart(bars, rules, title=title, y_label=stats.key.name,
                             groups=None if len(set(hosts)) == 1 else hosts)

    def color_of(value: float) -> str:
        deficit = sign * (value - med) / med * 100
        if deficit > stats.threshold_pct:
            return COLORS["FAIL"]
        return COLORS["WARN"] if deficit > stats.threshold_pct * WARN_FRACTION else BAR

    return svg.histogram([f.value for f in members], rules, title=title, x_label=stats.key.name,
                         color_of=color_of)


def _plots(main: ET.Element, fleet: Fleet) -> None:
    sec = _el(main, "section")
    _el(sec, "h2", "Figures compared with the median of their peers")
    highlight = {h.host: h.status for h in fleet.hosts if h.status in ("FAIL", "WARN")}
    slow = {(s.check, s.name, s.host, s.gpu.label() if s.gpu else "host"): s.status
            for s in fleet.stragglers}
    drawn = [stats for stats in fleet.figure_stats if stats.count >= MIN_PEERS]
    # Only the charts that show a difference: a group with a straggler, a curve with a host that
    # did not pass that check. The table above them lists every figure's median, min and max.
    differ = {(s.check, s.name) for s in fleet.stragglers}
    charts = [_figure_chart(stats, fleet.figure_groups[stats.key], slow) for stats in drawn
              if (stats.key.check, stats.key.name) in differ]
    bad_on = {(o.host, spread.check) for spread in fleet.by_check for o in spread.occurrences}
    bad_on |= {(s.host, s.check) for s in fleet.stragglers}
    # a check's curves are drawn when any host whose curve it has did not pass it (one pass over
    # the curves: comparing every curve with every other was quadratic, minutes at 10 000 hosts)
    differing = {c.check for c in fleet.curves if (c.host, c.check) in bad_on}
    curves = [c for c in fleet.curves if c.check in differing]
    curve_charts = _curve_charts(curves, highlight)
    if not fleet.figure_stats and not fleet.curves:
        _el(sec, "p", "No figures or curves in these reports: the workload checks run at "
                      "--level standard.", class_="empty")
        return
    _figure_table(sec, fleet)
    flat = len(drawn) - len(charts) + len({c.check for c in fleet.curves}) - len({c.check for c in curves})
    if flat:
        _el(sec, "p", f"{flat} chart{'s' if flat != 1 else ''} not drawn: every value within its limits "
                      "(see the table).", class_="meta")
    grid = _el(sec, "div", class_="grid2")
    for chart in curve_charts:
        grid.append(chart)
    for chart in charts:
        sec.append(chart)


def _figure_table(sec: ET.Element, fleet: Fleet) -> None:
    body = _table(sec, ["check", "figure", "scope", "profile", "values", "median", "min", "max",
                        "straggler limit"])
    for st in fleet.figure_stats:
        tr = _el(body, "tr")
        for text in (st.key.check, st.key.name, st.key.scope, st.key.profile):
            _el(tr, "td", text)
        _el(tr, "td", st.count, class_="num")
        for value in (st.median, st.low, st.high):
            _el(tr, "td", svg.fmt(value), class_="num")
        limit = f"{st.threshold_pct:g} % {'below' if st.higher_is_better else 'above'}"
        _el(tr, "td", limit if st.count >= MIN_PEERS else f"needs {MIN_PEERS} values")


def _host_details(main: ET.Element, fleet: Fleet) -> None:
    if len(fleet.hosts) > MAX_HOST_DETAILS:
        return
    sec = _el(main, "section")
    _el(sec, "h2", "Check results by host")
    for h in fleet.hosts:
        det = _el(sec, "details", open=len(fleet.hosts) == 1 or None)
        summ = _el(det, "summary", f"{h.host} ")
        _badge(summ, h.status)
        if h.report is None:
            _el(det, "p", h.reason or "no report", class_="empty")
            continue
        body = _table(det, ["check", "status", "device", "value", "message"])
        for chk in h.report["checks"]:
            for i, r in enumerate(chk["results"]):
                tr = _el(body, "tr")
                _el(tr, "td", chk["id"] if i == 0 else "")
                _badge(_el(tr, "td"), r["status"])
                dev = r.get("device") or {}
                _el(tr, "td", " ".join(str(x) for x in (
                    f"GPU{dev['index']}" if dev.get("index") is not None else None, dev.get("pci")) if x))
                value = r.get("value")
                shown = ("" if value is None or isinstance(value, dict | list)
                         else f"{value} {r.get('unit') or ''}".strip())
                _el(tr, "td", shown, class_="num")
                msg = _el(tr, "td", r["message"])
                if r.get("remedy") and r["status"] in ("FAIL", "WARN", "ERROR"):
                    _el(msg, "div", f"→ {r['remedy']}", class_="meta")


def render(fleet: Fleet) -> str:
    html = ET.Element("html", lang="en")
    head = _el(html, "head")
    _el(head, "meta", charset="utf-8")
    _el(head, "meta", name="viewport", content="width=device-width, initial-scale=1")
    _el(head, "title", f"nodecert {fleet.verdict} {fleet.run_id or ''}".strip())
    _el(head, "style", CSS)
    _el(head, "script", JS)
    body = _el(html, "body")
    _header(body, fleet)
    main = _el(body, "main")
    # The order an operator acts in: what to do on which host, then the hosts and the checks,
    # then the fleet's comparisons, then the charts (only those that show a difference).
    rows = act_on.rows(fleet.hosts)
    _act_on(main, rows)
    _hosts(main, fleet)
    _by_check(main, fleet, act_on.folded_checks(rows))
    _stragglers_and_lemons(main, fleet)
    _drift(main, fleet)
    _digests(main, fleet)
    _plots(main, fleet)
    _fabric(main, fleet)
    _host_details(main, fleet)
    return "<!DOCTYPE html>\n" + ET.tostring(html, encoding="unicode", method="html") + "\n"


def write_fleet(fleet: Fleet, path: str | Path) -> Path:
    return safeio.write_text(path, render(fleet))


def write(reports: Iterable[dict[str, Any]], path: str | Path) -> Path:
    """The HTML report of reports in memory: `python -m checks --html FILE` passes [report]."""
    return write_fleet(from_reports(list(reports)), path)
