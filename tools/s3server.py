"""SeaweedFS's `weed`, the real S3 server of the object-storage tests (tests/support/s3.py),
built from the Go module pinned in tools/s3server/go.mod into the same per-version cache as
the cluster's components (tools/cluster/builds.py): a machine builds it once (docs/checkpoints.md
gives the cold build time).

    python -m tools.s3server    # build if needed; print the binary's path
"""

from __future__ import annotations

from pathlib import Path

from tools.cluster.builds import BuildError, Group, build
from tools.cluster.layout import Versions

MODULE = Path(__file__).resolve().parent / "s3server"
WEED = Group("seaweedfs", MODULE, (("weed", "github.com/seaweedfs/seaweedfs/weed"),), static=True)

__all__ = ["BuildError", "weed"]


def weed() -> Path:
    """The `weed` binary, built if this machine has not yet (BuildError with the command and
    the output's tail when it cannot be)."""
    return build(WEED, Versions.read()) / "weed"


if __name__ == "__main__":
    print(weed())
