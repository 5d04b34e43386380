"""Fixtures of the Helm chart tests: the real helm 3 and helm 4 binaries (from `make tools`)."""

from __future__ import annotations

import subprocess

import pytest

from .chartlib import find_tool


@pytest.fixture(scope="session")
def helm4() -> str:
    path = find_tool("helm")
    out = subprocess.run(
        [path, "version", "--short"], capture_output=True, text=True, check=True
    ).stdout
    if not out.startswith("v4."):
        pytest.fail(f"`{path}` is {out.strip()}, not Helm 4: run `make tools`", pytrace=False)
    return path


@pytest.fixture(scope="session")
def helm3() -> str:
    path = find_tool("helm3")
    out = subprocess.run(
        [path, "version", "--short"], capture_output=True, text=True, check=True
    ).stdout
    if not out.startswith("v3."):
        pytest.fail(f"`{path}` is {out.strip()}, not Helm 3: run `make tools`", pytrace=False)
    return path


@pytest.fixture(scope="session")
def helms(helm3: str, helm4: str) -> dict[str, str]:
    return {"helm3": helm3, "helm4": helm4}
