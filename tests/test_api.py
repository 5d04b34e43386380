"""The Python API and the Trainer used standalone, in this process, with hand-made parts."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import REPO, free_port, read_json, run_cli
from torch import Tensor, nn
from torch.utils.data import Dataset

import trainer
from trainer.build import build_trainer
from trainer.components import checkpoint
from trainer.components.steps import ClassificationStep, StepOutput
from trainer.config import JobConfig
from trainer.data import IndexView, InMemoryDataset
from trainer.data.loaders import build_train_sampler, eval_loader, train_loader
from trainer.errors import ConfigError
from trainer.loop.parts import TrainParts
from trainer.metrics import NullSink
from trainer.placement import DistContext


def _blobs(n: int, seed: int) -> InMemoryDataset:
    """Two Gaussian blobs in 4-D: linearly separable."""
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 2
    x = torch.randn(n, 4, generator=g) + 4.0 * y[:, None].float()
    return InMemoryDataset(x, y)


class _PerSample(Dataset[dict[str, Tensor]]):
    """Mapping samples, fetched through a list-returning __getitems__ (torch's convention)."""

    def __init__(self, base: InMemoryDataset) -> None:
        self.base = base
        self.calls = 0

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i: int) -> dict[str, Tensor]:
        x, y = self.base[i]
        return {"x": x, "labels": y}

    def __getitems__(self, indices: list[int]) -> list[dict[str, Tensor]]:
        self.calls += 1
        return [self[i] for i in indices]


