import sys

from checks.fleet.fleet_cli import main

sys.exit(main())
