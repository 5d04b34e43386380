"""The step: what one batch contributes — a loss to minimise and (correct, count) to score.

Training and evaluation call the same step, so the exact global accuracy (integer counts
reduced over ranks, evaluation padding masked) holds for any model. A user step is any
callable ``(model, batch) -> StepOutput | (loss, correct, count) | mapping`` (a mapping of
``loss`` and the named sums its ``task`` declares: :mod:`trainer.components.tasks`);
``train.step`` names it by import path. The default, :class:`ClassificationStep`, covers the
two common conventions:

* ``(inputs, labels)`` batches and a model returning logits: cross-entropy, top-1 accuracy
  over dimension 1 (the class dimension of ``F.cross_entropy``);
* mapping batches with a ``labels`` key and a model taking keyword arguments and returning an
  object with ``.loss`` and ``.logits`` (the Hugging Face ``transformers`` convention): the
  batch goes in as ``model(**batch)``, the model's own loss is used, and accuracy compares
  ``logits.argmax(-1)`` with the labels, ignoring label ``-100``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from trainer import plugins
from trainer.components.task_steps import CausalLMStep, RegressionStep
from trainer.components.tasks import CLASSIFICATION, Task, task_of
from trainer.errors import ConfigError, DataError, first_line

IGNORE_INDEX = -100
"""Label ignored by the loss and the accuracy (``transformers``' and torch's convention)."""


class StepError(ConfigError):
    """A step (or the model it calls) broke its contract."""


@dataclass(frozen=True)
class Top1:
    """The top-1 hits of `logits` against `labels`, counted later: a step may return it as
    `correct`, and the loop counts the Top1s of a whole log interval (or of an evaluation)
    with three ops, not three a step. Those three cost about 6 us in one process, and 100-190
    us of a 2.9 ms step in runs on 2 CPU ranks alternating with and without them (2026-12-02).
    The tensors are kept until then, so they must not be modified in place afterwards (a
    model output and a fresh batch never are)."""

    logits: Tensor
    """(N, C, ...) scores, detached; a hit is ``logits.argmax(1) == labels``."""
    labels: Tensor
    """(N, ...) class indices; a negative label (IGNORE_INDEX) never counts as a hit."""


@dataclass
class StepOutput:
    loss: Tensor
    """Scalar loss to minimise (a mean over the batch's counted items)."""
    correct: Tensor | int | Top1
    """Items predicted correctly (integer; a tensor stays on the device), or the Top1 whose
    hits are counted with the interval's one read."""
    count: Tensor | int
    """Items scored (the denominator of accuracy; the weight of `loss` in evaluation)."""
    sums: dict[str, Tensor | float | int] = field(default_factory=dict)
    """The further sums its task declares (:class:`trainer.components.tasks.Task`), by name."""


StepFn = Callable[[nn.Module, Any], Any]


def counts_vector(values: Sequence[Tensor | int], device: torch.device) -> Tensor:
    """Per-step (or per-batch) counts, ints and/or integer tensors on `device`, as one float64
    vector (exact up to 2^53). Counts are kept as they come and read with one op: appending
    costs ~0.1 us, an in-place add on the device ~4 us a step."""
    if all(isinstance(v, int) for v in values):
        return torch.tensor(values, dtype=torch.float64, device=device)
    # A user step may count on the CPU while its model runs on a GPU.
    return torch.stack([(v if v.device == device else v.to(device)) if isinstance(v, Tensor)
                        else torch.tensor(v, device=device) for v in values]).double()


class Tally:
    """Sums what steps return as `correct` (ints, integer tensors, Top1s) with one read. Top1s
    wait in groups of one shape and are counted together, at the latest when the group holds
    `budget` logits (1 MiB of fp32) or 64 batches, so the memory they keep stays bounded."""

    def __init__(self, device: torch.device, budget: int = 1 << 18) -> None:
        self.device = device
        self.budget = budget
        self._counts: list[Tensor | int] = []
        self._waiting: dict[tuple[int, ...], list[Top1]] = {}
        self._held = 0

    def add(self, value: Tensor | int | Top1) -> None:
        if type(value) is not Top1:
            self._counts.append(value)  # type: ignore[arg-type]
            return
        group = self._waiting.setdefault(tuple(value.logits.shape[1:]), [])
        group.append(value)
        self._held += value.logits.numel()
        if self._held > self.budget or len(group) >= 64:
            self._count_waiting()

    def _count_waiting(self) -> None:
        for group in self._waiting.values():
            logits = torch.cat([t.logits for t in group]) if len(group) > 1 else group[0].logits
            labels = torch.cat([t.labels for t in group]) if len(group) > 1 else group[0].labels
            self._counts.append((logits.argmax(1) == labels.to(logits.device)).sum())
        self._waiting.clear()
        self._held = 0

    def total(self) -> Tensor:
        """The sum as a 0-dim float64 tensor on the device (exact up to 2^53)."""
        self._count_waiting()
        return counts_vector(self._counts, self.device).sum()


def as_output(result: Any, where: str = "train.step", task: Task = CLASSIFICATION
              ) -> StepOutput:
    """A step's return value as a StepOutput (a 3-tuple, or a mapping of `loss`, the task's
    weight, optionally `correct`, and its further sums, is accepted)."""
    if isinstance(result, StepOutput):
        return result
    if isinstance(result, Mapping):
        return _from_mapping(result, where, task)
    if isinstance(result, Sequence) and not isinstance(result, (str, Tensor)) and len(result) == 3:
        return StepOutput(*result)
    raise StepError(f"{where} returned a {type(result).__name__}",
                    "return StepOutput(loss, correct, count), a (loss, correct, count) tuple "
                    "or a mapping of loss and its task's sums")


def _from_mapping(result: Mapping[str, Any], where: str, task: Task) -> StepOutput:
    missing = [k for k in ("loss", task.weight, *task.sums) if k not in result]
    extra = [k for k in result if k not in ("loss", "correct", task.weight, *task.sums)]
    if missing or extra:
        raise StepError(f"{where} returned the keys {sorted(result)}: "
                        + (f"{missing} missing" if missing else f"{extra} not declared")
                        + f" by its task {task.name!r} (sums: loss, correct, {task.weight}"
                        + "".join(f", {s}" for s in task.sums) + ")",
                        "return exactly those keys, or declare the task's sums as the step's "
                        "`task` attribute (trainer.components.tasks.Task)")
    return StepOutput(result["loss"], result.get("correct", 0), result[task.weight],
                      {k: result[k] for k in task.sums})


def check_output(out: StepOutput, where: str = "train.step") -> None:
    """The contract, checked once on the first batch (each check costs a device sync)."""
    if not isinstance(out.loss, Tensor) or out.loss.dim() != 0:
        shape = tuple(out.loss.shape) if isinstance(out.loss, Tensor) else type(out.loss).__name__
        raise StepError(f"{where} returned a loss of shape {shape}, not a scalar",
                        "reduce the loss to one number (e.g. .mean()) before returning it")
    if not out.loss.is_floating_point():
        raise StepError(f"{where} returned a {out.loss.dtype} loss",
                        "return a floating-point loss tensor")
    for name in ("correct", "count"):
        value = getattr(out, name)
        if name == "correct" and isinstance(value, Top1):
            _check_top1(value, where)
            continue
        ok = (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, Tensor) and value.dim() == 0 and not value.is_floating_point())
        if not ok:
            raise StepError(f"{where} returned {name}={value!r}, not an integer",
                            f"return {name} as an int or a 0-dim integer tensor")
    for name, value in out.sums.items():
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) or (
            isinstance(value, Tensor) and value.dim() == 0 and value.dtype != torch.bool)
        if not ok:
            shown = (f"a tensor of shape {tuple(value.shape)}" if isinstance(value, Tensor)
                     else repr(value))
            raise StepError(f"{where} returned {name}={shown}, not a number",
                            f"return {name} as a number or a 0-dim tensor (a sum over the "
                            "batch)")
        # One sum of nan or inf would make its metric nan or inf for the whole validation.
        if not math.isfinite(float(value)):
            raise StepError(f"{where} returned {name}={float(value)}, not finite",
                            f"return {name} as a finite sum over the batch")


