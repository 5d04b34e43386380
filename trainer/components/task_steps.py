"""The built-in steps beyond classification: `train.step: regression` and `train.step: lm`.

Each returns a mapping of its loss and the sums its task (:mod:`trainer.components.tasks`)
declares; the sums are taken in float64 so that a validation's MAE, RMSE and perplexity over
ranks equal one process's over the same set up to float64 rounding.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from trainer.components.tasks import LANGUAGE_MODEL, REGRESSION
from trainer.errors import DataError

IGNORE_INDEX = -100
"""Label ignored by the loss and the token accuracy (``transformers``' and torch's)."""


class RegressionStep:
    """``(inputs, targets)`` batches, a model returning one prediction per target value: mean
    squared error to minimise; MAE and RMSE over every target value."""

    task = REGRESSION

    def __call__(self, model: nn.Module, batch: Any) -> dict[str, Any]:
        if not (isinstance(batch, (tuple, list)) and len(batch) == 2):
            raise DataError(f"the regression step needs (inputs, targets) batches, got a "
                            f"{type(batch).__name__}", "return (inputs, targets) samples")
        inputs, targets = batch
        pred = model(inputs)
        if pred.shape != targets.shape and pred.numel() == targets.numel():
            pred = pred.reshape(targets.shape)  # (N, 1) predictions of (N,) targets
        if pred.shape != targets.shape:
            raise DataError(f"the model predicts {tuple(pred.shape)} for targets of "
                            f"{tuple(targets.shape)}", "predict one value per target value")
        err = pred.detach().double() - targets.double()
        return {"loss": F.mse_loss(pred, targets.to(pred.dtype)), "count": targets.numel(),
                "sum_abs_err": err.abs().sum(), "sum_sq_err": err.square().sum()}


class CausalLMStep:
    """Next-token prediction: batches of token ids ``(N, T)`` (the labels are the ids), an
    ``(input_ids, labels)`` pair, or a mapping with ``input_ids`` (and ``labels``, and more
    model inputs such as ``attention_mask``) passed as ``model(**batch)`` without the labels.
    The model returns ``(N, T, V)`` logits (or an object with ``.logits``, as ``transformers``'
    do); position t predicts label t+1; label -100 is ignored. Cross entropy to minimise;
    perplexity and token accuracy over the counted tokens."""

    task = LANGUAGE_MODEL

    def __call__(self, model: nn.Module, batch: Any) -> dict[str, Any]:
        if isinstance(batch, Mapping):
            if "input_ids" not in batch:
                raise DataError(f"the lm step needs 'input_ids' in a mapping batch (keys: "
                                f"{list(batch)})", "name the token field 'input_ids'")
            labels = batch.get("labels", batch["input_ids"])
            out = model(**{k: v for k, v in batch.items() if k != "labels"})
        else:
            ids, labels = batch if isinstance(batch, (tuple, list)) else (batch, batch)
            out = model(ids)
        logits = out if isinstance(out, Tensor) else getattr(out, "logits", None)
        if not isinstance(logits, Tensor) or logits.dim() != 3:
            raise DataError(f"the lm step needs (N, T, vocab) logits, the model returned "
                            f"{tuple(getattr(logits, 'shape', ())) or type(out).__name__}",
                            "return logits, or an object with .logits")
        logits, labels = logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten()
        loss = F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX)
        counted = labels != IGNORE_INDEX
        tokens = counted.sum()
        with torch.no_grad():
            hits = ((logits.argmax(-1) == labels) & counted).sum()
            if model.training:  # not reported from training: a float64 copy of the logits
                nll = loss.detach().double() * tokens  # would cost 2x their memory a step
            else:
                nll = F.cross_entropy(logits.double(), labels, ignore_index=IGNORE_INDEX,
                                      reduction="sum")
        return {"loss": loss, "tokens": tokens, "correct_tokens": hits, "nll_sum": nll}
