"""Fixtures shared by tests/e2e and tests/image: podman and the image built from our Dockerfile.

A missing podman fails these tests with the line saying how to install it (``make e2e``
does); nothing is skipped.
"""

from __future__ import annotations

import pytest

from tools.imagebuild.image import BuiltImage, shared_image
from tools.imagebuild.podman import Podman, PodmanMissing


@pytest.fixture(scope="session")
def podman() -> Podman:
    try:
        return Podman()
    except PodmanMissing as err:
        pytest.fail(str(err), pytrace=False)


@pytest.fixture(scope="session")
def image(podman: Podman) -> BuiltImage:
    return shared_image(podman)
