"""The bad-input lines the ranks of ``ddp-trainer run`` left for their launcher: one line for
all the ranks that say the same, a rank's own line when it alone says it.

Every rank checks its input alone, before the rendezvous (trainer/ranks/runner.py), so a bad
dataset failed on each of them with the same line: eight copies on an 8-GPU pod. The ranks
record the line in their torch elastic error file without printing it
(:func:`trainer.termination.report`), and the launcher prints it here once it has them all.
"""

from __future__ import annotations

import re
import sys

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

from trainer import termination

_PREFIX = re.compile(r"^\[rank \d+\] ")


def print_deferred(err: ChildFailedError) -> None:
    """Print each distinct deferred line once: without the rank's prefix when several ranks
    left it, as the rank wrote it when only one did; in the order of the first rank to say it."""
    said: dict[str, list[str]] = {}
    for _, failure in sorted(err.failures.items()):
        line = termination.unprinted_of(failure.error_file_data)
        if line is not None:
            said.setdefault(_PREFIX.sub("", line), []).append(line)
    for text, lines in said.items():
        sys.stderr.write((text if len(lines) > 1 else lines[0]) + "\n")
    sys.stderr.flush()
