"""The default step's two conventions, the step contract, batch trees and import paths."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from trainer import plugins
from trainer.components.steps import (
    ClassificationStep,
    StepError,
    StepOutput,
    Tally,
    Top1,
    as_output,
    check_output,
)
from trainer.components.tree import batch_len, take, to_device
from trainer.config import JobConfig
from trainer.config_load import merge, parse_set
from trainer.errors import DataError


def test_tuple_batches_score_top1_over_the_class_dimension() -> None:
    model = nn.Identity()
    logits = torch.tensor([[2.0, 0.0], [0.0, 2.0], [2.0, 0.0]])
    out = ClassificationStep()(model, (logits, torch.tensor([0, 1, 1])))
    assert isinstance(out.correct, Top1)  # counted with the interval's read, not per step
    tally = Tally(torch.device("cpu"))
    tally.add(out.correct)
    assert tally.total().item() == 2 and out.count == 3
    assert out.loss.item() == pytest.approx(
        nn.functional.cross_entropy(logits, torch.tensor([0, 1, 1])).item())


def test_a_tally_counts_top1_hits_of_every_shape_with_ints_and_tensors_exactly() -> None:
    torch.manual_seed(0)
    tally = Tally(torch.device("cpu"), budget=50)  # small: groups are counted several times
    expected = 7 + 3
    tally.add(7)
    tally.add(torch.tensor(3, dtype=torch.int32))
    for n, shape in [(4, (5,)), (3, (5,)), (2, (5, 6)), (6, (5,)), (1, (5, 6))]:
        logits = torch.randn(n, *shape)
        labels = torch.randint(0, 5, (n, *shape[1:]))
        labels.view(-1)[0] = -100  # an ignored label is never a hit
        expected += int((logits.argmax(1) == labels).sum())
        tally.add(Top1(logits, labels))
    total = tally.total()
    assert total.dtype == torch.float64 and total.item() == expected
    assert Tally(torch.device("cpu")).total().item() == 0.0


def test_mapping_batches_use_the_transformers_models_own_loss() -> None:
    from transformers import BertConfig, BertForTokenClassification

    torch.manual_seed(0)
    model = BertForTokenClassification(BertConfig(
        vocab_size=20, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=8, num_labels=3)).eval()
    labels = torch.tensor([[0, 1, 2, -100], [2, -100, -100, -100]])
    batch = {"input_ids": torch.randint(0, 20, (2, 4)), "labels": labels}
    out = ClassificationStep()(model, batch)
    with torch.no_grad():
        reference = model(**batch)
    assert out.loss.item() == pytest.approx(reference.loss.item())
    valid = labels != -100
    expected = ((reference.logits.argmax(-1) == labels) & valid).sum()
    assert int(out.count) == 4 and int(out.correct) == int(expected)  # -100 ignored


def test_a_three_tuple_is_a_step_output_and_anything_else_is_an_error() -> None:
    loss = torch.tensor(1.0)
    assert as_output((loss, 2, 3)) == StepOutput(loss, 2, 3)
    with pytest.raises(StepError, match="returned a Tensor"):
        as_output(loss)


@pytest.mark.parametrize(("output", "message"), [
    (StepOutput(torch.ones(3), 1, 3), "shape (3,), not a scalar"),
    (StepOutput(torch.tensor(1), 1, 3), "torch.int64 loss"),
    (StepOutput(torch.tensor(1.0), 0.5, 3), "correct=0.5, not an integer"),
    (StepOutput(torch.tensor(1.0), 1, torch.tensor([3])), "count=tensor"),
    (StepOutput(torch.tensor(1.0), Top1(torch.zeros(4, 3), torch.zeros(3, dtype=torch.long)), 4),
     "Top1 with logits (4, 3) and labels (3,)"),
    (StepOutput(torch.tensor(1.0), Top1(torch.zeros(4, 3), torch.zeros(4)), 4),
     "Top1 with logits (4, 3) and labels (4,)"),
])
def test_the_step_contract_is_checked(output: StepOutput, message: str) -> None:
    with pytest.raises(StepError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_output(output)


def test_batch_trees_move_count_and_cut() -> None:
    batch: Any = {"a": torch.zeros(5, 2), "b": (torch.arange(5), [torch.ones(5)])}
    moved = to_device(batch, torch.device("cpu"))
    assert batch_len(moved) == 5
    cut = take(moved, 3)
    assert cut["a"].shape == (3, 2) and cut["b"][0].tolist() == [0, 1, 2]
    assert cut["b"][1][0].shape == (3,)
    with pytest.raises(DataError, match=r"batch\['b'\]\[1\]\[0\] is a str"):
        to_device({"a": torch.zeros(1), "b": (torch.zeros(1), ["text"])}, torch.device("cpu"))


def test_only_keyword_arguments_a_callable_takes_are_offered() -> None:
    def model(num_classes: int) -> None: ...
    def anything(**kwargs: Any) -> None: ...

    offered = {"num_classes": 3, "sample_shape": (4,)}
    assert plugins.accepted(model, offered) == {"num_classes": 3}
    assert plugins.accepted(anything, offered) == offered


def test_import_paths_are_told_apart_from_names_and_paths() -> None:
    assert plugins.is_import_path("pkg.mod:Net") and plugins.is_import_path("m:f.g")
    assert not plugins.is_import_path("mlp") and not plugins.is_import_path("/data/a:b.npz")


def test_options_merge_key_by_key_and_set_reaches_into_them() -> None:
    cfg = merge(JobConfig(), {"model": {"options": {"depth": 2, "width": 8}}}, "file")
    merge(cfg, parse_set(["model.options.depth=4", "data.options.root=/data"]), "cli")
    assert cfg.model.options == {"depth": 4, "width": 8}
    assert cfg.data.options == {"root": "/data"}
