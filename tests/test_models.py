"""Models produce class logits for their input shapes; the CNN refuses vectors clearly."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from trainer.build import build_workload
from trainer.components.models import MyModel, build_model
from trainer.config import JobConfig, ModelConfig
from trainer.errors import ConfigError


@pytest.mark.parametrize(("name", "shape"), [
    ("mymodel", (10,)), ("mlp", (10,)), ("mlp", (1, 8, 8)), ("cnn", (1, 8, 8)), ("cnn", (8, 8)),
])
def test_model_outputs_one_logit_per_class(name: str, shape: tuple[int, ...]) -> None:
    model = build_model(ModelConfig(name=name, hidden_sizes=[16]), 7, shape, seed=0)
    assert model(torch.randn(5, *shape)).shape == (5, 7)


def test_mymodel_is_the_seed_two_linear_layers() -> None:
    m = build_model(ModelConfig(name="mymodel", hidden_sizes=[20]), 10, (10,), seed=0)
    assert isinstance(m, MyModel)
    assert (m.fc1.in_features, m.fc1.out_features, m.fc2.out_features) == (10, 20, 10)


def test_same_seed_gives_identical_weights_on_every_rank() -> None:
    a = build_model(ModelConfig(), 10, (64,), seed=5)
    b = build_model(ModelConfig(), 10, (64,), seed=5)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))


def test_cnn_on_vectors_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="image-shaped"):
        build_model(ModelConfig(name="cnn"), 3, (10,), seed=0)


def _user_workload(dataset: str, monkeypatch: pytest.MonkeyPatch) -> nn.Module:
    monkeypatch.syspath_prepend(str(Path(__file__).parent / "fixtures"))
    cfg = JobConfig()
    cfg.data.dataset, cfg.model.name = f"userplugins:{dataset}", "userplugins:classes_model"
    return build_workload(cfg).model


def test_a_user_model_taking_num_classes_gets_max_label_plus_one_from_exposed_targets(
        monkeypatch: pytest.MonkeyPatch) -> None:
    model = _user_workload("targets_four_classes", monkeypatch)
    assert isinstance(model, nn.Linear) and model.out_features == 4  # not its default 10


def test_a_user_model_taking_num_classes_of_data_without_labels_asks_for_data_num_classes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="takes num_classes") as err:
        _user_workload("unlabelled_four_classes", monkeypatch)
    assert "set data.num_classes" in str(err.value) and "\n" not in str(err.value)
