"""Fixtures of the end-to-end tests (podman and image: tests/e2e/fixtures.py)."""

from __future__ import annotations

from tests.e2e.fixtures import image, podman

__all__ = ["image", "podman"]
