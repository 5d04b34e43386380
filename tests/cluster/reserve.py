"""How `make test` shares the cluster between the two-node tests and the other cluster tests,
which run at the same time (tools/run-tests.sh):

* the second node is reserved for the two-node tests by a NoSchedule taint that only their pods
  tolerate, applied before any other test runs (`python -m tests.cluster.reserve`, right after
  `up --nodes 2`), so the other tests' pods stay on the first node, which no test takes down;
* the tests marked `alone` restart the API server or an operator, which every test talks to:
  they take this file lock exclusively, and the two-node module holds it shared while it runs.
"""

from __future__ import annotations

import fcntl
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tests.cluster.kube import KUBECTL, REPO, STATE

SECOND = "ddp-node-2"
TAINT = "ddp-trainer.test/two-node-tests"
TOLERATION: dict[str, Any] = {"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}
LOCK = REPO / ".cache" / "cluster-tests.lock"


def reserve_command() -> list[str]:
    """kubectl's taint of the second node (idempotent)."""
    return [str(KUBECTL), "--kubeconfig", str(STATE / "kubeconfig"), "taint", "node", SECOND,
            f"{TAINT}=only:NoSchedule", "--overwrite"]


@contextmanager
def holding(exclusive: bool) -> Iterator[None]:
    LOCK.parent.mkdir(parents=True, exist_ok=True)
    with LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield


if __name__ == "__main__":
    import subprocess

    sys.exit(subprocess.run(reserve_command(), check=False).returncode)
