"""`python tests/framework/hang_checks.py ARGS...`: `python -m checks ARGS...` with three more
checks that never finish, each with a 1 s timeout (tests/framework/test_watchdog.py):

- spin-forever: a pure-Python loop;
- regex-forever: a backtracking regex, one C call that holds the GIL (a thread-join timeout
  never gets to run);
- tree-then-hang: starts a helper process that starts a child of its own, then sleeps.

The helper tree's pids go to $HANG_CHECKS_PIDS (one per line) so the test can look for them.

- sleep-past-budget: a check whose own timeout (600 s) and budget estimate (1 s) both let it run,
  which then sleeps: only the run's deadline (--budget/--deadline) can stop it;
  after-the-sleeper: registered after it, so it is due once the deadline has passed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

from checks.model import Result, passed
from checks.node.context import Context
from checks.node.registry import Budget, Cost, check
from checks.supervise import procs

TIMEOUT_S = 1.0
# Estimated like a quick check: a --budget plan takes each, and only the deadline stops it.
BUDGET = Budget(value=5, cost=Cost(cpu=1, gpu=1), source="estimated")


@check("spin-forever", code="TST901", title="spins in Python forever", timeout_s=TIMEOUT_S, budget=BUDGET)
def spin_forever(_: Context) -> Result:
    n = 0
    while n >= 0:
        n += 1
    return passed("never")


@check("regex-forever", code="TST902", title="backtracks in one regex call forever",
       timeout_s=TIMEOUT_S, budget=BUDGET)
def regex_forever(_: Context) -> Result:
    re.match(r"(a|aa)+$", "a" * 64 + "b")  # 2^64 ways to fail, all inside one C call
    return passed("never")


@check("tree-then-hang", code="TST903", title="starts a process tree, then hangs",
       timeout_s=TIMEOUT_S, budget=BUDGET)
def tree_then_hang(_: Context) -> Result:
    helper = procs.start([sys.executable, "-c",
                          "import subprocess, sys, time; "
                          "c = subprocess.Popen(['sleep', '600']); "
                          "print(c.pid, flush=True); time.sleep(600)"],
                         stdout=subprocess.PIPE, text=True)
    grandchild = helper.stdout.readline().strip()  # type: ignore[union-attr]
    with open(os.environ["HANG_CHECKS_PIDS"], "w") as out:
        out.write(f"{helper.pid}\n{grandchild}\n")
    time.sleep(600)
    return passed("never")


@check("sleep-past-budget", code="TST904", title="sleeps past the run's budget", timeout_s=600, budget=BUDGET)
def sleep_past_budget(_: Context) -> Result:
    time.sleep(600)
    return passed("never")


@check("after-the-sleeper", code="TST905", title="runs after sleep-past-budget", timeout_s=5, budget=BUDGET)
def after_the_sleeper(_: Context) -> Result:
    return passed("ran")


if __name__ == "__main__":
    procs.exit_on_signals()
    from checks.node.node_cli import main

    sys.exit(main(sys.argv[1:]))
