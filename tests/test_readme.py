"""The README and the reference tell the truth: the two commands first in the README, every
config field and CLI flag in docs/configuration.md's generated table, the bad-input suite's
counts in docs/cli.md."""

from __future__ import annotations

import dataclasses

from conftest import REPO

from trainer.cli import CONFIG_FLAGS
from trainer.config import JobConfig

README = (REPO / "README.md").read_text()
CONFIGURATION = (REPO / "docs" / "configuration.md").read_text()
CLI = (REPO / "docs" / "cli.md").read_text()


def test_first_lines_give_the_two_commands() -> None:
    head = "\n".join(README.splitlines()[:6])
    assert "make run" in head and "make test" in head


def test_every_config_field_is_documented() -> None:
    for section in dataclasses.fields(JobConfig):
        for f in dataclasses.fields(getattr(JobConfig(), section.name)):
            assert f"`{section.name}.{f.name}`" in CONFIGURATION, f"{section.name}.{f.name}"


def test_every_config_flag_is_documented() -> None:
    for flag in CONFIG_FLAGS:
        assert f"`{flag}`" in CONFIGURATION, flag


def test_config_table_is_generated_from_the_config_docstrings() -> None:
    import sys

    sys.path.insert(0, str(REPO / "tools"))
    from config_table import rows

    start = CONFIGURATION.index("| key | default | flag | meaning |")
    table = CONFIGURATION[start:CONFIGURATION.index("\n\n", start)].splitlines()
    assert table == rows(), "run .venv/bin/python tools/config_table.py --write"


def test_the_bad_input_counts_are_the_suites_tables() -> None:
    from tests.chart.test_chart_values_errors import BAD_VALUES
    from tests.robustness.test_one_line import CASES

    assert f"a table of {len(CASES)} CLI cases" in CLI
    assert f"{len(BAD_VALUES)} bad chart values fail" in CLI
