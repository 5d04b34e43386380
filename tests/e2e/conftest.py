"""Fixtures of the end-to-end tests (podman and image: tests/e2e/fixtures.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.fixtures import image, podman
from tests.e2e.harness.image import BuiltImage
from tests.e2e.harness.podman import Podman
from tests.e2e.scenario import Run, played, rendered
from tests.e2e.scrape import SCRAPE_VALUES

__all__ = ["default_run", "image", "podman"]


@pytest.fixture(scope="session")
def default_run(podman: Podman, image: BuiltImage) -> Iterator[Run]:
    """The chart's defaults (1 Master + 1 Worker, `ddp-trainer train` in each, CPU), played
    to the end while Prometheus scrapes it; kept until the session ends."""
    with played(podman, rendered(image, SCRAPE_VALUES), scrape=True) as run:
        yield run
