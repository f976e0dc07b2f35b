import sys

from checks.node.node_cli import main

sys.exit(main())
