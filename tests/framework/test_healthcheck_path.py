"""The health-check path (`python -m checks --level quick`, what Slurm's HealthCheckProgram runs)
imports neither torch nor numpy, in the CLI process or in the worker that runs the checks:
`-X importtime` lists every module any process of the run imported."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = re.compile(r"^import time:\s+\d+ \|\s+\d+ \|\s+(torch|numpy)$", re.MULTILINE)


def quick_run(*argv: str) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, "-X", "importtime", "-m", "checks", "--level", "quick",
                           "--json", "-", "--quiet", *argv],
                          env={**os.environ, "PYTHONPATH": path}, capture_output=True, text=True,
                          timeout=120, check=False)


def test_a_quick_run_of_a_healthy_scenario_imports_no_torch_and_no_numpy() -> None:
    proc = quick_run("--simulate", "h100-sxm-8x-healthy")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "import time:" in proc.stderr and "checks.node.watchdog" in proc.stderr
    assert HEAVY.findall(proc.stderr) == []
    assert '"torch": "2.' in proc.stdout  # the report still names torch's version (scenario's)


def test_the_cli_process_itself_has_no_torch_after_a_quick_run() -> None:
    code = ("import sys; from checks.node import node_cli; "
            "rc = node_cli.main(['--level', 'quick', '--simulate', 'cpu-only-healthy', "
            "'--no-json', '--quiet']); "
            "print(rc, 'torch' in sys.modules, 'numpy' in sys.modules)")
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": path},
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.stdout.split() == ["0", "False", "False"], proc.stderr[-2000:]


@pytest.mark.skipif(Path("/proc/driver/nvidia").exists(),
                    reason="with NVIDIA GPUs, gpu-count, cuda-compat and torch-arch ask torch")
def test_a_real_quick_run_on_a_host_without_gpus_imports_no_torch() -> None:
    proc = quick_run()
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    assert HEAVY.findall(proc.stderr) == []
    # The report's torch version is read from torch/version.py, not by importing torch.
    assert re.search(r'"torch": "\d+\.\d+', proc.stdout), proc.stdout[-2000:]


def test_torch_build_is_read_without_importing_torch() -> None:
    code = ("import sys; from checks.hw.torchview import read_torch_build; "
            "v = read_torch_build(); imported = 'torch' in sys.modules; import torch; "
            "print(v == (torch.__version__, torch.version.cuda), imported)")
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": path},
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.stdout.split() == ["True", "False"], proc.stderr[-2000:]