class _KwargModel(nn.Module):
    """Keyword-argument forward returning .loss and .logits, like a transformers model."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 2)

    def forward(self, x: Tensor, labels: Tensor) -> Any:
        logits = self.linear(x)
        return type("Out", (), {"loss": nn.functional.cross_entropy(logits, labels),
                                "logits": logits})()


def _cfg(tmp_path: Path, **train: Any) -> dict[str, Any]:
    return {"train": {"epochs": 3, "batch_size": 16, **train}, "optim": {"lr": 0.1},
            "metrics": {"port": 0}, "output": {"dir": str(tmp_path)}}


def test_fit_trains_a_model_and_dataset_given_as_objects(tmp_path: Path) -> None:
    summary = trainer.fit(_cfg(tmp_path), model=nn.Linear(4, 2), dataset=_blobs(400, 0))
    assert summary["world_size"] == 1 and summary["val_total"] == 80
    assert summary["val_accuracy"] >= 0.95
    assert (tmp_path / "summary.json").is_file()


def test_fit_takes_a_train_val_pair_without_splitting_it(tmp_path: Path) -> None:
    summary = trainer.fit(_cfg(tmp_path), model=nn.Linear(4, 2),
                          dataset=(_blobs(300, 1), _blobs(77, 2)))
    assert summary["val_total"] == 77 and summary["samples"] == 3 * 300


def test_mapping_batches_use_the_models_own_loss_and_list_getitems(tmp_path: Path) -> None:
    data = _PerSample(_blobs(320, 3))
    summary = trainer.fit(_cfg(tmp_path), model=_KwargModel(), dataset=data)
    assert data.calls > 0 and summary["val_accuracy"] >= 0.95


def test_a_custom_step_object_scores_what_it_returns(tmp_path: Path) -> None:
    def count_everything_correct(model: nn.Module, batch: Any) -> StepOutput:
        x, y = batch
        return StepOutput(nn.functional.cross_entropy(model(x), y), len(y), len(y))

    summary = trainer.fit(_cfg(tmp_path), model=nn.Linear(4, 2), dataset=_blobs(200, 4),
                          step=count_everything_correct)
    assert summary["val_accuracy"] == 1.0 and summary["val_total"] == 40


def test_checkpoint_of_an_object_model_needs_the_model_to_evaluate(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    cfg["checkpoint"] = {"dir": str(tmp_path / "ckpt")}
    cfg["data"] = {"dataset": "synthetic", "synthetic_features": 4, "synthetic_classes": 2}
    net = nn.Linear(4, 2)
    trained = trainer.fit(cfg, model=net)
    ckpt = checkpoint.list_checkpoints(tmp_path / "ckpt")[0]
    with pytest.raises(ConfigError, match="was passed to fit\\(\\) as an object"):
        trainer.evaluate(ckpt, output_dir=tmp_path / "eval")
    report = trainer.evaluate(ckpt, model=nn.Linear(4, 2), output_dir=tmp_path / "eval")
    assert report["correct"] == trained["val_correct"]


def test_fit_rejects_a_config_of_the_wrong_kind() -> None:
    with pytest.raises(ConfigError, match="config is a int"):
        trainer.fit(3)  # type: ignore[arg-type]


_ALONE = DistContext(0, 1, 0, 1, torch.device("cpu"), "gloo", False)


def _hand_made_parts(seed: int) -> TrainParts:
    """A linear model on blobs (256 train, 64 validation), every part built here."""
    ctx = _ALONE
    train_set = IndexView(_blobs(256, seed))
    val_set = IndexView(_blobs(64, seed + 1))
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    sampler = build_train_sampler("shuffle", train_set, ctx, seed=0)
    val, valid = eval_loader(val_set, 32, ctx)
    return TrainParts(
        model=model, wrapped=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        step=ClassificationStep(), train_set=train_set, sampler=sampler,
        train_loader=lambda micro: train_loader(train_set, sampler, micro, ctx, 0),
        val_loader=val, val_valid=valid, num_classes=2)


def test_trainer_runs_on_parts_built_by_hand(tmp_path: Path) -> None:
    ctx, parts = _ALONE, _hand_made_parts(5)
    cfg = JobConfig()
    cfg.train.epochs, cfg.train.batch_size, cfg.output.dir = 2, 16, str(tmp_path)
    summary = build_trainer(cfg, ctx, parts, NullSink()).train()
    assert summary["steps"] == 2 * 16 and summary["val_total"] == 64
    assert summary["val_accuracy"] >= 0.95


def test_the_trainers_steps_match_a_hand_written_loop_bit_for_bit(tmp_path: Path) -> None:
    # The Trainer drops gradients without optimizer.zero_grad's profiler range and counts
    # training hits later (Top1): the updates and the hits must still be exactly a plain loop's.
    ctx, parts = _ALONE, _hand_made_parts(5)
    parts.optimizer = torch.optim.SGD(parts.model.parameters(), lr=0.1, momentum=0.9)
    cfg = JobConfig()
    cfg.train.epochs, cfg.train.batch_size, cfg.output.dir = 1, 16, str(tmp_path)
    cfg.train.log_every, cfg.train.log_seconds = 16, 0.0  # one interval: the whole epoch
    sink = _Recorder()
    summary = build_trainer(cfg, ctx, parts, sink).train()
    reference = _hand_made_parts(5)
    opt = torch.optim.SGD(reference.model.parameters(), lr=0.1, momentum=0.9)
    reference.sampler.set_epoch(0)
    hits = 0
    for x, y in reference.train_loader(16):
        opt.zero_grad(set_to_none=True)
        logits = reference.model(x)
        nn.functional.cross_entropy(logits, y).backward()
        opt.step()
        hits += int((logits.argmax(1) == y).sum())
    for mine, theirs in zip(parts.model.parameters(), reference.model.parameters(), strict=True):
        assert torch.equal(mine, theirs)
    accuracy = [m["train/accuracy"] for m, _ in sink.logged if "train/accuracy" in m]
    assert summary["steps"] == 16 and 0 < hits < 256
    assert accuracy == [hits / 256]


def test_the_forward_time_reported_is_the_time_spent_in_the_step_function(
        tmp_path: Path) -> None:
    # trainer_forward_seconds_total is the straggler alert's measure: the step function's own
    # time, which the step function measures here itself, and less than the steps' time.
    import time

    inside: list[float] = []

    class Timed(ClassificationStep):
        def __call__(self, model: Any, batch: Any) -> Any:
            t0 = time.perf_counter()
            out = super().__call__(model, batch)
            if torch.is_grad_enabled():  # a training step, not a validation batch
                inside.append(time.perf_counter() - t0)
            return out

    ctx, parts = _ALONE, _hand_made_parts(5)
    parts.step = Timed()
    cfg = JobConfig()
    cfg.train.epochs, cfg.train.batch_size, cfg.output.dir = 1, 16, str(tmp_path)
    sink = _Recorder()
    build_trainer(cfg, ctx, parts, sink).train()
    reports = [m for m, _ in sink.logged if "train/forward_seconds" in m]
    forward = sum(m["train/forward_seconds"] for m in reports)
    steps = sum(sum(m["train/step_seconds"]) for m in reports)
    # The step function also runs in the checks before training (check_output); the last 16
    # calls with gradients are the epoch's steps (validation runs without).
    assert len(inside) >= 16 and sum(inside[-16:]) <= forward < steps, (inside, forward)


def test_an_optimizer_that_overrides_zero_grad_keeps_its_own(tmp_path: Path) -> None:
    calls = []

    class Counting(torch.optim.SGD):
        def zero_grad(self, set_to_none: bool = True) -> None:
            calls.append(set_to_none)
            super().zero_grad(set_to_none)

    ctx, parts = _ALONE, _hand_made_parts(5)
    parts.optimizer = Counting(parts.model.parameters(), lr=0.1)
    cfg = JobConfig()
    cfg.train.epochs, cfg.train.batch_size, cfg.output.dir = 2, 16, str(tmp_path)
    summary = build_trainer(cfg, ctx, parts, NullSink()).train()
    assert calls == [True] * summary["steps"] == [True] * 32


def test_a_trainer_used_alone_creates_its_checkpoint_dir_and_saves_there(tmp_path: Path) -> None:
    ctx, parts = _ALONE, _hand_made_parts(5)
    cfg = JobConfig()
    cfg.train.epochs, cfg.train.batch_size, cfg.output.dir = 2, 16, str(tmp_path)
    cfg.checkpoint.dir = str(tmp_path / "not" / "yet" / "there")
    cfg.checkpoint.every_seconds = 0  # a save every epoch end
    summary = build_trainer(cfg, ctx, parts, NullSink()).train()
    saved = checkpoint.list_checkpoints(Path(cfg.checkpoint.dir))
    assert [p.name for p in saved] == ["ckpt-000000032.pt", "ckpt-000000016.pt"]
    assert checkpoint.read(saved[0])["step"] == summary["steps"] == 32


def test_a_trainer_with_an_unwritable_checkpoint_dir_fails_before_training(
        tmp_path: Path) -> None:
    from trainer.errors import CheckpointError

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    cfg = JobConfig()
    cfg.output.dir, cfg.checkpoint.dir = str(tmp_path), str(blocker / "ckpt")
    with pytest.raises(CheckpointError, match="not writable"):
        build_trainer(cfg, _ALONE, _hand_made_parts(5), NullSink())


class _WorkerLoader:
    """A loader that says it forks worker processes, and records whether a checkpoint write
    was running each time it was started."""

    num_workers = 2
    multiprocessing_context = multiprocessing.get_context("fork")

    def __init__(self, loader: Any, writer: checkpoint.AsyncWriter,
                 seen: list[bool | str]) -> None:
        self.loader, self.writer, self.seen = loader, writer, seen

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Any:
        self.seen.append(self.writer.in_flight())
        return iter(self.loader)

    def close(self) -> None:
        self.seen.append("closed")


def test_loaders_with_workers_start_only_when_no_checkpoint_write_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A fork while the writer thread is inside torch.save can deadlock a worker
    # (data.worker_start=fork; seen in CI).
    import time

    save = checkpoint.save

    def slow_save(*args: Any) -> Path:
        time.sleep(0.2)  # a write still running when the next loader starts, unless awaited
        return save(*args)

    monkeypatch.setattr(checkpoint, "save", slow_save)
    ctx, parts = _ALONE, _hand_made_parts(5)
    cfg = JobConfig()
    cfg.train.epochs, cfg.train.batch_size, cfg.output.dir = 3, 16, str(tmp_path)
    cfg.checkpoint.dir = str(tmp_path / "c")
    cfg.checkpoint.every_seconds = 0  # with checkpoint.every 0: a save every epoch end
    t = build_trainer(cfg, ctx, parts, NullSink())
    seen: list[bool | str] = []
    train_loader = parts.train_loader
    parts.train_loader = lambda micro: _WorkerLoader(train_loader(micro), t.loop.saver.writer, seen)
    parts.val_loader = _WorkerLoader(parts.val_loader, t.loop.saver.writer, seen)  # type: ignore[assignment]
    summary = t.train()
    assert summary["epochs"] == 3 and len(checkpoint.list_checkpoints(tmp_path / "c")) == 3
    # 3 epochs and 3 validations, never beside a write; then both loaders' workers stopped
    # (a rank ends with os._exit, which would skip their finalizers)
    assert seen == [False] * 6 + ["closed"] * 2


class _Recorder:
    """A MetricsLogger that keeps what it is given."""

    def __init__(self) -> None:
        self.logged: list[tuple[dict[str, Any], int]] = []

    def log(self, metrics: Any, step: int) -> None:
        self.logged.append((dict(metrics), step))

    def close(self) -> None:
        pass


def test_a_log_interval_spanning_epochs_keeps_each_epochs_loss_and_step_epochs(
        tmp_path: Path) -> None:
    import json
    import math

    ctx, parts = _ALONE, _hand_made_parts(7)
    cfg = JobConfig()
    cfg.train.epochs, cfg.train.batch_size, cfg.output.dir = 4, 16, str(tmp_path)
    cfg.train.log_every = 1000  # fast steps: one interval, reported at the last step only
    metrics = _Recorder()
    summary = build_trainer(cfg, ctx, parts, metrics).train()
    rows = [json.loads(line) for line in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 65))
    assert [r["epoch"] for r in rows] == [(s - 1) // 16 for s in range(1, 65)]
    last_epoch = [r["loss"] for r in rows if r["epoch"] == 3]
    assert summary["train_loss"] == math.fsum(last_epoch) / 16
    reports = [m for m, _ in metrics.logged if "train/loss" in m]
    assert len(reports) == 1 and reports[0]["train/steps"] == 64.0
    assert len([m for m, _ in metrics.logged if "val/global_accuracy" in m]) == 4


def test_a_script_calling_fit_twice_on_two_ranks_trains_both_runs(tmp_path: Path) -> None:
    # The first fit() keeps the process group (see distributed.teardown); the second joins
    # the same one instead of failing to initialize it twice (a sweep, or train then tune).
    script = tmp_path / "twice.py"
    script.write_text(
        "import sys\nimport trainer\n"
        "for run, epochs in (('a', 1), ('b', 2)):\n"
        "    trainer.fit({'data': {'dataset': 'synthetic', 'synthetic_samples': 256},\n"
        "                 'train': {'epochs': epochs, 'batch_size': 32},\n"
        "                 'output': {'dir': sys.argv[1] + '/' + run}})\n")
    proc = run_cli("run", "--nproc-per-node", "2", "--metrics-port", "0", str(script),
                   str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    a, b = read_json(tmp_path / "a" / "summary.json"), read_json(tmp_path / "b" / "summary.json")
    assert (a["world_size"], a["epochs"]) == (2, 1) and (b["world_size"], b["epochs"]) == (2, 2)
    assert b["steps"] == 2 * a["steps"]


def test_a_script_whose_dataset_class_is_in_the_script_loads_with_workers(
        tmp_path: Path) -> None:
    # Workers start from a forkserver (data.worker_start): the dataset pickles as
    # __main__.Squares, which the workers find because the script is their __main__ too.
    script = tmp_path / "own_data.py"
    script.write_text(
        "import sys\nimport torch\nimport trainer\n"
        "class Squares(torch.utils.data.Dataset):\n"
        "    num_classes, sample_shape = 2, (2,)\n"
        "    def __len__(self):\n        return 256\n"
        "    def __getitem__(self, i):\n"
        "        return torch.tensor([float(i % 7), 1.0]), i % 7 % 2\n"
        "if __name__ == '__main__':\n"
        "    trainer.fit({'data': {'num_workers': 1}, 'train': {'epochs': 2, 'batch_size': 32},\n"
        "                 'output': {'dir': sys.argv[1]}}, dataset=Squares())\n")
    proc = run_cli("run", "--nproc-per-node", "2", "--metrics-port", "0", str(script),
                   str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    summary = read_json(tmp_path / "out" / "summary.json")
    assert (summary["world_size"], summary["epochs"], summary["val_total"]) == (2, 2, 51)


def test_an_unguarded_script_calling_fit_trains_once_with_workers(tmp_path: Path) -> None:
    # The Kubeflow SDK's CustomTrainer script calls the user's function at module level; a
    # forkserver (or spawn) worker imports that script as its main module and must not train.
    script = tmp_path / "unguarded.py"
    script.write_text(
        "import sys\nimport trainer\n"
        "trainer.fit({'data': {'num_workers': 1}, 'train': {'epochs': 2, 'batch_size': 32},\n"
        "             'dist': {'timeout_seconds': 60}, 'output': {'dir': sys.argv[1]}})\n")
    proc = run_cli("run", "--nproc-per-node", "2", "--metrics-port", "0", str(script),
                   str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = read_json(tmp_path / "out" / "summary.json")
    assert (summary["world_size"], summary["epochs"]) == (2, 2)


def test_fit_in_a_group_the_user_joined_with_another_size_is_one_clear_error(
        tmp_path: Path) -> None:
    # A one-rank group the script made itself, then an environment saying rank 1 of 2.
    script = tmp_path / "own_group.py"
    script.write_text(
        "import os\nimport torch.distributed as dist\nimport trainer\n"
        "from trainer.errors import ConfigError\n"
        "dist.init_process_group('gloo', init_method='tcp://127.0.0.1:' + os.environ['P'],\n"
        "                        rank=0, world_size=1)\n"
        "os.environ.update(WORLD_SIZE='2', RANK='1', LOCAL_RANK='1', LOCAL_WORLD_SIZE='2',\n"
        "                  MASTER_ADDR='127.0.0.1', MASTER_PORT=os.environ['P'])\n"
        "try:\n"
        "    trainer.fit({'data': {'dataset': 'synthetic', 'synthetic_samples': 64}})\n"
        "except ConfigError as err:\n"
        "    print('ERROR', err.problem, '|', err.fix)\n")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "P": str(free_port())}
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert "ERROR the process group already joined is rank 0 of 1 (gloo), but this run is " \
           "rank 1 of 2 (gloo)" in proc.stdout, proc.stdout + proc.stderr
    assert "destroy the group" in proc.stdout


def test_no_validation_split_reports_no_accuracy_and_evaluate_refuses(tmp_path: Path) -> None:
    # data.val_fraction 0: "val accuracy 0.0 (0/0)" was a false number in summary.json and on
    # the dashboard; it is null, no validation series is set, and evaluate says why it
    # cannot score.
    from trainer.errors import ConfigError

    metrics = _Recorder()
    parts = _hand_made_parts(3)
    cfg = JobConfig()
    cfg.train.epochs, cfg.train.batch_size, cfg.output.dir = 1, 16, str(tmp_path)
    parts.val_loader, parts.val_valid = [], 0
    summary = build_trainer(cfg, _ALONE, parts, metrics).train()
    assert summary["val_total"] == 0
    assert summary["val_accuracy"] is None and summary["val_loss"] is None
    assert not [m for m, _ in metrics.logged if any(k.startswith("val/") for k in m)]
    trainer.fit({"data": {"dataset": "digits", "val_fraction": 0.0},
                 "train": {"epochs": 1, "batch_size": 64}, "metrics": {"port": 0},
                 "checkpoint": {"dir": str(tmp_path / "c")},
                 "output": {"dir": str(tmp_path / "out")}})
    with pytest.raises(ConfigError, match="has no validation samples to score"):
        trainer.evaluate(tmp_path / "c", output_dir=tmp_path / "e")
