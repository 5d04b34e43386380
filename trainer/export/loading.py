"""``trainer.load_checkpoint``: a checkpoint or an exported model, verified, as plain values."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainer.components import checkpoint, models, sharded_checkpoint
from trainer.components.durable import sha256_of
from trainer.config import JobConfig, saved_config
from trainer.config_load import merge
from trainer.errors import CheckpointError, ConfigError, missing
from trainer.export.files import FORMAT, META
from trainer.loop.resume_check import training_state

TRAINING_ONLY = ("model", "optimizer", "rng_cpu", "rng_cuda", "sampler", "precision", "config")
"""What a training checkpoint holds that is not a description of its model."""


@dataclass
class LoadedCheckpoint:
    """A trained model as plain values: what :func:`load_checkpoint` returns."""

    model_state: dict[str, torch.Tensor]
    """The model's ``state_dict`` (CPU tensors): ``model.load_state_dict(model_state)``."""
    config: JobConfig
    """The config it was trained with."""
    metadata: dict[str, Any]
    """``step``, ``epoch``, ``class_names``, ``train_loss``, ``objects`` (parts given to
    fit() as objects), ``source`` (the file read) and ``sha256`` (its verified checksum);
    an export adds ``num_classes``, ``sample_shape`` and, from a run, ``val_accuracy``."""

    def shapes(self) -> tuple[int | None, tuple[int, ...] | None]:
        """(num_classes, sample_shape) the model was built for: recorded by an export, else
        read from the config's dataset (as ``ddp-trainer evaluate`` does)."""
        num_classes, shape = self.metadata.get("num_classes"), self.metadata.get("sample_shape")
        if num_classes is None and shape is None:
            if "dataset" in self.metadata.get("objects", {}):
                raise ConfigError(f"{self.metadata['source']}: its dataset was passed to fit() "
                                  "as an object, so the model's input shape is not known",
                                  "build the model yourself and call "
                                  "model.load_state_dict(loaded.model_state)")
            from trainer.data import build_splits

            splits = build_splits(self.config.data, self.config.train.seed)
            num_classes, shape = splits.num_classes, splits.sample_shape
        return num_classes, tuple(shape) if shape is not None else None

    def build_model(self) -> nn.Module:
        """The config's model with these weights, on the CPU (call ``.eval()`` to predict)."""
        objects = self.metadata.get("objects", {})
        if "model" in objects:
            raise ConfigError(f"{self.metadata['source']}: its model ({objects['model']}) was "
                              "passed to fit() as an object, so the config cannot rebuild it",
                              "build it yourself and call "
                              "model.load_state_dict(loaded.model_state)")
        num_classes, shape = self.shapes()
        model = models.build_model(self.config.model, num_classes, shape,
                                   self.config.train.seed)
        if self.metadata.get("transformers") and hasattr(model, "tie_weights"):
            model.load_state_dict(self.model_state, strict=False)  # tied weights are saved once
            model.tie_weights()  # type: ignore[operator]
        else:
            model.load_state_dict(self.model_state)
        return model


def load_checkpoint(path: str | Path) -> LoadedCheckpoint:
    """The model state, the config and the metadata of `path`, verified by checksum: a
    ``ckpt-*.pt`` file, a checkpoint directory (its newest valid checkpoint, as a resume picks
    it) or an export directory (``ddp-trainer export``, ``<output.dir>/model``).

    Raises :class:`trainer.errors.CheckpointError` (one line, ``exit_code`` 2) when there is
    nothing valid to load.
    """
    if not str(path):  # Path("") is the current directory
        raise CheckpointError("the checkpoint path is empty",
                              "pass a ckpt-*.pt file, a --checkpoint-dir or an export directory")
    path = Path(path)
    if not path.exists():
        why, fix = missing(path, "pass a ckpt-*.pt file, a --checkpoint-dir or an exported "
                           "model directory")
        raise CheckpointError(f"checkpoint {path} {why}", fix)
    if path.is_dir() and (path / META).exists():
        return _load_export(path)
    if path.is_dir() and not sharded_checkpoint.is_checkpoint(path):
        found = checkpoint.latest_payload(path)  # as a resume picks it; its bytes verified
        if found is None:
            raise CheckpointError(f"{path} holds no valid checkpoint (ckpt-*.pt) and no "
                                  f"exported model ({META})",
                                  "pass the --checkpoint-dir of a run that saved one, a "
                                  "ckpt-*.pt file, or an export directory")
        payload, path = found
    else:
        payload = checkpoint.read_payload(path)
    raw = checkpoint.deserialize(payload, str(path))
    if sharded_checkpoint.is_checkpoint(path):
        raw = sharded_checkpoint.with_shards(raw, path)
    state = training_state(raw, str(path), ("config", "model"))
    source = f"checkpoint {path}"
    config = merge(JobConfig(), saved_config(state, source), source)
    metadata = {k: v for k, v in state.items() if k not in TRAINING_ONLY}
    metadata.update(source=str(path), sha256=checkpoint.stored_digest(path),
                    objects=dict(state.get("objects") or {}),
                    class_names=list(state.get("class_names") or []) or None)
    model_state = {k: v.detach().cpu() for k, v in state["model"].items()
                   if isinstance(v, torch.Tensor)}
    return LoadedCheckpoint(model_state, config, metadata)


def _load_export(directory: Path) -> LoadedCheckpoint:
    fix = f"export it again (ddp-trainer export --force --out {directory})"
    try:
        meta = json.loads((directory / META).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{directory / META} cannot be read ({exc})", fix) from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or "weights" not in meta:
        raise CheckpointError(f"{directory / META} does not describe an exported model", fix)
    weights = directory / str(meta["weights"])
    try:
        actual = sha256_of(weights)
    except OSError as exc:
        raise CheckpointError(f"exported model {weights} cannot be read ({exc.strerror})",
                              fix) from None
    if actual != meta.get("sha256"):
        raise CheckpointError(f"exported model {weights} fails its checksum", fix)
    try:
        if weights.suffix == ".safetensors":
            from safetensors.torch import load_file

            model_state = load_file(str(weights))
        else:
            model_state = torch.load(weights, weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any failure to decode means a bad file
        raise CheckpointError(f"exported model {weights} cannot be loaded ({exc})", fix) \
            from None
    source = f"exported model {directory}"
    try:
        config = merge(JobConfig(), saved_config(meta, source), source)
    except KeyError:
        raise CheckpointError(f"{directory / META} holds no config", fix) from None
    metadata = {k: v for k, v in meta.items() if k != "config"}
    metadata.update(source=str(directory), objects=dict(meta.get("objects") or {}))
    return LoadedCheckpoint(model_state, config, metadata)
