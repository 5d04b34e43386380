"""The e2e image's local wheel index takes wheels the base image runs, wherever torch comes from.

Where no local CPU wheel lies (a machine without ``../shared/wheels``), the index takes PyPI's
torch, whose CUDA dependencies are tagged as old as manylinux1; a platform list that missed
one of them failed `make test` there ("No matching distribution found for
nvidia-nccl-cu13==2.29.7", a manylinux_2_18 wheel).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tools.imagebuild.image import SUITE, base_image
from tools.imagebuild.podman import Podman
from tools.imagebuild.wheels import BASE_GLIBC_MINOR, PLATFORM_ARGS, dockerfile_pins, torch_version


def test_pypis_torch_and_every_pin_resolve_for_the_base_images_platform(tmp_path: Path) -> None:
    # What the index downloads without a local torch wheel, resolved from PyPI's metadata only.
    pins = dockerfile_pins(torch_version(None))
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
         "--disable-pip-version-check", *PLATFORM_ARGS, "--target", str(tmp_path / "never"),
         "--report", str(report), *pins],
        capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    resolved = {item["metadata"]["name"] for item in json.loads(report.read_text())["install"]}
    assert {"torch", "nvidia-nccl-cu13", "nvidia-nvtx"} <= resolved, sorted(resolved)


def test_the_platforms_stop_at_the_base_images_glibc(podman: Podman) -> None:
    glibc = podman.run("run", "--rm", "--network", "none", base_image(podman),
                       "getconf", "GNU_LIBC_VERSION").stdout.strip()
    assert glibc == f"glibc 2.{BASE_GLIBC_MINOR}", SUITE
    assert f"manylinux_2_{BASE_GLIBC_MINOR}_x86_64" in PLATFORM_ARGS
    assert f"manylinux_2_{BASE_GLIBC_MINOR + 1}_x86_64" not in PLATFORM_ARGS
