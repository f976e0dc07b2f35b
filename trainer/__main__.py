import sys

from trainer.trainer_cli import main

sys.exit(main())
