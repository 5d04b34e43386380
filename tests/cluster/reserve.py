"""The second node reserved for the two-node tests (tests/cluster/test_two_nodes.py): a
NoSchedule taint that only their pods tolerate, applied right after `up --nodes 2`
(`python -m tests.cluster.reserve`, tools/run-tests.sh), so that every other test's pods stay on
the first node, which no test takes down."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

from tests.cluster.kube import KUBECTL, STATE
from tools.cluster.layout import NODES

FIRST, SECOND = (node.name for node in NODES)
TAINT = "ddp-trainer.test/two-node-tests"
TOLERATION: dict[str, Any] = {"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}


def reserve_command() -> list[str]:
    """kubectl's taint of the second node (idempotent)."""
    return [str(KUBECTL), "--kubeconfig", str(STATE / "kubeconfig"), "taint", "node", SECOND,
            f"{TAINT}=only:NoSchedule", "--overwrite"]


if __name__ == "__main__":
    sys.exit(subprocess.run(reserve_command(), check=False).returncode)
