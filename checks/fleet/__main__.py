import sys

if sys.argv[1:2] == ["history"]:  # repair the run history (checks.fleet.history_repair)
    from checks.fleet.history_repair import main as repair

    sys.exit(repair(sys.argv[2:]))

from checks.fleet.fleet_cli import main

sys.exit(main())
