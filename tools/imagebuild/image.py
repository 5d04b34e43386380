"""The trainer image, built by podman from our Dockerfile on a locally made Debian base.

No registry can be pulled here, so the base (``PYTHON_IMAGE``) is Debian bookworm made with
``debootstrap --variant=minbase`` and ``podman import``: Debian's python3 (3.11, matching the
local cp311 torch wheel) in a venv at /opt/python, which is first on ``PATH`` as in the
official python images. The build is the CPU variant, air-gapped (``--network none``) with
the local wheel index of :mod:`.wheels`.

Both images are cached in podman's storage under tags that hash their inputs: the base by
its recipe, the trainer image by the Dockerfile, the build context, the base and the build
args, so a rerun on the same machine reuses them and any change rebuilds.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tools.imagebuild.dockerfile import REPO
from tools.imagebuild.podman import Podman, PodmanError
from tools.imagebuild.wheels import local_index

CACHE = Path(os.environ.get("E2E_CACHE", str(REPO / ".cache" / "e2e")))
BASE_REPOSITORY = "localhost/ddp-trainer-e2e/base"
IMAGE_REPOSITORY = "localhost/ddp-trainer-e2e/trainer"
KEEP_IMAGES = 2  # older trainer images are removed after a build (~1.3 GB each)

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
# python3-venv brings ensurepip (pip 23); passwd has the Dockerfile's groupadd/useradd.
PACKAGES = ("python3", "python3-venv", "passwd")
PYTHON_PREFIX = "/opt/python"
PATH = f"{PYTHON_PREFIX}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class ImageBuildError(RuntimeError):
    """The base or the trainer image could not be built; the message has the log tail."""


@dataclass(frozen=True)
class BuiltImage:
    ref: str
    version: str
    size_bytes: int
    build_seconds: float  # 0.0 when the cached image was reused


def digest(*parts: str | bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode() if isinstance(part, str) else part)
        h.update(b"\0")
    return h.hexdigest()


def package_version() -> str:
    for line in (REPO / "trainer" / "__init__.py").read_text().splitlines():
        if line.startswith("__version__"):
            return line.split("=", 1)[1].strip().strip("\"'")
    raise ImageBuildError("trainer/__init__.py has no __version__")


def base_image(podman: Podman, cache: Path = CACHE) -> str:
    """The local Debian + Python base; built once (about a minute, needs root)."""
    ref = f"{BASE_REPOSITORY}:{SUITE}-{digest(SUITE, MIRROR, *PACKAGES, PATH)[:12]}"
    if podman.image_exists(ref):
        return ref
    if os.geteuid() != 0 or not shutil.which("debootstrap"):
        raise ImageBuildError(f"building the base image {ref} needs root and debootstrap "
                              "(fix: run `make e2e` as root; it installs debootstrap)")
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix="rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        _run(["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE,
              str(rootfs), MIRROR], "debootstrap")
        _run(["chroot", str(rootfs), "/usr/bin/python3", "-m", "venv", PYTHON_PREFIX], "venv")
        for leftover in ("var/cache/apt", "var/lib/apt/lists"):
            for path in (rootfs / leftover).glob("*"):
                if path.is_file():
                    path.unlink()
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        imported = subprocess.run(
            [podman.binary, "import", "--change", f"ENV PATH={PATH}",
             "--change", 'CMD ["/bin/bash"]', "-", ref],
            stdin=tar.stdout, capture_output=True, text=True, env=podman.env, check=False)
        tar.wait()
        if imported.returncode != 0 or tar.returncode != 0:
            raise ImageBuildError(f"podman import of {ref} failed: {imported.stderr[-2000:]}")
    return ref


def context_files() -> list[Path]:
    """The files the build context lets in (the .dockerignore allow-list, minus caches)."""
    allowed = [line[1:].strip().rstrip("/") for line in
               (REPO / ".dockerignore").read_text().splitlines() if line.startswith("!")]
    files: list[Path] = []
    for entry in allowed:
        path = REPO / entry
        candidates = sorted(path.rglob("*")) if path.is_dir() else [path]
        files += [p for p in candidates if p.is_file() and "__pycache__" not in p.parts
                  and p.suffix not in (".pyc", ".pyo", ".pyd")]
    return files


@contextmanager
def _building(cache: Path) -> Iterator[None]:
    """One build at a time on this machine: `make test` builds the image for the cluster
    while the e2e and image tests, in other processes, need it too; the later ones wait
    and find it built."""
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / "build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def trainer_image(podman: Podman, cache: Path = CACHE) -> BuiltImage:
    """The CPU image of this checkout (built when its inputs changed, else reused)."""
    with _building(cache):
        return _trainer_image(podman, cache)


def _trainer_image(podman: Podman, cache: Path) -> BuiltImage:
    base = base_image(podman, cache)
    index, torch = local_index(cache)
    version = package_version()
    build_args = {"VARIANT": "cpu", "PYTHON_IMAGE": base, "PYTORCH_IMAGE": base,
                  "PIP_INDEX_URL": "file:///index/simple",
                  "TORCH_INDEX_URL": "file:///index/simple",
                  "TORCH_VERSION": torch, "VERSION": version}
    inputs = [REPO / "Dockerfile", REPO / ".dockerignore", *context_files()]
    key = digest(podman.image_inspect(base)["Id"], index.name,
                 *[f"{k}={v}" for k, v in sorted(build_args.items())],
                 *[str(p.relative_to(REPO)) + "\0" + p.read_text(errors="replace")
                   for p in inputs])
    ref = f"{IMAGE_REPOSITORY}:{key[:16]}"
    seconds = 0.0
    if not podman.image_exists(ref):
        started = time.monotonic()
        # --layers=false: buildah 1.28 (podman 4.3) keys a RUN's layer cache on the
        # instruction alone, not on the stage it bind-mounts, so a cached runtime stage
        # would keep installing the previous wheel. The image itself is cached by its key.
        args = ["build", "--format", "docker", "--layers=false", "--network", "none",
                "--volume", f"{index}:/index:ro", "--file", str(REPO / "Dockerfile"),
                "--tag", ref]
        for name, value in build_args.items():
            args += ["--build-arg", f"{name}={value}"]
        try:
            podman.run(*args, str(REPO), timeout=1800)
        except PodmanError as err:
            raise ImageBuildError(f"podman build of the Dockerfile failed: {err}") from err
        seconds = time.monotonic() - started
        _forget_old_builds(podman, keep=ref)
    size = int(podman.image_inspect(ref)["Size"])
    return BuiltImage(ref, version, size, seconds)


def _forget_old_builds(podman: Podman, keep: str) -> None:
    """Untag all but the newest builds; an image still used by a container stays."""
    names = [n for row in podman.images(IMAGE_REPOSITORY) for n in row.get("Names") or []
             if n.startswith(IMAGE_REPOSITORY + ":") and n != keep]
    for ref in names[KEEP_IMAGES - 1:]:
        podman.run("rmi", ref, check=False)


def _run(command: list[str], what: str) -> None:
    proc = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
    if proc.returncode != 0:
        raise ImageBuildError(f"{what} failed ({' '.join(command)}):\n"
                              f"{(proc.stdout + proc.stderr)[-3000:]}")


_built: dict[str, BuiltImage] = {}


def shared_image(podman: Podman) -> BuiltImage:
    """:func:`trainer_image`, once per test session (tests/image and tests/e2e share it)."""
    if "image" not in _built:
        _built["image"] = trainer_image(podman)
    return _built["image"]
