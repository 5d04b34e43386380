"""Fixtures of the Helm chart tests: the real helm 3 and helm 4 binaries (from `make tools`)."""

from __future__ import annotations

import subprocess

import pytest

from .chartlib import find_tool


def _helm(name: str, major: str) -> str:
    """The Helm binary `name`, checked to be Helm `major` (e.g. "v4")."""
    path = find_tool(name)
    out = subprocess.run(
        [path, "version", "--short"], capture_output=True, text=True, check=True
    ).stdout
    if not out.startswith(f"{major}."):
        pytest.fail(f"`{path}` is {out.strip()}, not Helm {major[1:]}: run `make tools`",
                    pytrace=False)
    return path


@pytest.fixture(scope="session")
def helm4() -> str:
    return _helm("helm", "v4")


@pytest.fixture(scope="session")
def helm3() -> str:
    return _helm("helm3", "v3")


@pytest.fixture(scope="session")
def helms(helm3: str, helm4: str) -> dict[str, str]:
    return {"helm3": helm3, "helm4": helm4}
