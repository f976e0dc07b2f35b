"""The real Prometheus tools for the tests: node_exporter serving a textfile directory on
loopback, scraped over HTTP, and the Prometheus text parser applied to what it served.

node_exporter listens on 127.0.0.1:0 (the kernel picks a free port; the exporter logs which), so
several test runs at once never race for a port.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from checks.devtools import synthetic
from checks.devtools.synthetic import Broken
from checks.fleet import fleet_cli
from checks.render import prometheus

sys.path.insert(0, str(Path(__file__).resolve().parent))
from drift_fleet import ODD as DIGEST_ODD
from drift_fleet import add_digests

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


FLEET_HOSTS = [synthetic.host_name(i) for i in range(12)]
FLEET_SLOW = [synthetic.Slow("node0007", "matmul_bf16_tflops", 0.8, gpu=3)]
FLEET_BROKEN = [Broken("node0004", "ecc-errors", gpu=5, message="GPU5: uncorrectable ECC errors")]
FLEET_QUIET = "node0009"  # reports in run 1, not in run 2: its node's file stays, two days old
FLEET_GONE = "node0010"   # reports in run 1, then vanishes: no report, its node's file deleted
FLEET_ODD = ("node0002", 6)  # computes another reference digest in run 2 (its own report: PASS)


def two_fleet_runs(work: Path, base: dict[str, Any], textfiles: Path,
                   nodes: Path | None = None) -> dict[str, Any]:
    """Two fleet runs of 12 hosts: each node writes its own textfile into `nodes` (what
    `python -m checks --prometheus` does on the node; one directory here stands in for each
    node's own node_exporter) and `python -m checks.fleet report --prometheus-dir` writes the
    controller's fleet summary into `textfiles`. Both runs: a FAIL straggler GPU and a failed ECC
    check (so both GPUs become lemons). Run 2, two days later (now): a GPU computing other bits
    than the fleet, a host whose reports stopped and one that vanished; run 2 is read without an
    inventory, so the history names the hosts that should have reported. Returns run 2's fleet
    JSON."""
    # Anchored to now, not to the base report's own time: a session-scoped base may have been
    # made many minutes before this test runs.
    now = dt.datetime.now(dt.UTC)
    nodes = nodes or work / "node-textfiles"
    for run in ("run-1", "run-2"):
        reports = synthetic.build(12, base=base, run_id=run, slow=FLEET_SLOW, broken=FLEET_BROKEN)
        started = now - dt.timedelta(days=2) if run == "run-1" else now  # run 2 is now
        for r in reports:
            r["started_at"] = started.isoformat()
            odd = {FLEET_ODD[1]: DIGEST_ODD} if run == "run-2" and r["host"] == FLEET_ODD[0] else {}
            add_digests(r, odd)
        inventory: list[str] = ["--expect-hosts", ",".join(FLEET_HOSTS)]
        if run == "run-2":
            reports = [r for r in reports if r["host"] not in (FLEET_QUIET, FLEET_GONE)]
            (nodes / prometheus.host_file(FLEET_GONE)).unlink()
            inventory = []
        for r in reports:  # each node publishes its own run
            prometheus.write([r], nodes / prometheus.host_file(r["host"]))
        directory = synthetic.write(reports, work / run)
        code = fleet_cli.main(["report", str(directory), *inventory,
                               "--history", str(work / "history.sqlite"), "-q",
                               "--prometheus-dir", str(textfiles), "--json", str(work / f"{run}.json")])
        if code != 1:  # a failed host and a FAIL straggler
            raise AssertionError(f"python -m checks.fleet report {directory}: exit {code}, not 1")
    return json.loads((work / "run-2.json").read_text())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrometheusServer:
    """A real Prometheus on loopback scraping `targets` every second and evaluating `rule_files`
    every second; its database in `workdir`. `query(expr)` and `alerts()` use its HTTP API."""

    def __init__(self, workdir: Path, targets: list[str], rule_files: list[Path]) -> None:
        self.workdir = workdir
        self.targets = targets
        self.rule_files = rule_files
        self.address = ""
        self._proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> PrometheusServer:
        binary = shutil.which("prometheus")
        if binary is None:
            raise RuntimeError(f"no prometheus binary: {APT_HINT}")
        config = self.workdir / "prometheus.yml"
        config.write_text(json.dumps({  # JSON is YAML
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(p) for p in self.rule_files],
            "scrape_configs": [{"job_name": "node", "static_configs": [{"targets": self.targets}]}],
        }))
        for _ in range(3):  # the port can be taken between free_port() and the bind
            self.address = f"127.0.0.1:{free_port()}"
            log = open(self.workdir / "prometheus.log", "wb")
            self._proc = subprocess.Popen(
                [binary, f"--config.file={config}", f"--web.listen-address={self.address}",
                 f"--storage.tsdb.path={self.workdir / 'data'}"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
            log.close()
            if self._wait_ready():
                return self
            self.__exit__()
        log_text = (self.workdir / "prometheus.log").read_text()
        raise RuntimeError("prometheus did not start:\n" + log_text[-3000:])

    def _wait_ready(self, timeout: float = 30.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self._proc is not None and self._proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://{self.address}/-/ready", timeout=2) as resp:
                    if resp.status == 200:
                        return True
            except OSError:
                pass
            time.sleep(0.2)
        return False

    def _get(self, path: str, **params: str) -> Any:
        url = f"http://{self.address}{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                body = json.loads(resp.read())
        except urllib.error.HTTPError as exc:  # a bad query: 400 with the parser's message
            body = json.loads(exc.read() or b"{}")
        if body.get("status") != "success":
            raise AssertionError(f"{path} {params}: {body}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        return self._get("/api/v1/query", query=expr)["result"]

    def alerts(self) -> list[dict[str, Any]]:
        return self._get("/api/v1/alerts")["alerts"]

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(15)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
