"""A local PEP 503 package index with every wheel the Dockerfile installs.

The image build then runs with ``--network none``: the Dockerfile's ``PIP_INDEX_URL`` and
``TORCH_INDEX_URL`` build args point at this index, bind-mounted into the build (what an
air-gapped cluster's mirror does). torch is the CPU wheel on local disk where there is one
(``../shared/wheels`` on this project's machines; PyPI's Linux torch is a ~3.5 GB CUDA build);
elsewhere it is PyPI's build of the Makefile's ``TORCH_SPEC``. Everything else is downloaded
once from PyPI by the host's pip.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

from tools.imagebuild.dockerfile import REPO, parse

# The base image's interpreter (Debian bookworm's python3, glibc 2.36): the wheels must fit it.
PYTHON_VERSION = "3.11"
CPYTHON_TAG = "cp" + PYTHON_VERSION.replace(".", "")  # cp311: the wheels' python and abi tag
BASE_GLIBC_MINOR = 36
# Every manylinux tag glibc 2.36 runs, best first, as pip inside the image would take them; a
# custom --platform is not widened by pip. PyPI's CUDA torch needs the old ones: its
# nvidia-nccl-cu13 is manylinux_2_18, nvidia-nvtx manylinux1 (2_5).
PLATFORMS = (*(f"manylinux_2_{minor}_x86_64" for minor in range(BASE_GLIBC_MINOR, 4, -1)),
             "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64")
PLATFORM_ARGS = ("--only-binary=:all:", "--python-version", PYTHON_VERSION, "--implementation",
                 "cp", "--abi", CPYTHON_TAG,
                 *(arg for platform in PLATFORMS for arg in ("--platform", platform)))
# Where the torch CPU wheel lies on these machines (E2E_WHEELS, os.pathsep-separated, first).
DEFAULT_WHEEL_DIRS = ("/opt/wheels", str(REPO.parent / "shared" / "wheels"),
                      str(REPO.parent / "shared" / "seed"))


class WheelIndexError(RuntimeError):
    """The local index could not be made (no torch wheel, a download failed)."""


def torch_wheel() -> Path | None:
    """The local torch CPU wheel for the base image's Python, or None where there is none."""
    dirs = [d for d in os.environ.get("E2E_WHEELS", "").split(os.pathsep) if d]
    dirs += DEFAULT_WHEEL_DIRS
    for directory in dirs:
        found = sorted(Path(directory).glob(f"torch-*+cpu-{CPYTHON_TAG}-{CPYTHON_TAG}-*x86_64.whl"))
        if found:
            return found[-1]
    return None


def torch_version(wheel: Path | None) -> str:
    """'2.13.0' from 'torch-2.13.0+cpu-cp311-...whl'; without a wheel, the Makefile's pin."""
    if wheel is not None:
        return wheel.name.split("-")[1].split("+")[0]
    pin = re.search(r"^TORCH_SPEC \?= torch==(\S+)$", (REPO / "Makefile").read_text(), re.M)
    if pin is None:
        raise WheelIndexError("no `TORCH_SPEC ?= torch==X` line in the Makefile "
                              "(fix: restore it; it is the torch version the tests run)")
    return pin.group(1)


def dockerfile_pins(torch: str) -> list[str]:
    """Every ``name==version`` the Dockerfile's RUN lines install, torch at `torch`."""
    pins: list[str] = []
    for stage in parse().stages:
        for run in stage.all("RUN"):
            words = run.args.replace('"', " ").split()
            pins += [w for w in words if re.fullmatch(r"[A-Za-z0-9._-]+==\S+", w)]
    return sorted({p.replace("${TORCH_VERSION}", torch) for p in pins})


def project_name(wheel_file: str) -> str:
    """PEP 503 normalized project name of a wheel file name."""
    return re.sub(r"[-_.]+", "-", wheel_file.split("-")[0]).lower()


def write_simple_index(root: Path) -> None:
    """``root/simple/<project>/index.html`` linking the wheels in ``root/files``."""
    projects: dict[str, list[str]] = {}
    for wheel in sorted((root / "files").glob("*.whl")):
        projects.setdefault(project_name(wheel.name), []).append(wheel.name)
    for name, files in projects.items():
        page = root / "simple" / name
        page.mkdir(parents=True, exist_ok=True)
        (page / "index.html").write_text(_html(f"../../files/{f}" for f in files))
    (root / "simple" / "index.html").write_text(_html(f"{n}/" for n in projects))


def _html(links: Iterable[str]) -> str:
    anchors = "".join(f'<a href="{link}">{link.rsplit("/", 1)[-1] or link}</a><br>\n'
                      for link in links)
    return f"<!DOCTYPE html>\n<html><body>\n{anchors}</body></html>\n"


def local_index(cache: Path) -> tuple[Path, str]:
    """(index root, torch version): made once per set of pins, reused after."""
    wheel = torch_wheel()
    torch = torch_version(wheel)
    pins = dockerfile_pins(torch)
    source = wheel.name if wheel is not None else "pypi"
    key = hashlib.sha256("\n".join([source, *pins, *PLATFORM_ARGS]).encode()).hexdigest()
    root = cache / f"index-{key[:16]}"
    if (root / ".complete").exists():
        return root, torch
    shutil.rmtree(root, ignore_errors=True)
    files = root / "files"
    files.mkdir(parents=True)
    if wheel is not None:
        # The local torch is already in `files`, so pip takes it from there (and only its
        # dependencies from PyPI) instead of resolving torch on PyPI.
        shutil.copy2(wheel, files / wheel.name)
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
               *PLATFORM_ARGS, "--find-links", str(files), "--dest", str(files), *pins]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
    if proc.returncode != 0:
        raise WheelIndexError(
            f"pip download of the Dockerfile's pins failed:\n{proc.stderr[-3000:]}")
    if wheel is not None and any(project_name(w.name).startswith("nvidia-")
                                 for w in files.glob("*.whl")):
        raise WheelIndexError("pip resolved a CUDA torch (nvidia-* wheels): the local CPU wheel "
                              f"{wheel} does not satisfy the pins {pins}")
    write_simple_index(root)
    (root / ".complete").write_text("\n".join(pins) + "\n")
    return root, torch