def _check_top1(top1: Top1, where: str) -> None:
    logits, labels = top1.logits, top1.labels
    ok = isinstance(logits, Tensor) and isinstance(labels, Tensor) and logits.dim() >= 2 and \
        not labels.is_floating_point() and labels.shape == logits.shape[:1] + logits.shape[2:]
    if not ok:
        shapes = [tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
                  for t in (logits, labels)]
        raise StepError(f"{where} returned Top1 with logits {shapes[0]} and labels {shapes[1]}",
                        "give Top1 (N, C, ...) logits and (N, ...) integer labels")


def _field(output: Any, name: str) -> Any:
    value = output.get(name) if isinstance(output, Mapping) else getattr(output, name, None)
    if value is None:
        raise StepError(f"the model was called with a mapping batch (model(**batch)) but its "
                        f"output has no {name!r}",
                        "return an object with .loss and .logits (as transformers models do), "
                        "or give the batch as (inputs, labels)")
    return value


class ClassificationStep:
    """The default step (see the module docstring)."""

    def __call__(self, model: nn.Module, batch: Any) -> StepOutput:
        # A tuple first: the ABC check of Mapping costs ~0.5 us a call.
        if type(batch) is not tuple and isinstance(batch, Mapping):
            out = model(**batch)
            loss, logits = _field(out, "loss"), _field(out, "logits")
            labels = batch["labels"]
            # An argmax is never IGNORE_INDEX, so ignored labels are never hits.
            correct = (logits.detach().argmax(-1) == labels).sum()
            return StepOutput(loss, correct, (labels != IGNORE_INDEX).sum())
        inputs, labels = batch
        logits = model(inputs)
        return StepOutput(F.cross_entropy(logits, labels), Top1(logits.detach(), labels),
                          labels.numel())

    def check(self, model: nn.Module, batch: Any, num_classes: int | None) -> None:
        """Check the batch convention and the class count on one batch, before training."""
        if isinstance(batch, Mapping):
            if "labels" not in batch:
                raise DataError(f"a mapping batch has no 'labels' key (keys: {list(batch)})",
                                "name the label field 'labels', or use a train.step of your own")
            labels, class_dim = batch["labels"], -1
            logits = _field(model(**batch), "logits")
        elif isinstance(batch, (tuple, list)) and len(batch) == 2:
            (inputs, labels), class_dim = batch, 1
            logits = model(inputs)
        else:
            raise DataError(f"the default step needs (inputs, labels) or a mapping with 'labels'"
                            f", got a {type(batch).__name__}"
                            + (f" of {len(batch)} items" if isinstance(batch, Sequence) else ""),
                            "return (inputs, labels) samples, or set train.step to your own step")
        if not isinstance(logits, Tensor) or logits.dim() < 2:
            raise StepError(f"the model returned {type(logits).__name__} "
                            f"{tuple(getattr(logits, 'shape', ()))}, not class logits (N, C)",
                            "return one logit per class and sample")
        if labels.is_floating_point():
            raise DataError(f"labels are {labels.dtype}, not class indices",
                            "return integer labels (torch.long), or use a train.step of your own")
        classes = int(logits.shape[class_dim])
        real = labels[labels != IGNORE_INDEX]
        top = int(real.max()) if real.numel() else 0
        if real.numel() and (top >= classes or int(real.min()) < 0):
            raise DataError(f"the model returns {classes} logits per sample but a label is "
                            f"{top if top >= classes else int(real.min())}",
                            "make the model's output size the number of classes (labels must "
                            "be 0..C-1), or set data.num_classes")
        if num_classes is not None and classes != num_classes:
            raise DataError(f"the model returns {classes} logits per sample but the dataset "
                            f"has {num_classes} classes",
                            "build the model with num_classes outputs")


