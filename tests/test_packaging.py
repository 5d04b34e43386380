"""pyproject.toml builds without setuptools' deprecation warnings, with the setuptools the
Dockerfile's wheel stage installs."""

from __future__ import annotations

import re
import sys
import warnings
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


def test_the_project_metadata_loads_without_a_setuptools_deprecation() -> None:
    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. "`project.license` as a TOML table is deprecated"
        dist = apply_configuration(Distribution(), REPO / "pyproject.toml")
    assert dist.metadata.license_expression == "Apache-2.0"


def test_the_dockerfile_builds_the_wheel_with_a_setuptools_the_build_system_accepts() -> None:
    requires = tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]["requires"]
    setuptools = next(Requirement(r) for r in requires if Requirement(r).name == "setuptools")
    # An SPDX string in project.license needs setuptools >= 77.
    assert not setuptools.specifier.contains("76.9"), setuptools
    pinned = re.search(r"setuptools==(\S+)", (REPO / "Dockerfile").read_text())
    assert pinned and setuptools.specifier.contains(pinned.group(1)), setuptools
