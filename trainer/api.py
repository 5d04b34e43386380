"""The Python API, for people who write their own training script.

    import trainer

    def main():
        summary = trainer.fit({"train": {"epochs": 3}}, model=MyNet(), dataset=my_dataset)

    if __name__ == "__main__":
        main()

Run it alone (one process), or on N ranks with the embedded launcher and one metrics
endpoint: ``ddp-trainer run --nproc-per-node N script.py [args]``. :func:`fit` does exactly
what ``ddp-trainer train`` does — the same checkpoints, resume, metrics and ``summary.json``.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import nn

from trainer.components.steps import StepFn
from trainer.config import JobConfig
from trainer.config_load import build_config, merge, validate
from trainer.errors import ConfigError

ConfigLike = JobConfig | Mapping[str, Any] | str | Path | None


def load_config(config: ConfigLike = None) -> JobConfig:
    """A validated JobConfig from a JobConfig, a ``{section: {key: value}}`` mapping (as in the
    YAML file), a YAML file path, or None (the defaults)."""
    if config is None:
        cfg = JobConfig()
    elif isinstance(config, JobConfig):
        cfg = config
    elif isinstance(config, Mapping):
        cfg = merge(JobConfig(), dict(config), "fit() config")
    elif isinstance(config, (str, Path)):
        return build_config(str(config), {})
    else:
        raise ConfigError(f"config is a {type(config).__name__}",
                          "pass a JobConfig, a mapping of sections, a YAML path or None")
    validate(cfg)
    return cfg


def fit(config: ConfigLike = None, *, model: nn.Module | None = None, dataset: Any = None,
        step: StepFn | None = None) -> dict[str, Any]:
    """Train on this rank, as ``ddp-trainer train`` does; return the summary.

    `model` (an nn.Module), `dataset` (a map-style Dataset, split by ``data.val_fraction``,
    or a ``(train, val)`` pair) and `step` (``(model, batch) -> StepOutput | (loss, correct,
    count)``) replace what the config names. Raises a :class:`trainer.errors.TrainerError`
    (with ``exit_code``) on bad input, divergence, a lost rank or SIGTERM.
    """
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        # A data-loader worker (forkserver or spawn) is importing the main script to unpickle
        # what it defines, and the script calls fit() unguarded, as the Kubeflow SDK's generated
        # CustomTrainer script does: the call is the parent's to make, not the worker's.
        return {}
    from trainer.ranks import runner

    return runner.train(load_config(config), model=model, dataset=dataset, step=step)


def evaluate(checkpoint: str | Path, *, model: nn.Module | None = None, dataset: Any = None,
             step: StepFn | None = None, output_dir: str | Path = "outputs") -> dict[str, Any]:
    """Exact validation accuracy of a checkpoint on this rank (``ddp-trainer evaluate``).

    Pass again whatever was passed to fit() as an object; the rest is rebuilt from the
    checkpoint's config.
    """
    from trainer.ranks import runner

    return runner.evaluate_checkpoint(str(checkpoint), None, str(output_dir), model=model,
                                      dataset=dataset, step=step)
