"""The HTML report: self-contained, and its plots really render in headless Chromium."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from checks.render import html
from checks.report import aggregate

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DOC_SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "img" / "fleet-report.png"
FAIL_RGB, BAR_RGB = (0xCF, 0x22, 0x2E), (0x54, 0xAE, 0xFF)


class Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


def _tags(text: str) -> list[tuple[str, dict[str, str | None]]]:
    parser = Tags()
    parser.feed(text)
    return parser.tags


def _assert_self_contained(text: str) -> None:
    for tag, attrs in _tags(text):
        assert tag not in ("link", "img", "iframe"), tag
        assert "src" not in attrs and not (attrs.get("href") or "").startswith(("http", "//"))
    assert "@import" not in text and "url(" not in text


def test_fleet_report_is_self_contained_and_has_every_plot(tmp_path, small_fleet) -> None:
    path = html.write_fleet(aggregate.from_reports(small_fleet), tmp_path / "fleet.html")
    text = path.read_text()
    _assert_self_contained(text)
    titles = re.findall(r'<text[^>]*class="title"[^>]*>([^<]+)</text>', text)
    assert "All-reduce bus bandwidth vs message size" in titles
    assert "DataLoader throughput vs workers" in titles
    assert any(t.startswith("matmul_bf16_tflops per GPU") for t in titles)
    assert any(t.startswith("membw_copy_gbs per GPU") for t in titles)
    assert "median" in text and "node0012" in text and "ecc-errors" in text
    assert text.count('class="bar"') >= 2 * 24 * 8


def test_one_host_renders_its_checks(tmp_path, cpu_report) -> None:
    text = html.write([cpu_report], tmp_path / "host.html").read_text()
    _assert_self_contained(text)
    assert f"nodecert report: {cpu_report['host']}" in text
    for chk in cpu_report["checks"]:
        assert f">{chk['id']}<" in text
    assert "No figures or curves in these reports" in text


def test_large_fleets_get_histograms(tmp_path, h100_report) -> None:
    from checks.devtools import synthetic

    fleet = aggregate.from_reports(synthetic.build(40, base=h100_report))
    text = html.render(fleet)
    assert "320 values" in text and text.count('class="bar"') < 320


def _png_colours(path: Path) -> tuple[int, dict[tuple[int, int, int], int]]:
    from PIL import Image

    with Image.open(path) as img:
        rgb = img.convert("RGB")
        counts = {colour: n for n, colour in rgb.getcolors(maxcolors=1 << 20)}
    return len(counts), counts


def _chromium(url: str, *args: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={tmp / 'profile'}", *args, url]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True)


@pytest.mark.skipif(CHROMIUM is None, reason="needs headless Chromium (Debian package 'chromium')")
def test_plots_render_in_chromium(tmp_path, small_fleet) -> None:
    pytest.importorskip("PIL", reason="needs Pillow (dev extra) to read the screenshot")
    path = html.write_fleet(aggregate.from_reports(small_fleet), tmp_path / "fleet.html")
    url = path.as_uri()
    dom = _chromium(url, "--dump-dom", tmp=tmp_path).stdout
    svgs = re.findall(r"<svg.*?</svg>", dom, flags=re.S)
    assert len(svgs) >= 6
    paths = re.findall(r'<path d="M([^"]+)"', dom)
    assert paths and all(p.count(",") >= 5 for p in paths[:48])  # 24 hosts x 2 curves
    heights = [float(h) for h in re.findall(r'<rect[^>]*height="([0-9.]+)"', dom)]
    assert len(heights) >= 2 * 24 * 8 and min(heights) > 0

    shot = tmp_path / "fleet.png"
    _chromium(url, f"--screenshot={shot}", "--window-size=1400,2000", tmp=tmp_path)
    distinct, counts = _png_colours(shot)
    assert distinct > 50  # a blank or unstyled page has a handful
    assert counts.get(BAR_RGB, 0) > 20_000  # the bars were painted
    assert counts.get(FAIL_RGB, 0) > 500    # and the stragglers' bars and badges in red
    if os.environ.get("NODECERT_UPDATE_SCREENSHOTS"):
        DOC_SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, DOC_SCREENSHOT)


def test_only_the_straggler_bar_is_coloured(small_fleet) -> None:
    text = html.render(aggregate.from_reports(small_fleet))
    charts = {m.group(1): m.group(0) for m in re.finditer(
        r'<svg[^>]*>\s*<text[^>]*class="title">([a-z_0-9]+) per.*?</svg>', text, flags=re.S)}
    red = {name: re.findall(rf'fill="{html.COLORS["FAIL"]}"[^>]*><title>([^<:]+):', svg)
           for name, svg in charts.items()}
    assert red["matmul_bf16_tflops"] == ["node0007 GPU3"]
    assert red["allreduce_busbw_gbs"] == ["node0010"]
    assert red["membw_copy_gbs"] == red["dataloader_max_samples_per_s"] == []
