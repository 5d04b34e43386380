"""`python -m trainer` is the same as the `ddp-trainer` console script."""

import sys

from trainer.cli import main

sys.exit(main())
