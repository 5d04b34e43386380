"""This rank's evaluation sums: counts kept per batch and summed once, the loss weighted."""

from __future__ import annotations

import argparse
import math
from typing import Any

import torch
from torch import nn

from trainer.components.evaluation import local_sums, result
from trainer.components.steps import StepOutput, counts_vector


def test_counts_of_mixed_kinds_sum_exactly_as_float64() -> None:
    counts: list[torch.Tensor | int] = [3, torch.tensor(4), torch.tensor(5, dtype=torch.int32),
                                        2**40]
    vector = counts_vector(counts, torch.device("cpu"))
    assert vector.dtype == torch.float64 and vector.tolist() == [3.0, 4.0, 5.0, 2.0**40]
    assert counts_vector([], torch.device("cpu")).sum().item() == 0.0


def test_local_sums_weight_each_batch_loss_by_its_count_and_cut_the_padding() -> None:
    # Batch b holds values b, with loss b and b correct of its count; the last batch is half
    # padding, which the step must never see.
    batches = [torch.full((4, 1), 1.0), torch.full((4, 1), 2.0), torch.full((4, 1), 3.0)]
    seen: list[int] = []

    def step(model: nn.Module, batch: Any) -> StepOutput:
        seen.append(len(batch))
        value = batch[0, 0]
        n = len(batch)
        # One count as an int, the others as tensors: both kinds are summed.
        count: torch.Tensor | int = n if value == 1.0 else torch.tensor(n)
        return StepOutput(value.clone(), torch.tensor(int(value.item())), count)

    sums = local_sums(nn.Identity(), step, batches, num_valid=10, device=torch.device("cpu"))
    assert seen == [4, 4, 2]
    r = result(sums)
    assert (r.correct, r.total) == (1 + 2 + 3, 10)
    assert r.loss_sum == 1.0 * 4 + 2.0 * 4 + 3.0 * 2


def test_local_sums_of_no_real_samples_are_zero() -> None:
    sums = local_sums(nn.Identity(), lambda m, b: None, [torch.zeros(2, 1)], num_valid=0,
                      device=torch.device("cpu"))
    assert sums.tolist() == [0.0, 0.0, 0.0]


def test_evaluate_help_promises_identical_counts_and_a_loss_to_float32_rounding() -> None:
    from trainer.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    (flag,) = [a for a in sub.choices["evaluate"]._actions
               if "--nproc-per-node" in a.option_strings]
    assert flag.help == ("ranks to evaluate with (accuracy and counts are identical for any N; "
                         "the loss, a mean of per-batch losses, to float32 rounding)")


def test_sharded_sums_have_the_same_counts_and_the_loss_to_float32_rounding() -> None:
    # What the help and docs/cli.md promise: one rank's batches and three ranks' shards (every
    # third sample, as the eval sampler deals them) count the same samples exactly; the loss
    # is a mean per batch, whose float32 rounding depends on which samples share a batch.
    seed = 47
    print("seed", seed)
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(99, 5, generator=g), torch.randint(0, 3, (99,), generator=g)
    model = nn.Linear(5, 3)

    def step(model: nn.Module, batch: Any) -> StepOutput:
        xb, yb = batch
        logits = model(xb)
        return StepOutput(nn.functional.cross_entropy(logits, yb),
                          (logits.argmax(1) == yb).sum(), len(yb))

    def sums(indices: torch.Tensor) -> torch.Tensor:
        batches = [(x[indices[i:i + 8]], y[indices[i:i + 8]]) for i in range(0, len(indices), 8)]
        return local_sums(model, step, batches, len(indices), torch.device("cpu"))

    one = result(sums(torch.arange(99)))
    three = result(sum(sums(torch.arange(r, 99, 3)) for r in range(3)))  # type: ignore[arg-type]
    assert (one.correct, one.total) == (three.correct, three.total)
    assert math.isclose(one.loss, three.loss, rel_tol=1e-6)
