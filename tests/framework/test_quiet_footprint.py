"""A quiet run (`-q`: the Slurm health check, cron) shows neither rich's table nor its progress,
so it does not import rich (~3 MB resident and ~30 ms of imports on every node, every interval).
A run that shows them still does. Neither loads the profile schema's validator for the shipped,
unchanged profiles (~4.5 MB)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBE = ("import sys; from checks.node import node_cli; "
         "rc = node_cli.main(sys.argv[1:]); "
         "print('RICH' if any(m == 'rich' or m.startswith('rich.') for m in sys.modules) else 'PLAIN', "
         "rc, 'jsonschema_rs' in sys.modules, file=sys.stderr)")


@pytest.mark.parametrize("quiet,expected", [(True, "PLAIN"), (False, "RICH")])
def test_a_quiet_run_does_not_import_rich(quiet, expected, tmp_path):
    argv = ["--simulate", "h100-sxm-8x-healthy", "--level", "quick", "--json", str(tmp_path / "r.json")]
    r = subprocess.run([sys.executable, "-c", PROBE, *argv, *(["-q"] if quiet else [])], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    last = r.stderr.strip().splitlines()[-1]
    # ... nor the profile schema's validator: the shipped profiles are the texts the tests
    # validated (checks/schema/profile-digests.json). Quick level: ~28 MB resident, was ~36.
    assert last == f"{expected} 0 False", r.stderr
    assert (tmp_path / "r.json").is_file()


def test_a_quiet_list_and_a_quiet_usage_error_still_print(tmp_path):
    r = subprocess.run([sys.executable, "-m", "checks", "--list", "-q", "--level", "quick"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "gpu-count" in r.stdout
    r = subprocess.run([sys.executable, "-m", "checks", "-q", "--only", "gpu-cout"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.strip().startswith("error: --only: unknown check id")
