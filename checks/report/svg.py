"""Inline SVG charts for the HTML report, drawn here so the report needs no library or CDN.

Three kinds: line charts (curves per host, optionally log-x), bar charts (one bar per GPU or host,
with the median and the straggler limits drawn across) and histograms (the same for fleets too
large for one bar each). Every mark carries a <title>, which browsers show on hover.
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

SVG_NS = "http://www.w3.org/2000/svg"
MARGIN = {"left": 64, "right": 16, "top": 28, "bottom": 44}
PALETTE = ("#0969da", "#1a7f37", "#bf3989", "#9a6700", "#8250df", "#0a7d86", "#bc4c00", "#57606a",
           "#cf222e", "#116329")
MUTED = "#8c959f"


@dataclass
class Series:
    name: str
    points: list[tuple[float, float]]
    color: str = MUTED
    width: float = 1.5
    opacity: float = 1.0


@dataclass
class Bar:
    label: str
    value: float
    color: str
    tooltip: str = ""


@dataclass
class Rule:
    """A horizontal line across a chart (median, WARN and FAIL limits)."""

    value: float
    label: str
    color: str
    dash: str = ""


@dataclass
class Frame:
    width: int
    height: int
    x_min: float
    x_max: float
    y_max: float
    log_x: bool = False
    svg: ET.Element = field(init=False)

    def __post_init__(self) -> None:
        self.svg = ET.Element("svg", {"xmlns": SVG_NS, "viewBox": f"0 0 {self.width} {self.height}",
                                      "width": str(self.width), "height": str(self.height),
                                      "class": "chart", "role": "img"})

    @property
    def plot_w(self) -> float:
        return self.width - MARGIN["left"] - MARGIN["right"]

    @property
    def plot_h(self) -> float:
        return self.height - MARGIN["top"] - MARGIN["bottom"]

    def x(self, value: float) -> float:
        lo, hi, v = self.x_min, self.x_max, value
        if self.log_x:
            lo, hi, v = math.log(lo), math.log(hi), math.log(max(value, self.x_min))
        return MARGIN["left"] + (v - lo) / ((hi - lo) or 1) * self.plot_w

    def y(self, value: float) -> float:
        return MARGIN["top"] + self.plot_h * (1 - value / (self.y_max or 1))


def nice_ticks(hi: float, count: int = 5) -> list[float]:
    """Round tick values from 0 to about `hi` (1, 2, 2.5 or 5 times a power of ten apart)."""
    if hi <= 0:
        return [0.0]
    raw = hi / count
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    return [i * step for i in range(int(hi / step + 1e-9) + 1)]


def fmt(value: float) -> str:
    if value and (abs(value) >= 1e5 or abs(value) < 1e-2):
        return f"{value:.3g}"
    return f"{value:,.2f}".rstrip("0").rstrip(".")


def fmt_bytes(value: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:g} {unit}"
        value /= 1024
    return f"{value:g}"


def _sub(parent: ET.Element, tag: str, text: str | None = None, **attrs: object) -> ET.Element:
    el = ET.SubElement(parent, tag, {k.rstrip("_").replace("_", "-"): str(v) for k, v in attrs.items()})
    if text is not None:
        el.text = text
    return el


def _axes(frame: Frame, title: str, x_label: str, y_label: str,
          x_ticks: Sequence[tuple[float, str]]) -> None:
    svg = frame.svg
    _sub(svg, "text", title, x=MARGIN["left"], y=16, class_="title")
    bottom = MARGIN["top"] + frame.plot_h
    for tick in nice_ticks(frame.y_max / 1.05):
        y = frame.y(tick)
        _sub(svg, "line", x1=MARGIN["left"], x2=MARGIN["left"] + frame.plot_w, y1=y, y2=y, class_="grid")
        _sub(svg, "text", fmt(tick), x=MARGIN["left"] - 6, y=y + 4, class_="tick", text_anchor="end")
    for value, label in x_ticks:
        x = frame.x(value)
        _sub(svg, "line", x1=x, x2=x, y1=bottom, y2=bottom + 4, class_="axis")
        _sub(svg, "text", label, x=x, y=bottom + 16, class_="tick", text_anchor="middle")
    _sub(svg, "line", x1=MARGIN["left"], x2=MARGIN["left"] + frame.plot_w, y1=bottom, y2=bottom,
         class_="axis")
    _sub(svg, "line", x1=MARGIN["left"], x2=MARGIN["left"], y1=MARGIN["top"], y2=bottom, class_="axis")
    _sub(svg, "text", x_label, x=MARGIN["left"] + frame.plot_w / 2, y=frame.height - 6,
         class_="label", text_anchor="middle")
    _sub(svg, "text", y_label, x=12, y=MARGIN["top"] + frame.plot_h / 2, class_="label",
         text_anchor="middle", transform=f"rotate(-90 12 {MARGIN['top'] + frame.plot_h / 2})")


def _rules(frame: Frame, rules: Sequence[Rule]) -> None:
    for rule in rules:
        y = frame.y(rule.value)
        _sub(frame.svg, "line", x1=MARGIN["left"], x2=MARGIN["left"] + frame.plot_w, y1=y, y2=y,
             stroke=rule.color, stroke_width=1.5, stroke_dasharray=rule.dash or "none",
             class_="rule")
    _rule_key(frame, rules)


def _rule_key(frame: Frame, rules: Sequence[Rule]) -> None:
    """The rules' values, in their colours, at the top right (lines too close for labels)."""
    text = _sub(frame.svg, "text", x=frame.width - MARGIN["right"], y=16, class_="rule-label",
                text_anchor="end")
    for rule in rules:
        _sub(text, "tspan", f"  {rule.label} {fmt(rule.value)}", fill=rule.color)


