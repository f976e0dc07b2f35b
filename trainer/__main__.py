import os
import sys

from checks.supervise.procs import Terminated, exit_on_signals

# The supervising command turns SIGINT/SIGTERM/SIGHUP into an orderly exit (ranks killed, the
# workdir removed, exit 128 + signal). A rank under torchrun keeps the default: torchrun stops
# its survivors with SIGTERM and the supervisor reads that from the exit status.
if not {"RANK", "WORLD_SIZE", "LOCAL_RANK"} <= set(os.environ):
    exit_on_signals()
try:
    from trainer.trainer_cli import main
except Terminated as exc:  # a signal while importing: nothing started yet
    print(f"stopped by {exc.name}", file=sys.stderr)
    sys.exit(exc.exit_code)

sys.exit(main())
