"""`python -m trainer` is the same as the `ddp-trainer` console script."""

import sys

from trainer.cli import main

if __name__ == "__main__":  # not when a worker process imports it as its main module
    sys.exit(main())
