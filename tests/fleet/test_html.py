"""The HTML report: self-contained, and its plots really render in headless Chromium."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from checks.render import html
from checks.report import aggregate

sys.path.insert(0, str(Path(__file__).resolve().parent))
import lost_gpu

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


def test_fleet_report_is_self_contained_and_plots_what_differs(tmp_path, small_fleet) -> None:
    path = html.write_fleet(aggregate.from_reports(small_fleet), tmp_path / "fleet.html")
    text = path.read_text()
    _assert_self_contained(text)
    titles = re.findall(r'<text[^>]*class="title"[^>]*>([^<]+)</text>', text)
    assert "All-reduce bus bandwidth vs message size" in titles  # node0010 is slow on it
    assert any(t.startswith("matmul_bf16_tflops per GPU") for t in titles)
    assert any(t.startswith("membw_copy_gbs per GPU") for t in titles)
    # flat: no host differs on the DataLoader, so no chart; the table still gives its figures
    assert "DataLoader throughput vs workers" not in titles
    assert not [t for t in titles if t.startswith("dataloader_max_samples_per_s")]
    assert "<td>dataloader_max_samples_per_s</td>" in text
    assert "2 charts not drawn: every value within its limits" in text
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
    from checks.devtools.synthetic import Slow

    fleet = aggregate.from_reports(synthetic.build(40, base=h100_report, slow=[
        Slow("node0007", "matmul_bf16_tflops", 0.8, gpu=3)]))
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
    assert len(svgs) >= 4  # the all-reduce curves and three bar charts; the flat ones not drawn
    paths = re.findall(r'<path d="M([^"]+)"', dom)
    assert len(paths) >= 24 and all(p.count(",") >= 5 for p in paths[:24])  # 24 hosts' curves
    heights = [float(h) for h in re.findall(r'<rect[^>]*height="([0-9.]+)"', dom)]
    assert len(heights) >= 2 * 24 * 8 and min(heights) > 0

    shot = tmp_path / "fleet.png"
    _chromium(url, f"--screenshot={shot}", "--window-size=1400,4000", tmp=tmp_path)
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
    assert red["membw_copy_gbs"] == []  # a WARN straggler: drawn, its bar not red
    assert "dataloader_max_samples_per_s" not in charts  # no difference: not drawn


@pytest.fixture(scope="module")
def lost_gpu_fleet(h100_report) -> aggregate.Fleet:
    """Three healthy hosts, one whose GPU3 fell off the bus, one without a report."""
    from checks.devtools import synthetic

    lost = synthetic.build(1, base=synthetic.base_report("node-gpu-lost", level="standard"), run_id="r1")[0]
    lost["host"] = "node0009"
    return aggregate.from_reports([*synthetic.build(3, base=h100_report, run_id="r1"), lost],
                                  expected_hosts=["node0000", "node0001", "node0002", "node0009", "node0005"])


def _sections(text: str) -> list[str]:
    return re.findall(r"<h2>([^<]+)</h2>", text)


def test_a_lost_gpu_leads_with_what_to_do(lost_gpu_fleet) -> None:
    """The page opens with the hosts to act on: the lost GPU is one row (gpu-count, its fault
    code, remedy and confirm commands), its not-measured checks folded under it; the table by
    check lists the cause, the dependents apart after it."""
    text = html.render(lost_gpu_fleet)
    assert _sections(text)[0] == "Hosts to act on"
    assert text.index("<table") == text.index('<table id="act-on">')  # the first table
    act = text.split('<table id="act-on">')[1].split("</table>")[0]
    rows = re.findall(r"<tr data-host=\"([^\"]+)\" data-check=\"([^\"]+)\">", act)
    assert rows == [("node0005", "no report"), ("node0009", "gpu-count")]
    lost = act.split('data-check="gpu-count">')[1]
    assert "GPU3 0000:5d:00.0 serial not readable" in lost and "INV004" in lost
    assert "also seen by xid-events" in lost
    dependents = lost_gpu.dependents("standard")
    assert f"{len(dependents)} checks not measured because of it" in lost and dependents[0] in lost
    assert "drain and reboot the node" in lost and "<code>nvidia-smi -L</code>" in lost
    assert "docs/troubleshooting.md#inv004" in lost
    by_check = text.split("Checks not passed, by check and host")[1].split("</section>")[0]
    main_rows = re.findall(r"<tr><td>([a-z0-9-]+)</td>", by_check.split("<details>")[0])
    assert main_rows[0] == "gpu-count" and "torch-arch" not in main_rows
    folded = by_check.split("<details>")[1]
    assert f"{len(dependents)} results not measured because another check failed" in folded
    assert "<td>torch-arch</td><td>INV007</td><td>node0009</td><td>gpu-count</td>" in folded
    assert text.index("Hosts to act on") < text.index("<h2>Hosts</h2>") < text.index("by check and host") \
        < text.index("Figures compared")


def test_nothing_to_act_on(cpu_report) -> None:
    text = html.render(aggregate.from_reports([cpu_report]))
    assert _sections(text)[0] == "Hosts to act on"
    assert "Nothing to act on: every host passed." in text


@pytest.mark.skipif(CHROMIUM is None, reason="needs headless Chromium (Debian package 'chromium')")
def test_chromium_shows_what_to_act_on_first(tmp_path, lost_gpu_fleet) -> None:
    path = html.write_fleet(lost_gpu_fleet, tmp_path / "fleet.html")
    dom = _chromium(path.as_uri(), "--dump-dom", tmp=tmp_path).stdout
    tables = re.findall(r"<table[^>]*>", dom)
    assert tables[0] == '<table id="act-on">'
    first = re.findall(r"<h2>([^<]+)</h2>", dom)[0]
    assert first == "Hosts to act on"
    order = [dom.index(s) for s in ('data-check="gpu-count"', "<td>torch-arch</td>")]
    assert order == sorted(order)  # the cause before the checks it made unmeasurable
