"""The real Prometheus tools for the tests: node_exporter serving a textfile directory on
loopback, scraped over HTTP, and the Prometheus text parser applied to what it served.

node_exporter listens on 127.0.0.1:0 (the kernel picks a free port; the exporter logs which), so
several test runs at once never race for a port.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

NODE_EXPORTER = ("prometheus-node-exporter", "node_exporter")  # Debian's name, upstream's
PROMTOOL = "promtool"
APT_HINT = "make test installs .ci/apt-packages.txt (prometheus-node-exporter, prometheus)"

Sample = tuple[str, frozenset[tuple[str, str]], float]


def node_exporter_binary() -> str | None:
    return next((b for b in map(shutil.which, NODE_EXPORTER) if b), None)


def samples(text: str, prefix: str = "nodecert_") -> set[Sample]:
    """Every sample of the metrics named `prefix...`, as comparable tuples."""
    return {(s.name, frozenset(s.labels.items()), s.value)
            for f in text_string_to_metric_families(text) if f.name.startswith(prefix)
            for s in f.samples}


class NodeExporter:
    """`with NodeExporter(dir) as ne: ne.scrape()`: only the textfile collector, on loopback."""

    def __init__(self, textfile_dir: Path, binary: str | None = None) -> None:
        self.textfile_dir = textfile_dir
        self.binary = binary or node_exporter_binary()
        self.address: str | None = None
        self.log: list[str] = []
        self._proc: subprocess.Popen[str] | None = None
        self._listening = threading.Event()

    def __enter__(self) -> NodeExporter:
        if self.binary is None:
            raise RuntimeError(f"no node_exporter binary: {APT_HINT}")
        self._proc = subprocess.Popen(
            [self.binary, "--web.listen-address=127.0.0.1:0", "--collector.disable-defaults",
             "--collector.textfile", f"--collector.textfile.directory={self.textfile_dir}"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        threading.Thread(target=self._read_log, daemon=True).start()
        if not self._listening.wait(15) or self.address is None:
            self.__exit__()
            raise RuntimeError("node_exporter did not start listening:\n" + "".join(self.log[-20:]))
        return self

    def _read_log(self) -> None:
        # Drained for the whole run: a full pipe would block the exporter's logging.
        assert self._proc is not None and self._proc.stderr is not None
        for line in self._proc.stderr:
            self.log.append(line)
            found = re.search(r'msg="Listening on" address=(127\.0\.0\.1:\d+)', line)
            if found:
                self.address = found.group(1)
                self._listening.set()
        self._listening.set()  # exited before listening: wake the waiter

    def scrape(self) -> str:
        with urllib.request.urlopen(f"http://{self.address}/metrics", timeout=10) as resp:
            return resp.read().decode()

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())