def log_ticks(lo: float, hi: float, fmt_value: Callable[[float], str]) -> list[tuple[float, str]]:
    """Powers of two between lo and hi, spaced so that about eight are labelled."""
    first, last = math.ceil(math.log2(lo)), math.floor(math.log2(hi))
    step = max(1, math.ceil((last - first + 1) / 8))
    return [(2.0 ** e, fmt_value(2.0 ** e)) for e in range(first, last + 1) if (e - first) % step == 0]


def line_chart(series: Sequence[Series], *, title: str, x_label: str, y_label: str,
               log_x: bool = False, x_format: Callable[[float], str] = fmt,
               width: int = 640, height: int = 320, legend: bool = True) -> ET.Element:
    xs = [x for s in series for x, _ in s.points if not log_x or x > 0]
    ys = [y for s in series for _, y in s.points]
    frame = Frame(width, height, min(xs), max(xs), max(ys) * 1.05 or 1.0, log_x)
    ticks = (log_ticks(frame.x_min, frame.x_max, x_format) if log_x
             else [(t, x_format(t)) for t in nice_ticks(frame.x_max) if t >= frame.x_min])
    _axes(frame, title, x_label, y_label, ticks)
    # Muted series first, so the highlighted ones are drawn on top.
    for s in sorted(series, key=lambda s: s.color != MUTED):
        pts = [(frame.x(x), frame.y(y)) for x, y in s.points if not log_x or x > 0]
        d = "M" + " L".join(f"{x:.1f},{y:.1f}" for x, y in pts)
        path = _sub(frame.svg, "path", d=d, fill="none", stroke=s.color, stroke_width=s.width,
                    stroke_opacity=s.opacity, class_="series")
        _sub(path, "title", s.name)
    named = [s for s in series if s.color != MUTED]
    if legend and named:
        for i, s in enumerate(named[:10]):
            y = MARGIN["top"] + 14 * i + 6
            x = MARGIN["left"] + 10
            _sub(frame.svg, "line", x1=x, x2=x + 14, y1=y, y2=y, stroke=s.color, stroke_width=3)
            _sub(frame.svg, "text", s.name, x=x + 18, y=y + 4, class_="legend")
    return frame.svg


def bar_chart(bars: Sequence[Bar], rules: Sequence[Rule], *, title: str, y_label: str,
              groups: Sequence[str] | None = None, width: int = 1280, height: int = 300) -> ET.Element:
    """One bar per item; `groups` (one name per bar, e.g. the host of each GPU) labels the axis
    once per group instead of once per bar."""
    top = max([b.value for b in bars] + [r.value for r in rules]) * 1.05 or 1.0
    frame = Frame(width, height, 0, len(bars), top)
    names = list(groups) if groups else [b.label for b in bars]
    starts = [i for i, name in enumerate(names) if i == 0 or names[i - 1] != name]
    step = max(1, math.ceil(len(starts) / 12))
    ticks = [(i + 0.5, names[i]) for i in starts[::step]]
    _axes(frame, title, "", y_label, ticks)
    slot = frame.plot_w / len(bars)
    for i, bar in enumerate(bars):
        rect = _sub(frame.svg, "rect", x=f"{frame.x(i) + slot * 0.1:.2f}", y=f"{frame.y(bar.value):.2f}",
                    width=f"{max(slot * 0.8, 0.5):.2f}",
                    height=f"{frame.y(0) - frame.y(bar.value):.2f}", fill=bar.color, class_="bar")
        _sub(rect, "title", bar.tooltip or f"{bar.label}: {fmt(bar.value)}")
    _rules(frame, rules)
    return frame.svg


