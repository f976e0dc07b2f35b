"""`python -m checks.supervise.guard MODULE ARGS...`: run `python -m MODULE ARGS...` so that it
dies with its parent.

torchrun starts each rank in a session of its own; if torchrun is killed (SIGKILL, or the kernel
killing it because the `python -m checks` above it died), nothing would stop its ranks. The
launcher therefore runs torchrun (or forkrun, one host's launcher), and torchrun every rank,
through this module: it sets
PR_SET_PDEATHSIG (SIGKILL) before importing anything heavy, exits at once when its parent is
already gone, and tells its own children which pid to expect as their parent.
"""

from __future__ import annotations

import os
import runpy
import signal
import sys

from checks.supervise.procs import ENV_PARENT, set_pdeathsig


def main() -> None:
    if len(sys.argv) < 2:
        print("usage: python -m checks.supervise.guard MODULE [ARGS...]", file=sys.stderr)
        sys.exit(2)
    set_pdeathsig(signal.SIGKILL)
    expected = os.environ.get(ENV_PARENT, "")
    if expected.isdigit() and os.getppid() != int(expected):
        sys.exit(1)  # the parent died before the signal was armed: nobody wants this process
    os.environ[ENV_PARENT] = str(os.getpid())
    module = sys.argv[1]
    sys.argv = [module, *sys.argv[2:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
