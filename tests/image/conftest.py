"""The built-image tests use the end-to-end fixtures (tests/e2e/fixtures.py)."""

from tests.e2e.fixtures import image, podman

__all__ = ["image", "podman"]
