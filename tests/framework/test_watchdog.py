"""A check's timeout ends it, whatever it is stuck in: `python -m checks` runs the checks in a
worker process (checks/node/watchdog.py) that is killed, with everything it started, when a
check passes its timeout; the run goes on and the report is written."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from checks.hw.fixture import FixtureBackend, load_scenario
from checks.model import Result, Status, passed
from checks.node import registry, watchdog
from checks.node.context import Context, Options
from checks.profiles import load
from checks.supervise import procs

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def env_with_root(**extra: str) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, **extra}


@pytest.mark.timeout(120)
def test_stuck_checks_end_as_timed_out_and_the_others_are_reported(tmp_path: Path) -> None:
    pids = tmp_path / "helper-pids"
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, str(HERE / "hang_checks.py"), "--simulate", "cpu-only-healthy",
         "--only", "os-supported,spin-forever,regex-forever,tree-then-hang,shm-size",
         "--json", str(report), "--quiet"],
        env=env_with_root(HANG_CHECKS_PIDS=str(pids)), capture_output=True, text=True,
        timeout=110, check=False)
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(report.read_text())
    by_id = {c["id"]: c for c in doc["checks"]}
    assert set(by_id) == {"os-supported", "spin-forever", "regex-forever", "tree-then-hang",
                          "shm-size"}
    for stuck in ("spin-forever", "regex-forever", "tree-then-hang"):
        (result,) = by_id[stuck]["results"]
        assert by_id[stuck]["status"] == "ERROR"
        assert result["message"].startswith("timed out: did not finish within 1 s"), result
        assert result["fault_code"].endswith("-E")
    for fine in ("os-supported", "shm-size"):
        assert by_id[fine]["status"] in ("PASS", "WARN", "SKIP"), by_id[fine]
    # The helper the hung check started, and the helper's own child, went with the worker.
    helper_pids = [int(p) for p in pids.read_text().split()]
    assert len(helper_pids) == 2
    assert [p for p in helper_pids if procs.alive(p)] == []


@pytest.mark.timeout(120)
@pytest.mark.parametrize("flag", ["--budget", "--deadline"])
def test_the_budget_is_a_deadline_a_check_that_overruns_is_stopped(tmp_path: Path, flag: str) -> None:
    """The plan took every check (their estimates fit); one then runs past the budget. It is
    stopped at the deadline and reported so, the check after it is reported as not run, and the
    report is written, in about the budget's time (not the check's own 600 s timeout)."""
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, str(HERE / "hang_checks.py"), "--simulate", "cpu-only-healthy",
         "--only", "os-supported,sleep-past-budget,after-the-sleeper", flag, "6s",
         "--json", str(report), "--quiet"],
        env=env_with_root(), capture_output=True, text=True, timeout=110, check=False)
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(report.read_text())
    by_id = {c["id"]: c for c in doc["checks"]}
    assert by_id["os-supported"]["status"] == "PASS"
    (stopped,) = by_id["sleep-past-budget"]["results"]
    assert by_id["sleep-past-budget"]["status"] == "ERROR"
    assert stopped["message"].startswith(f"stopped at the run's deadline ({flag} 6 s)"), stopped
    (later,) = by_id["after-the-sleeper"]["results"]
    assert by_id["after-the-sleeper"]["status"] == "SKIP"
    assert later["message"] == f"not run: the run's deadline ({flag} 6 s) was reached before it could start"
    assert 5 <= doc["duration_s"] < 20


@pytest.fixture
def ctx() -> Context:
    return Context(FixtureBackend(load_scenario("cpu-only-healthy")), load("generic"), Options())


def make(id: str, func, **kw) -> registry.Check:  # type: ignore[no-untyped-def]
    return registry.Check(id=id, code="TST001", title=id, func=func, **kw)


def test_a_check_that_kills_its_worker_is_error_and_the_run_goes_on(ctx: Context) -> None:
    def die(_: Context) -> Result:
        os.kill(os.getpid(), signal.SIGKILL)
        return passed("never")

    seen: list[tuple[str, str | None]] = []
    outcomes = watchdog.run(
        [make("first", lambda _: passed("ok")), make("dies", die), make("after", lambda c: passed(
            f"ran after {sorted(c.outcomes)}"))], ctx,
        lambda chk, out: seen.append((chk.id, out and out.status.value)))
    assert [o.status for o in outcomes] == [Status.PASS, Status.ERROR, Status.PASS]
    assert "worker process running this check died (killed by SIGKILL)" in \
        outcomes[1].results[0].message
    # The next worker knows what ran before it (dependencies, blocked checks).
    assert outcomes[2].results[0].message == "ran after ['dies', 'first']"
    assert seen == [("first", None), ("first", "PASS"), ("dies", None), ("dies", "ERROR"),
                    ("after", None), ("after", "PASS")]


def test_blocked_and_failed_outcomes_cross_the_worker_boundary(ctx: Context) -> None:
    from checks.model import fail

    base = make("base", lambda _: fail("broken"))
    dependent = make("dependent", lambda _: passed("ran"), needs=("base",))
    outcomes = watchdog.run(registry.ordered([dependent, base]), ctx)
    assert [(o.id, o.status) for o in outcomes] == [("base", Status.FAIL),
                                                      ("dependent", Status.SKIP)]
    assert outcomes[0].results[0].fault_code == "TST001"
    assert ctx.outcomes["base"].status is Status.FAIL


EMBEDDED = """
import json, sys, torch
a = torch.randn(512, 512)
(a @ a).sum()  # the parent's OpenMP pool is running now
from checks.node import node_cli
code = node_cli.main(["--level", "standard", "--only", "gpu-matmul", "--json", sys.argv[1], "--quiet"])
print(json.dumps({"code": code}))
"""


@pytest.mark.timeout(180)
def test_a_worker_forked_from_a_process_that_ran_torch_computes(tmp_path: Path) -> None:
    """A program that ran torch before calling the suite (a test run, a notebook) forks the
    worker with torch's OpenMP pool started; libgomp is not fork-safe, and the worker hung in its
    first matmul until the check's timeout. It computes on one intra-op thread instead."""
    report = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-c", EMBEDDED, str(report)], env=env_with_root(),
                          capture_output=True, text=True, timeout=150, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (check,) = json.loads(report.read_text())["checks"]
    (result,) = check["results"]
    assert check["id"] == "gpu-matmul" and result["details"]["figures"]["cpu_matmul_fp32_gflops"] > 0, result
