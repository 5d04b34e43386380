"""The images the cluster pulls, made locally and pushed to the cluster's registry with
podman; containerd then pulls them over HTTPS as a cluster pulls from any registry.

- pause: the pod sandbox, Debian's static catatonit in pause mode (podman's own pause image
  is made the same way);
- busybox: Debian's busybox-static, for local-path-provisioner's helper pods;
- prometheus, prometheus-config-reloader: built from their modules, for the Prometheus pod
  prometheus-operator makes;
- seaweedfs: the object-storage tests' `weed` (tools/s3server.py), for the cluster's S3 store
  (seaweedfs.py);
- ddp-trainer: the checkout's Dockerfile, built as the release builds it
  (tools/imagebuild/image.py: podman, a debootstrapped base, the local wheel index).
"""

from __future__ import annotations

import shutil
import tempfile
import urllib.request
from pathlib import Path

from tools.cluster.configs import HELPER_IMAGE, PAUSE_IMAGE
from tools.cluster.layout import REGISTRY, Paths
from tools.cluster.prometheus_stack import PROMETHEUS_IMAGE, RELOADER_IMAGE
from tools.cluster.seaweedfs import CONTAINERFILE as SEAWEEDFS_FILE
from tools.cluster.seaweedfs import image as seaweedfs_image
from tools.imagebuild.image import BuiltImage, trainer_image
from tools.imagebuild.podman import Podman

TRAINER_REPOSITORY = f"{REGISTRY}/ddp-trainer"

PAUSE_FILE = """FROM scratch
COPY catatonit /pause
USER 65535:65535
ENTRYPOINT ["/pause", "-P"]
"""
BUSYBOX_FILE = """FROM scratch
COPY busybox /bin/busybox
RUN ["/bin/busybox", "--install", "-s", "/bin"]
ENTRYPOINT ["/bin/sh"]
"""


def in_registry(paths: Paths, ref: str) -> bool:
    name, tag = ref.removeprefix(REGISTRY + "/").rsplit(":", 1)
    request = urllib.request.Request(
        f"https://{REGISTRY}/v2/{name}/manifests/{tag}", method="HEAD",
        headers={"Accept": "application/vnd.oci.image.manifest.v1+json, "
                           "application/vnd.docker.distribution.manifest.v2+json"})
    import ssl
    ctx = ssl.create_default_context(cafile=str(paths.pki / "ca.crt"))
    try:
        with urllib.request.urlopen(request, context=ctx, timeout=10) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def push(podman: Podman, paths: Paths, local: str, remote: str) -> None:
    certs = paths.config / "registry-certs"  # podman's --cert-dir: the CA as *.crt
    certs.mkdir(parents=True, exist_ok=True)
    shutil.copy2(paths.pki / "ca.crt", certs / "ca.crt")
    podman.run("push", "--cert-dir", str(certs), local, f"docker://{remote}", timeout=1200)


def _tiny(podman: Podman, paths: Paths, remote: str, containerfile: str,
          files: dict[str, Path]) -> None:
    if in_registry(paths, remote):
        return
    local = "localhost/ddp-trainer-cluster/" + remote.rsplit("/", 1)[1]
    with tempfile.TemporaryDirectory() as context:
        for name, source in files.items():
            shutil.copy2(source, Path(context) / name)
        (Path(context) / "Containerfile").write_text(containerfile)
        podman.run("build", "--network", "none", "--layers=false", "--tag", local, context)
    push(podman, paths, local, remote)
    # The registry now holds it. Kept, the tag would pass to the next `cluster up`'s build
    # and leave this one dangling: 115 MB per up, 107 images after a day of CI runs.
    podman.run("rmi", local)


def system_images(podman: Podman, paths: Paths) -> None:
    catatonit = shutil.which("catatonit") or "/usr/libexec/podman/catatonit"
    _tiny(podman, paths, PAUSE_IMAGE, PAUSE_FILE, {"catatonit": Path(catatonit)})
    _tiny(podman, paths, HELPER_IMAGE, BUSYBOX_FILE, {"busybox": Path("/bin/busybox")})


PROMETHEUS_FILE = """FROM scratch
COPY prometheus /bin/prometheus
USER 65534:65534
ENTRYPOINT ["/bin/prometheus"]
"""
RELOADER_FILE = """FROM scratch
COPY prometheus-config-reloader /bin/prometheus-config-reloader
USER 65534:65534
ENTRYPOINT ["/bin/prometheus-config-reloader"]
"""


def monitoring_images(podman: Podman, paths: Paths, bins: dict[str, Path]) -> None:
    """Prometheus and the operator's config reloader, both built here without cgo."""
    _tiny(podman, paths, PROMETHEUS_IMAGE, PROMETHEUS_FILE, {"prometheus": bins["prometheus"]})
    _tiny(podman, paths, RELOADER_IMAGE, RELOADER_FILE,
          {"prometheus-config-reloader": bins["prometheus-config-reloader"]})


def seaweedfs(podman: Podman, paths: Paths, weed: Path) -> str:
    """SeaweedFS's image, tagged by its build; its reference."""
    ref = seaweedfs_image(weed)
    _tiny(podman, paths, ref, SEAWEEDFS_FILE, {"weed": weed})
    return ref


def trainer(podman: Podman, paths: Paths) -> tuple[str, BuiltImage]:
    """(the image reference pods pull, the local build): one tag per build of the checkout."""
    built = trainer_image(podman)
    remote = f"{TRAINER_REPOSITORY}:{built.version}-{built.ref.rsplit(':', 1)[1]}"
    if not in_registry(paths, remote):
        push(podman, paths, built.ref, remote)
    return remote, built
