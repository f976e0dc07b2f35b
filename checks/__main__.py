import sys

from checks.supervise.procs import Terminated, exit_on_signals

exit_on_signals()  # SIGINT/SIGTERM/SIGHUP: kill the run's processes, exit 128 + signal
try:
    from checks.node.node_cli import main
except Terminated as exc:  # a signal while importing: nothing started yet
    print(f"stopped by {exc.name}", file=sys.stderr)
    sys.exit(exc.exit_code)

sys.exit(main())
