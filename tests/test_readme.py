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


def test_both_readmes_give_the_examples_setup_and_it_installs_what_the_classifier_imports(
) -> None:
    # `make run` installs no transformers: the example's classifier needs it installed too
    import tomllib

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    pin = next(r for r in extras["test"] if r.startswith("transformers"))
    assert not any(r.startswith("transformers") for r in
                   tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"])
    for doc in (README, *((REPO / "examples" / name / "README.md").read_text()
                          for name in ("mytask", "causal_lm"))):
        assert "after `make run`" in doc
        assert f".venv/bin/pip install '{pin}'" in doc


def _readme_commands() -> list[list[str]]:
    """The README's local `ddp-trainer run/train` commands, as words."""
    import re
    import shlex

    found = []
    for block in re.findall(r"^```bash\n(.*?)^```", README, re.M | re.S):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if len(words) > 1 and words[0].endswith("ddp-trainer") and words[1] in ("run",
                                                                                   "train"):
                found.append(words)
    return found


def test_the_readmes_local_commands_can_run_one_after_another() -> None:
    # A run keeps serving its final metrics on its port for metrics.linger_seconds (60 s):
    # the next command, run at once as a reader does, would find the port in use.
    commands = _readme_commands()
    assert len(commands) >= 5, commands
    for words in commands:
        port = words[words.index("--metrics-port") + 1] if "--metrics-port" in words else None
        assert port == "0" or "metrics.linger_seconds=0" in words, " ".join(words)


def test_the_readme_is_no_lab_notebook() -> None:
    # timings, loads and machines belong in docs/benchmarks.md; no path of one machine
    import re

    found = re.findall(r"load average|polyglot|WHEELS=/|/work/|/home/|/root/", README)
    assert found == [], found


def test_the_readme_says_plainly_that_no_gpu_ran_the_cuda_path() -> None:
    # every test runs on CPUs: a GPU user must not read the CUDA/NCCL path as tested
    text = " ".join(README.split())
    assert "the CUDA/NCCL path" in text and "has not run on a GPU in our tests" in text