BUILTIN_STEPS: dict[str, Callable[[], StepFn]] = {
    "classification": ClassificationStep, "regression": RegressionStep, "lm": CausalLMStep}
"""The built-in steps by `train.step`: the one list of their names (config.STEP_NAMES reads
it)."""


def build_step(spec: str) -> StepFn:
    """The step named by `train.step`: a built-in, or the callable behind an import path."""
    if spec in BUILTIN_STEPS:
        return BUILTIN_STEPS[spec]()
    return plugins.load(spec, "train.step")


def preflight(step: StepFn, model: nn.Module, batch: Any, num_classes: int | None) -> None:
    """Run `step` once on `batch` without gradients and check everything that can be checked
    before the first optimizer step; raises a TrainerError naming the problem."""
    was_training = model.training
    model.eval()  # no dropout draws, no BatchNorm statistics updates
    try:
        with torch.no_grad():
            check = getattr(step, "check", None)
            if check is not None:
                check(model, batch, num_classes)
            out = as_output(step(model, batch), task=task_of(step))
            check_output(out)
    except (ConfigError, DataError):
        raise
    except Exception as exc:  # noqa: BLE001 - user code (model or step): report what it raised
        raise StepError(f"the step or the model raised {type(exc).__name__} on the first "
                        f"batch: {first_line(exc, empty='(no message)')}",
                        "fix the model, the step or the data so that one batch goes through "
                        "(rerun with --debug for the traceback)") from exc
    finally:
        model.train(was_training)
