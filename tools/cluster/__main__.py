"""``python -m tools.cluster``: see :mod:`tools.cluster.cli`."""

import sys

from tools.cluster.cli import main

sys.exit(main())
