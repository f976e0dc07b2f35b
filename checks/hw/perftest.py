"""perftest's `ib_write_bw`: find it, run it on one NIC (with a GPU buffer: --use_cuda), and read
its report. The only module that starts perftest; the check (checks/node/suite/rdma_bw.py) judges.

One measurement is a loopback on one RDMA device: a server and a client `ib_write_bw -d <nic>`
on this host, the client connecting to 127.0.0.1 (perftest's own run_perftest_loopback does the
same). RDMA writes then go GPU (or host) memory -> NIC -> NIC -> memory: the GPU-NIC PCIe path,
GPUDirect and the HCA itself, not the cable (the per-rail cross-host runs test cables and
switches). Each run is bounded in time and its processes are killed when it ends.

Output read (perftest 4.x-6.x; quoted in linux-rdma/perftest#273, #234, #241, #65):

    ---------------------------------------------------------------------------------------
     #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]
     1048576    26420            0.00               369.52             0.044052
    ---------------------------------------------------------------------------------------

With --report_gbits the unit is Gb/sec, without it MB/sec (MiB: 2^20 bytes). In duration mode
(-D) the peak column is 0.00 ("BW peak won't be measured in this run"): only the average counts.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from checks.supervise import procs

TOOL = "ib_write_bw"
HEADER = re.compile(r"#bytes\s+#iterations\s+BW peak\[(?P<unit>[A-Za-z]+/sec)\]\s+"
                    r"BW average\[(?P<unit2>[A-Za-z]+/sec)\]")
# bytes, iterations, peak, average, then message rate (and per-port columns in dual-port mode)
ROW = re.compile(r"^\s*(?P<bytes>\d+)\s+(?P<iters>\d+)\s+(?P<peak>[\d.]+)\s+(?P<avg>[\d.]+)"
                 r"(?:\s+[\d.]+)*\s*$")
# MB/sec in perftest is MiB/s (2^20 bytes); Gb/sec is 10^9 bits.
TO_GBPS = {"Gb/sec": 1.0, "MB/sec": 1048576 * 8 / 1e9}
# What perftest prints when it cannot run at all (perftest's own messages).
TOOL_ERRORS = ("Did not detect devices", "Unable to find the Infiniband/RoCE device",
               "Couldn't connect to", "Unable to open file descriptor for socket connection",
               "Failed to create QP", "Couldn't allocate MR", "CUDA DMA-BUF cannot be used",
               "Parser function exited")
CONNECT_RETRY = ("Couldn't connect to", "Unable to open file descriptor for socket connection")


@dataclass(frozen=True)
class WriteBw:
    """One ib_write_bw report: the last data row (the largest message of an -a sweep)."""

    bytes: int
    iterations: int
    peak_gbps: float
    average_gbps: float
    unit: str  # the unit perftest printed: "Gb/sec" or "MB/sec"


class PerftestOutputError(ValueError):
    """The output holds no bandwidth row; the message says what perftest said instead."""


def parse_write_bw(text: str) -> WriteBw:
    """The bandwidth row of ib_write_bw output; PerftestOutputError (naming perftest's own error
    line when there is one) when there is none."""
    unit = None
    rows: list[re.Match[str]] = []
    for line in text.splitlines():
        if (header := HEADER.search(line)) is not None:
            unit = header["unit2"]
            rows = []
        elif unit is not None and (row := ROW.match(line)) is not None:
            rows.append(row)
    if unit is None or not rows:
        said = next((line.strip() for line in text.splitlines()
                     if any(e in line for e in TOOL_ERRORS)), None)
        raise PerftestOutputError(said or ("no bandwidth table in the ib_write_bw output"
                                           if unit is None else "a bandwidth header but no row"))
    if unit not in TO_GBPS:
        raise PerftestOutputError(f"unknown bandwidth unit {unit!r}")
    last = rows[-1]
    factor = TO_GBPS[unit]
    return WriteBw(int(last["bytes"]), int(last["iters"]), float(last["peak"]) * factor,
                   float(last["avg"]) * factor, unit)


def tool_info() -> dict[str, Any] | None:
    """{"path", "cuda"} for the installed ib_write_bw, None when perftest is not installed.
    `cuda`: built with CUDA (its --help lists --use_cuda; Debian's and Ubuntu's builds do not)."""
    path = shutil.which(TOOL)
    if path is None:
        return None
    try:
        proc = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=10,
                              check=False)
        text = proc.stdout + proc.stderr
    except (OSError, subprocess.TimeoutExpired):
        text = ""
    return {"path": path, "cuda": "--use_cuda" in text}


def command(nic: str, port: int, *, gpu: int | None, size: int, duration_s: int,
            server: str | None = None) -> list[str]:
    argv = [TOOL, "-d", nic, "-p", str(port), "-s", str(size), "-D", str(duration_s), "-F",
            "--report_gbits"]
    if gpu is not None:
        argv.append(f"--use_cuda={gpu}")
    return argv + ([server] if server else [])


def loopback_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment of both ib_write_bw processes: CUDA numbers devices in PCI bus order
    (CUDA_DEVICE_ORDER=PCI_BUS_ID) and the caller's CUDA_VISIBLE_DEVICES is dropped, so an
    ordinal from cuda_ordinal names the same GPU for server and client."""
    env = {k: v for k, v in environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    return env


def cuda_ordinal(gpu_pci: str, cuda_pcis: list[str]) -> int | None:
    """The N of `--use_cuda=N` for the GPU at `gpu_pci`: perftest hands N to cuDeviceGet, whose
    ordinals (with loopback_env) are the GPUs the driver gives this process, in PCI bus order.
    That is the GPU's rank among `cuda_pcis` (NVML's GPUs: in a container only its own), not its
    index among every GPU on the host's PCI bus nor its ordinal under CUDA_VISIBLE_DEVICES.
    None when CUDA cannot see the GPU here."""
    ordered = sorted(p.lower() for p in cuda_pcis if p)
    try:
        return ordered.index(gpu_pci.lower())
    except ValueError:
        return None


def run_loopback(nic: str, *, gpu: int | None = None, server_gpu: int | None = None,
                 port: int = 18515, size: int = 1 << 20, duration_s: int = 5,
                 timeout_s: float = 60.0) -> dict[str, Any]:
    """One loopback measurement on `nic`: {"argv", "returncode", "output", "server_output",
    "timed_out"}. Never raises for what perftest does; the caller parses `output`. The client's
    buffer is on CUDA GPU `gpu`, the server's on `server_gpu` (default: the same GPU; another
    where the GPU is in compute mode EXCLUSIVE_PROCESS, which admits one process's context)."""
    env = loopback_env(os.environ)  # --use_cuda N: the N-th GPU of this process, PCI order
    server_argv = command(nic, port, gpu=gpu if server_gpu is None else server_gpu, size=size,
                          duration_s=duration_s)
    client_argv = command(nic, port, gpu=gpu, size=size, duration_s=duration_s,
                          server="127.0.0.1")
    deadline = time.monotonic() + timeout_s
    # procs.start: the server dies with this process and is killed below on every way out.
    server = procs.start(server_argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, env=env)
    client_out, code, timed_out = "", None, False
    try:
        for _ in range(10):  # the server needs a moment to listen
            time.sleep(0.5)
            left = deadline - time.monotonic()
            if left <= 0 or server.poll() is not None:
                break
            try:
                proc = procs.run(client_argv, text=True, env=env, timeout_s=left)
            except subprocess.TimeoutExpired as exc:
                client_out, timed_out = _text(exc.stdout) + _text(exc.stderr), True
                break
            client_out, code = proc.stdout + proc.stderr, proc.returncode
            if code == 0 or not any(m in client_out for m in CONNECT_RETRY):
                break
    except BaseException:  # SIGINT/SIGTERM (procs.Terminated) or a bug: no waiting
        procs.kill_tree(server)
        raise
    if server.poll() is None:
        try:
            server.wait(timeout=max(1.0, min(10.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            procs.kill_tree(server)
    server_out = server.communicate()[0] or ""
    procs.kill_tree(server)
    if code is None and not timed_out:
        # The server ended before a client could run (no such device, port taken): what it said
        # is the measurement's outcome.
        return {"argv": server_argv, "returncode": server.returncode, "output": server_out,
                "server_output": server_out, "timed_out": False}
    return {"argv": client_argv, "returncode": code, "output": client_out,
            "server_output": server_out, "timed_out": timed_out}


def _text(raw: bytes | str | None) -> str:
    if raw is None:
        return ""
    return raw.decode(errors="replace") if isinstance(raw, bytes) else raw
