"""`make test` takes ARGS and TEST_JOBS from the user: neither is pasted into the shell, so a crafted
value runs nothing, while ARGS keeps a shell's quoting (`ARGS="-m 'not e2e'"`, as docs/testing.md
shows)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _make_test(*args: str) -> subprocess.CompletedProcess[str]:
    # -o: neither (re)build the venv nor install system packages from a test; TEST_JOBS=0: pytest
    # in one process. Run as an operator would, not as a sub-make of `make test`.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}
    return subprocess.run(["make", "--no-print-directory", "-C", str(ROOT), "-o", "system-deps",
                           "-o", ".venv/.stamp-run", "-o", ".venv/.stamp-dev", "test", *args],
                          capture_output=True, text=True, timeout=120, check=False, env=env)


@pytest.mark.parametrize("var", ["ARGS=--version;touch {p}", "ARGS=--version `touch {p}`",
                                 "ARGS=--version $$(touch {p})", "ARGS=--version\"; touch {p}; \"",
                                 "TEST_JOBS=2 --version;touch {p};true"])
def test_make_test_variables_run_nothing(var, tmp_path) -> None:
    marker = tmp_path / "p"
    extra = [] if var.startswith("TEST_JOBS") else ["TEST_JOBS=0"]
    _make_test(*extra, var.format(p=marker))
    assert not marker.exists()


def test_make_test_args_keep_shell_quoting() -> None:
    proc = _make_test("TEST_JOBS=0", f"ARGS=--co -q -m 'not e2e' {Path(__file__).relative_to(ROOT)}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "test_make_test_args_keep_shell_quoting" in proc.stdout


def test_make_test_args_with_an_open_quote_is_one_line() -> None:
    proc = _make_test("TEST_JOBS=0", "ARGS=-m 'not e2e")
    assert proc.returncode != 0
    ours = [line for line in proc.stderr.splitlines() if not line.startswith("make: ***")]
    assert ours == ["error: ARGS: No closing quotation"], proc.stderr


def test_make_test_runs_two_workers_by_default() -> None:
    """TEST_JOBS unset: two workers (an `export TEST_JOBS` above its `?=` default once made it
    empty, and `make test` died on `-n ''` before running a test)."""
    proc = _make_test("ARGS=tests/framework/test_lint_config.py")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "created: 2/2 workers" in proc.stdout, proc.stdout + proc.stderr


def _make(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}
    return subprocess.run(["make", "--no-print-directory", "-C", str(ROOT), *args],
                          capture_output=True, text=True, timeout=120, check=False, env=env)


@pytest.mark.parametrize("target", [["lint"], ["gpu-proof"], ["bench"],
                                    ["provision", "INVENTORY=inventory.example"]])
def test_a_crafted_venv_runs_nothing(target, tmp_path) -> None:
    """VENV reaches every recipe as "$VENV": a value with a command in it is a missing venv."""
    marker = tmp_path / "p"
    proc = _make(*target, f"VENV=.no-venv`touch {marker}`")
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert not marker.exists()


def test_python_and_torch_pin_are_not_pasted_into_the_venv_recipe(tmp_path) -> None:
    """-n prints the venv recipe without running it: the user's PYTHON and TORCH_PIN stay in the
    environment, out of the command line."""
    proc = _make("-n", "-W", "pyproject.toml", ".venv/.stamp-run",
                 f"PYTHON=python3; touch {tmp_path}/p", f"TORCH_PIN=torch; touch {tmp_path}/q")
    assert proc.returncode == 0, proc.stderr
    assert "touch" not in proc.stdout.replace("touch .venv/.stamp-run", ""), proc.stdout
