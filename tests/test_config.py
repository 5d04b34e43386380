"""Config: precedence, strict keys and types, help drawn from the field docstrings."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from trainer.cli import CONFIG_FLAGS, build_parser, field_docs
from trainer.config import JobConfig
from trainer.config_load import build_config, parse_set
from trainer.errors import ConfigError


def test_defaults_apply_when_nothing_is_given() -> None:
    cfg = build_config(None, {})
    assert cfg.train.batch_size == 32 and cfg.data.dataset == "digits"


def test_cli_overrides_file_which_overrides_defaults(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("train:\n  epochs: 7\n  batch_size: 8\noptim:\n  lr: 0.5\n")
    cfg = build_config(str(f), {"train": {"epochs": 3}})
    assert cfg.train.epochs == 3  # CLI wins over the file
    assert cfg.train.batch_size == 8  # file wins over the default
    assert cfg.optim.lr == 0.5
    assert cfg.train.seed == 0  # default


def test_floats_written_with_an_exponent_and_no_dot_are_floats(tmp_path: Path) -> None:
    # Helm's toYaml writes `lr: 0.00001` from a chart's values as `lr: 1e-05`, which YAML 1.1
    # (PyYAML) reads as a string: every chart job with a small learning rate stopped at exit 2.
    f = tmp_path / "c.yaml"
    f.write_text("optim:\n  lr: 1e-05\n  weight_decay: 5E-4\n")
    cfg = build_config(str(f), {})
    assert (cfg.optim.lr, cfg.optim.weight_decay) == (1e-05, 5e-4)
    assert parse_set(["optim.lr=3e-4"]) == {"optim": {"lr": 3e-4}}


def test_unknown_key_names_the_key_and_lists_valid_ones(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("train:\n  epoch: 7\n")
    with pytest.raises(ConfigError) as exc:
        build_config(str(f), {})
    assert "train.epoch" in exc.value.problem and "epochs" in exc.value.fix


def test_unknown_section_is_rejected() -> None:
    with pytest.raises(ConfigError, match="unknown section 'trian'"):
        build_config(None, {"trian": {"epochs": 1}})


def test_wrong_type_names_field_and_type() -> None:
    with pytest.raises(ConfigError) as exc:
        build_config(None, {"train": {"batch_size": "big"}})
    assert "train.batch_size" in exc.value.problem and "int" in exc.value.problem


def test_bool_is_not_accepted_as_int() -> None:
    with pytest.raises(ConfigError, match="train.epochs"):
        build_config(None, {"train": {"epochs": True}})


def test_int_is_accepted_for_float_fields() -> None:
    assert build_config(None, {"optim": {"lr": 1}}).optim.lr == 1.0


@pytest.mark.parametrize(("override", "field"), [
    ({"data": {"val_fraction": 1.0}}, "data.val_fraction"),
    ({"train": {"batch_size": 0}}, "train.batch_size"),
    ({"optim": {"lr": -1.0}}, "optim.lr"),
    ({"model": {"name": "resnet"}}, "model.name"),
    ({"data": {"dataset": "imagenet"}}, "data.dataset"),
    ({"metrics": {"port": 70000}}, "metrics.port"),
    ({"train": {"strategy": "zero3"}}, "train.strategy"),
    ({"data": {"worker_start": "vfork"}}, "data.worker_start"),
])
def test_invalid_values_fail_validation_naming_the_field(override: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        build_config(None, override)


def test_a_yaml_merge_key_merges_as_yaml_does_and_the_mappings_own_keys_win(
        tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("optim: &base\n  lr: 0.5\n  momentum: 0.8\n"
                 "train:\n  <<: {epochs: 4, batch_size: 8}\n  epochs: 2\n")
    cfg = build_config(str(f), {})
    assert (cfg.train.epochs, cfg.train.batch_size, cfg.optim.lr) == (2, 8, 0.5)
    f.write_text("train:\n  <<: {epochs: 4}\n  epochs: 2\n  epochs: 3\n")
    with pytest.raises(ConfigError, match="duplicate key 'epochs'"):  # still each key once
        build_config(str(f), {})


def test_set_ignores_spaces_around_the_key_and_the_equals_sign() -> None:
    assert parse_set(["train.epochs = 2", " model.hidden_sizes= [8, 4] "]) == {
        "train": {"epochs": 2}, "model": {"hidden_sizes": [8, 4]}}


def test_missing_config_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        build_config(str(tmp_path / "nope.yaml"), {})


def test_invalid_yaml_is_a_clear_error(tmp_path: Path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text("train: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        build_config(str(f), {})


def test_set_parses_yaml_scalars_and_lists() -> None:
    assert parse_set(["model.hidden_sizes=[8,4]", "optim.lr=0.1"]) == {
        "model": {"hidden_sizes": [8, 4]}, "optim": {"lr": 0.1}}
    with pytest.raises(ConfigError, match="malformed"):
        parse_set(["lr=0.1"])


def test_every_config_field_has_a_docstring() -> None:
    docs = field_docs()
    for section in dataclasses.fields(JobConfig):
        for f in dataclasses.fields(getattr(JobConfig(), section.name)):
            assert docs.get((section.name, f.name)), f"{section.name}.{f.name} lacks a docstring"


def test_flag_help_is_the_field_docstring() -> None:
    help_text = build_parser()._subparsers._group_actions[0].choices["train"].format_help()  # type: ignore[union-attr]
    docs = field_docs()
    for flag, (section, key) in CONFIG_FLAGS.items():
        assert flag in help_text
        assert docs[(section, key)].split()[0] in help_text


@pytest.mark.parametrize("command", ["train", "run"])
def test_flag_help_shows_each_default_and_names_no_undefined_seed(command: str) -> None:
    parser = build_parser()._subparsers._group_actions[0].choices[command]  # type: ignore[union-attr]
    help_text = " ".join(parser.format_help().split())
    assert "[train.epochs; default 10]" in help_text
    assert "[optim.lr; default 0.05]" in help_text
    assert "[train.batch_size; default 32]" in help_text
    assert "[checkpoint.dir; default none]" in help_text  # empty: off
    # "the seed's" named the article this project grew from without ever saying so
    assert "seed's" not in help_text
    assert "two-layer Linear->Linear model of the article this project grew from" in help_text


def test_the_configuration_page_names_no_undefined_seed() -> None:
    page = (Path(__file__).resolve().parents[1] / "docs" / "configuration.md").read_text()
    assert "seed's" not in page


def test_a_builder_added_to_its_registry_is_a_valid_name_everywhere(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The registries are the only lists of names: one entry is accepted by the config, listed
    # in the chart's schema and error messages, and built.
    import torch

    from trainer.components import optim

    def rmsprop(cfg: object, model: torch.nn.Module, fused: bool | None) -> torch.optim.Optimizer:
        return torch.optim.RMSprop(model.parameters(), lr=0.1)

    with pytest.raises(ConfigError, match="use one of sgd, adamw, adam"):
        build_config(None, {"optim": {"name": "rmsprop"}})
    monkeypatch.setitem(optim.OPTIMIZERS, "rmsprop", rmsprop)
    cfg = build_config(None, {"optim": {"name": "rmsprop"}})
    assert isinstance(optim.build_optimizer(cfg.optim, torch.nn.Linear(2, 2)),
                      torch.optim.RMSprop)
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "tools"))
    from chart_schema import trainer_config_sections

    enum = trainer_config_sections()["optim"]["properties"]["name"]["enum"]
    assert enum == ["sgd", "adamw", "adam", "rmsprop"]


def test_run_hands_its_ranks_the_validated_config_not_its_arguments(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # The ranks get the config `run` built (file, --set, flags merged and validated) as one
    # value, and train with exactly it: no argv to re-parse, no file to re-read.
    from trainer import cli
    from trainer.ranks import launcher, runner

    config = tmp_path / "run.yaml"
    config.write_text("train: {epochs: 3}\nmodel: {name: mlp, options: {dropout: 0.1}}\n")
    handed: list[list[str]] = []
    monkeypatch.setattr(launcher, "launch", lambda argv, *a, **k: handed.append(argv) or 0)
    assert cli.main(["run", "--config", str(config), "--set", "optim.betas=[0.8,0.9]",
                     "--epochs", "2", "--metrics-port", "0", "--set", "metrics.linger_seconds=0",
                     "--output-dir", str(tmp_path / "out")]) == 0
    [argv] = handed
    assert argv[0] == "rank" and len(argv) == 2 and "--config" not in argv[1]
    config.unlink()  # the ranks never read it
    trained: list[JobConfig] = []
    monkeypatch.setattr(runner, "train", trained.append)
    assert cli.main(argv) == 0
    want = build_config(None, {"train": {"epochs": 2}, "model": {
        "name": "mlp", "options": {"dropout": 0.1}}, "optim": {"betas": [0.8, 0.9]},
        "metrics": {"port": 0, "linger_seconds": 0}, "output": {"dir": str(tmp_path / "out")}})
    assert trained == [want]
