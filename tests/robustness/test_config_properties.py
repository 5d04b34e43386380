"""Property-based: whatever value arrives for whatever key, by a mapping (the YAML file's
shape), by `--set` or by a flag, the config is either valid or one ConfigError line with a fix;
never another exception (the CLI would print a traceback)."""

from __future__ import annotations

import contextlib
import dataclasses
import io
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from trainer.cli import CONFIG_FLAGS, _config, build_parser
from trainer.config import JobConfig
from trainer.config_load import build_config, parse_set
from trainer.errors import ConfigError

KEYS = [(section.name, f.name) for section in dataclasses.fields(JobConfig)
        for f in dataclasses.fields(getattr(JobConfig(), section.name))]

scalars = (st.none() | st.booleans() | st.integers() | st.floats()
           | st.sampled_from([10 ** 400, -(10 ** 400), 2 ** 63, float("inf"), "", ".inf"])
           | st.text(max_size=12))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=6)
keys = st.sampled_from(KEYS) | st.tuples(st.sampled_from(["train", "nosuch"]), st.text(max_size=6))


def _one_line(err: ConfigError) -> None:
    text = str(err)
    assert "\n" not in text and "(fix: " in text, text
    assert len(text) < 1000, text


@settings(max_examples=300, deadline=None)
@given(key=keys, value=values)
@example(key=("train", "epochs\nx"), value=1)  # a line break in a key stays in one line
@example(key=("optim", "lr"), value=10 ** 400)
@example(key=("model", "options"), value=[10 ** 300] * 3)  # was a 1002-character line
@example(key=("data", "feature_columns"), value={"x": "y" * 2000})  # a list field
def test_any_value_in_a_mapping_is_valid_or_one_line(key: tuple[str, str], value: Any) -> None:
    section, name = key
    try:
        build_config(None, {section: {name: value}})
    except ConfigError as err:
        _one_line(err)


@settings(max_examples=300, deadline=None)
@given(key=st.sampled_from(KEYS), raw=st.text(max_size=20))
@example(key=("train", "epochs"), raw="[1,")
@example(key=("model", "options"), raw="{a: 1, a: 2}")
@example(key=("train", "seed"), raw="\x1f")
def test_any_set_text_is_valid_or_one_line(key: tuple[str, str], raw: str) -> None:
    item = f"{key[0]}.{key[1]}={raw}"
    try:
        build_config(None, parse_set([item]))
    except ConfigError as err:
        _one_line(err)


@settings(max_examples=300, deadline=None)
@given(flag=st.sampled_from(sorted(CONFIG_FLAGS)), raw=st.text(max_size=20)
       | st.sampled_from(["inf", "-inf", "nan", "1e300", "9" * 30, "", "0", "-1"]))
# A traceback (ValueError: embedded null byte) until 2026-12-06:
@example(flag="--dataset", raw="\x00")
def test_any_flag_text_is_valid_one_line_or_a_one_line_usage_error(flag: str, raw: str) -> None:
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            ns = build_parser().parse_args(["train", f"{flag}={raw}"])
    except SystemExit as exc:
        assert exc.code == 2
        lines = stderr.getvalue().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and "--help" in lines[0], lines
        return
    try:
        _config(ns)
    except ConfigError as err:
        _one_line(err)


@pytest.mark.parametrize("text", ["train: {epochs: 1, epochs: 2}\n", "a: 1\na: 2\n",
                                  "train:\n  seed: 1\ntrain:\n  seed: 2\n"])
def test_duplicate_yaml_keys_are_an_error_at_any_depth(tmp_path: Any, text: str) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError, match="duplicate key"):
        build_config(str(f))