def histogram(values: Sequence[float], rules: Sequence[Rule], *, title: str, x_label: str,
              color_of: Callable[[float], str], bins: int = 40, width: int = 1280,
              height: int = 300) -> ET.Element:
    """Counts of values per bin, x = value; the rules are drawn as vertical lines."""
    lo = min([*values, *(r.value for r in rules)])
    hi = max([*values, *(r.value for r in rules)])
    lo, hi = lo - (hi - lo) * 0.02 - 1e-9, hi + (hi - lo) * 0.02 + 1e-9
    size = (hi - lo) / bins
    counts = [0] * bins
    for v in values:
        counts[min(int((v - lo) / size), bins - 1)] += 1
    frame = Frame(width, height, lo, hi, max(counts) * 1.05)
    _axes(frame, title, x_label, "count", [(t, fmt(t)) for t in _range_ticks(lo, hi)])
    for i, count in enumerate(counts):
        if not count:
            continue
        x0, x1 = frame.x(lo + i * size), frame.x(lo + (i + 1) * size)
        # At least 2 px high: a single straggler among thousands must stay visible.
        height_px = max(frame.y(0) - frame.y(count), 2.0)
        rect = _sub(frame.svg, "rect", x=f"{x0:.2f}", y=f"{frame.y(0) - height_px:.2f}",
                    width=f"{max(x1 - x0 - 1, 0.5):.2f}", height=f"{height_px:.2f}",
                    fill=color_of(lo + (i + 0.5) * size), class_="bar")
        _sub(rect, "title", f"{fmt(lo + i * size)} – {fmt(lo + (i + 1) * size)}: {count}")
    for rule in rules:
        x = frame.x(rule.value)
        _sub(frame.svg, "line", x1=x, x2=x, y1=MARGIN["top"], y2=frame.y(0), stroke=rule.color,
             stroke_width=1.5, stroke_dasharray=rule.dash or "none", class_="rule")
    _rule_key(frame, rules)
    return frame.svg


def _range_ticks(lo: float, hi: float, count: int = 8) -> list[float]:
    raw = (hi - lo) / count
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    return [k * step for k in range(math.ceil(lo / step), math.floor(hi / step) + 1)]


def sparkline(values: Sequence[float], *, baseline: float, warn: float, fail: float,
              color: str, tooltip: str = "", width: int = 160, height: int = 32) -> ET.Element:
    """One GPU's figure over its runs (the last point is this run), with its baseline and the
    WARN / FAIL limits below it (`warn` and `fail` are values, not percentages)."""
    pad = 3
    lo = min([*values, fail]) * 0.98
    hi = max([*values, baseline]) * 1.02
    span = (hi - lo) or 1.0
    svg = ET.Element("svg", {"xmlns": SVG_NS, "viewBox": f"0 0 {width} {height}", "width": str(width),
                             "height": str(height), "class": "spark", "role": "img"})

    def xy(i: int, v: float) -> tuple[float, float]:
        x = pad + (width - 2 * pad) * (i / max(len(values) - 1, 1))
        return x, pad + (height - 2 * pad) * (1 - (v - lo) / span)

    for value, stroke, dash in ((baseline, MUTED, ""), (warn, "#bf8700", "3,2"), (fail, "#cf222e", "3,2")):
        y = xy(0, value)[1]
        _sub(svg, "line", x1=pad, x2=width - pad, y1=f"{y:.1f}", y2=f"{y:.1f}", stroke=stroke,
             stroke_width=1, stroke_dasharray=dash or "none")
    pts = [xy(i, v) for i, v in enumerate(values)]
    _sub(svg, "path", d="M" + " L".join(f"{x:.1f},{y:.1f}" for x, y in pts), fill="none",
         stroke="#0969da", stroke_width=1.5)
    x, y = pts[-1]
    _sub(svg, "circle", cx=f"{x:.1f}", cy=f"{y:.1f}", r=3, fill=color)
    _sub(svg, "title", tooltip or " → ".join(fmt(v) for v in values))
    return svg
