"""containerd's pod network namespaces under /run/netns, made shared before the first one and
removed by `down` even where a later bind mount hides them.

`ip netns add` (a further node's namespace, tools/cluster/nodes.py) bind-mounts /run/netns on
itself the first time it finds it is no mount point. A pod's namespace that containerd mounted
there before (a node-1 pod started first) is then under that bind: /run/netns/cni-... shows a
plain file, `umount` says "not mounted", and unlinking it fails with EBUSY, its mount point in
the parent mount. The kubelet of the next cluster, given the old sandbox from etcd, then fails
for ever with `remove netns: unlinkat ...: device or resource busy` (stop 48's CI: the
Prometheus pod never became Ready). So `up` makes /run/netns a shared mount of its own before
anything runs, as iproute2 would, and `down` lifts such a bind to reach what it hides.
"""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path

NETNS = Path("/run/netns")


def _mounts() -> list[tuple[str, str, str]]:
    """(root, mount point, filesystem type) of each mount, in mount order."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        sep = fields.index("-")
        out.append((fields[3], fields[4], fields[sep + 1]))
    return out


def _is_mount_point() -> bool:
    return any(point == str(NETNS) for _, point, _ in _mounts())


def share() -> None:
    """/run/netns a shared bind mount of itself (iproute2's own setup), before any pod's."""
    NETNS.mkdir(parents=True, exist_ok=True)
    if not _is_mount_point():
        subprocess.run(["mount", "--bind", str(NETNS), str(NETNS)], capture_output=True,
                       check=False)
    subprocess.run(["mount", "--make-shared", str(NETNS)], capture_output=True, check=False)


def pod_namespaces() -> list[str]:
    """Mount points of containerd's pod namespaces, hidden ones included."""
    return sorted({point for _, point, fstype in _mounts()
                   if fstype == "nsfs" and point.startswith(f"{NETNS}/cni-")})


def _remove(path: Path) -> None:
    # a namespace is mounted once per mount namespace it propagated to: unmount until free
    for _ in range(8):
        if subprocess.run(["umount", str(path)], capture_output=True,
                          check=False).returncode != 0:
            break
    with contextlib.suppress(OSError):
        path.unlink(missing_ok=True)


def remove_pods() -> None:
    """Every pod namespace: unmounted and its file removed; where a bind of /run/netns hides
    one, the bind is lifted (lazily: a further node's namespace on it goes with `down`)."""
    for path in sorted(set(NETNS.glob("cni-*")) | {Path(p) for p in pod_namespaces()}):
        _remove(path)
    hidden = pod_namespaces()
    if hidden and any(root == str(NETNS) and point == str(NETNS)
                      for root, point, _ in _mounts()):
        subprocess.run(["umount", "-l", str(NETNS)], capture_output=True, check=False)
        for path in hidden:
            _remove(Path(path))
