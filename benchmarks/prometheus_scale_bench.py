"""Prometheus at fleet scale: series in the controller's fleet textfile and the time the real
node_exporter takes to serve it, for 1 000 and 10 000 synthetic hosts x 8 GPUs, against the old
layout (a file per host in the controller's directory, every per-GPU series of every host).

    .venv/bin/python benchmarks/prometheus_scale_bench.py [--hosts 1000,10000] [--old-max 1000]
        [--repeat 3]

For each fleet size: aggregate the synthetic reports (checks.devtools.synthetic: one straggler GPU,
one failed ECC check), write the fleet summary (`write_fleet`, the default layout) and, up to
--old-max hosts, the old layout too (`host_files=True`); start Debian's prometheus-node-exporter
(textfile collector only, on 127.0.0.1, a port the kernel picks) on each directory and time an
HTTP GET of /metrics (best of --repeat). Also one node's own file, which each node's exporter
serves in the new layout. Above --old-max the old layout's series are counted from one host's
file times the hosts (its files are the same shape), not written or scraped: at 10 000 hosts one
scrape of it took minutes and gigabytes of memory on this kind of machine.
"""

from __future__ import annotations

import argparse
import gc
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from checks.devtools import synthetic
from checks.render import prometheus
from checks.report import aggregate

EXPORTER = ("prometheus-node-exporter", "node_exporter")
SCRAPE_TIMEOUT_S = 600.0  # generous: the point is to measure the old layout, not to give up on it


class Exporter:
    """node_exporter serving one textfile directory on loopback."""

    def __init__(self, directory: Path) -> None:
        binary = next((b for b in map(shutil.which, EXPORTER) if b), None)
        if binary is None:
            raise SystemExit("error: no node_exporter (apt-get install prometheus-node-exporter)")
        self.proc = subprocess.Popen(
            [binary, "--web.listen-address=127.0.0.1:0", "--collector.disable-defaults",
             "--collector.textfile", f"--collector.textfile.directory={directory}"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.address: str | None = None
        ready = threading.Event()

        def read_log() -> None:
            assert self.proc.stderr is not None
            for line in self.proc.stderr:  # drained for the whole run
                found = re.search(r'msg="Listening on" address=(127\.0\.0\.1:\d+)', line)
                if found:
                    self.address = found.group(1)
                    ready.set()
            ready.set()

        threading.Thread(target=read_log, daemon=True).start()
        if not ready.wait(15) or self.address is None:
            self.close()
            raise SystemExit("error: node_exporter did not start listening")

    def scrape(self) -> tuple[float, int]:
        """(seconds, bytes) of one GET /metrics."""
        t0 = time.perf_counter()
        with urllib.request.urlopen(f"http://{self.address}/metrics", timeout=SCRAPE_TIMEOUT_S) as resp:
            body = resp.read()
        return time.perf_counter() - t0, len(body)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def series(directory: Path) -> tuple[int, int, int]:
    """(series, files, bytes) of the .prom files in `directory`."""
    count = size = files = 0
    for path in directory.glob("*.prom"):
        text = path.read_text()
        files += 1
        size += len(text)
        count += sum(1 for line in text.splitlines() if line and not line.startswith("#"))
    return count, files, size


def scrape_time(directory: Path, repeat: int) -> tuple[float, int]:
    exporter = Exporter(directory)
    try:
        timings = [exporter.scrape() for _ in range(repeat)]
    finally:
        exporter.close()
    return min(t for t, _ in timings), timings[0][1]


def row(label: str, n_series: int, files: int, size: int, seconds: float | None) -> str:
    took = f"{seconds:9.3f} s" if seconds is not None else "  (not scraped)"
    return f"  {label:<34} {n_series:>11,} series {files:>6,} files {size / 1e6:9.1f} MB  scrape {took}"


def bench(hosts: int, old_max: int, repeat: int, base: dict) -> None:
    t0 = time.perf_counter()
    reports = synthetic.build(hosts, base=base, slow=[
        synthetic.Slow(synthetic.host_name(7), "matmul_bf16_tflops", 0.8, gpu=3)], broken=[
        synthetic.Broken(synthetic.host_name(4), "ecc-errors", gpu=5)])
    fleet = aggregate.from_reports(reports, run_id=f"bench-{hosts}")
    del reports
    gc.collect()
    print(f"{hosts:,} hosts x 8 GPUs: built and aggregated in {time.perf_counter() - t0:.1f} s")
    with tempfile.TemporaryDirectory(prefix="prom-bench-") as tmp:
        new, node, old = Path(tmp) / "fleet", Path(tmp) / "node", Path(tmp) / "old"
        t0 = time.perf_counter()
        prometheus.write_fleet(fleet, new)
        write_new = time.perf_counter() - t0
        new_series, new_files, new_size = series(new)
        new_s, _ = scrape_time(new, repeat)
        print(row("controller, fleet summary (new)", new_series, new_files, new_size, new_s)
              + f"  (written in {write_new:.2f} s)")
        prometheus.write(fleet.reports[:1], node / "nodecert.prom")
        node_series, _, node_size = series(node)
        node_s, _ = scrape_time(node, repeat)
        print(row("each node, its own file (new)", node_series, 1, node_size, node_s))
        if hosts <= old_max:
            t0 = time.perf_counter()
            prometheus.write_fleet(fleet, old, host_files=True)
            write_old = time.perf_counter() - t0
            old_series, old_files, old_size = series(old)
            old_s, _ = scrape_time(old, 1)
            print(row("controller, a file per host (old)", old_series, old_files, old_size, old_s)
                  + f"  (written in {write_old:.1f} s)")
            print(f"  old/new: {old_series / new_series:.0f}x the series, "
                  f"{old_s / new_s:.0f}x the scrape time of one target")
        else:
            old_series = node_series * hosts + new_series
            old_size = node_size * hosts + new_size
            print(row("controller, a file per host (old)", old_series, hosts + 1, old_size, None)
                  + "  (counted, not written)")
            print(f"  old/new: {old_series / new_series:.0f}x the series")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hosts", default="1000,10000", help="fleet sizes, comma-separated")
    p.add_argument("--old-max", type=int, default=1000,
                   help="largest fleet for which the old layout is written and scraped")
    p.add_argument("--repeat", type=int, default=3, help="scrapes per target (best is printed)")
    args = p.parse_args(argv)
    try:
        sizes = [int(n) for n in args.hosts.split(",") if n.strip()]
    except ValueError:
        print(f"error: --hosts {args.hosts}: expected numbers, comma-separated", file=sys.stderr)
        return 2
    if not sizes or min(sizes) < 1 or args.repeat < 1:
        print("error: need --hosts >= 1 and --repeat >= 1", file=sys.stderr)
        return 2
    base = synthetic.base_report()
    for hosts in sizes:
        bench(hosts, args.old_max, args.repeat, base)
    return 0


if __name__ == "__main__":
    sys.exit(main())
