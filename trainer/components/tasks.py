"""What a task scores: the named sums a step returns and the ratio metrics derived from them.

Every metric the trainer reports is a function of sums over items (samples or tokens), never a
mean of per-rank or per-batch ratios: sums reduce exactly over ranks (float64, one all_reduce),
so a validation's metrics are those of one process over the whole validation set, up to float64
rounding of the sums (and exactly for integer counts below 2^53). A :class:`Task` names

* ``weight``: the sum that counts the scored items (``count``, or ``tokens``); it weighs the
  loss (the sum ``loss_sum`` is loss x weight, summed) and is the step's ``count``;
* ``sums``: the further sums a step returns, in the order they are reduced;
* ``ratios``: the reported metrics, each ``numerator / denominator`` of those names (plus
  ``correct``, the weight and ``loss_sum``), optionally through ``sqrt`` or ``exp``.

A step declares its task as its attribute ``task`` (a built-in step has one; a user's step
without one is scored as classification: accuracy = correct / count).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trainer.errors import ConfigError

TRANSFORMS = {"ratio": lambda x: x, "sqrt": math.sqrt, "exp": math.exp}
"""How a ratio becomes the reported value."""

MAX_NAME = 60
"""Longest metric name: the TrainJob's trainerStatus reports it as ``val_<name>``, kept within
the 64 characters its strings are held to (trainer.metrics.trainjob_status.MAX_TEXT)."""

BASE_SUMS = ("correct", "loss_sum")
"""Sums every step yields besides its weight: `correct` (0 for a step that scores no hits)
and `loss_sum` (the loss weighted by the weight)."""


@dataclass(frozen=True)
class Ratio:
    """One reported metric: ``transform(numerator / denominator)``."""

    name: str
    numerator: str
    denominator: str
    transform: str = "ratio"
    """`ratio`, `sqrt` (e.g. RMSE) or `exp` (e.g. perplexity)."""

    def value(self, sums: Mapping[str, float]) -> float | None:
        """The metric, or None when its denominator is 0 (nothing scored)."""
        den = sums[self.denominator]
        if not den:
            return None
        x = sums[self.numerator] / den
        return math.inf if self.transform == "exp" and x > 700 else TRANSFORMS[self.transform](x)


@dataclass(frozen=True)
class Task:
    """The sums a step returns and the metrics they make (see the module docstring)."""

    name: str
    ratios: tuple[Ratio, ...]
    sums: tuple[str, ...] = ()
    weight: str = "count"

    def __post_init__(self) -> None:
        known = self.known()
        clash = [s for s in self.sums if s in (*BASE_SUMS, self.weight, "loss")]
        if clash or len(set(self.sums)) != len(self.sums):
            raise ConfigError(f"task {self.name!r} declares the sums {list(self.sums)}: "
                              f"{clash or 'a name twice'} clash",
                              "name each further sum once, other than loss, correct, loss_sum "
                              f"and the weight {self.weight!r}")
        for r in self.ratios:
            unknown = [n for n in (r.numerator, r.denominator) if n not in known]
            if unknown or r.transform not in TRANSFORMS:
                raise ConfigError(f"task {self.name!r}: metric {r.name!r} uses "
                                  f"{unknown or r.transform!r}, not one of its sums "
                                  f"{list(known)} or transforms {list(TRANSFORMS)}",
                                  "declare every sum a ratio uses in Task.sums")
        if not all(r.name.replace("_", "").isalnum() and r.name.isascii()
                   and len(r.name) <= MAX_NAME for r in self.ratios):
            raise ConfigError(f"task {self.name!r}: metric names {self.names()} must be "
                              f"ASCII letters, digits and underscores, at most {MAX_NAME} "
                              "characters", "rename the metric")

    def known(self) -> tuple[str, ...]:
        """Every sum's name, in the order of the reduced vector."""
        return ("correct", self.weight, "loss_sum", *self.sums)

    def names(self) -> tuple[str, ...]:
        """The reported metrics' names."""
        return tuple(r.name for r in self.ratios)

    def metrics(self, sums: Mapping[str, float]) -> dict[str, float]:
        """Each metric whose denominator is not 0."""
        values = {r.name: r.value(sums) for r in self.ratios}
        return {k: v for k, v in values.items() if v is not None}


CLASSIFICATION = Task("classification", (Ratio("accuracy", "correct", "count"),))
REGRESSION = Task("regression",
                  (Ratio("mae", "sum_abs_err", "count"),
                   Ratio("rmse", "sum_sq_err", "count", "sqrt")),
                  sums=("sum_abs_err", "sum_sq_err"))
LANGUAGE_MODEL = Task("lm",
                      (Ratio("perplexity", "nll_sum", "tokens", "exp"),
                       Ratio("token_accuracy", "correct_tokens", "tokens")),
                      sums=("correct_tokens", "nll_sum"), weight="tokens")
"""Perplexity from `nll_sum` (the token losses summed in float64 by the step), not from
`loss_sum` (each batch's mean loss in the model's precision times its tokens)."""


def task_of(step: Any) -> Task:
    """The task `step` declares (its `task` attribute), classification when none."""
    task = getattr(step, "task", None)
    if task is None:
        return CLASSIFICATION
    if not isinstance(task, Task):
        raise ConfigError(f"train.step's task attribute is a {type(task).__name__}, not a Task",
                          "set step.task = trainer.components.tasks.Task(...)")
    return task
