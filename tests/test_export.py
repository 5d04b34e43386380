"""The trained model out: `ddp-trainer export`, `output.export` and `trainer.load_checkpoint`,
on real runs trained in this process (digits; the mytask transformers classifier), loaded by
safetensors and transformers alone."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import REPO, read_json
from safetensors.torch import load_file
from torch import nn

import trainer
from trainer.cli import main
from trainer.data import build_splits
from trainer.errors import CheckpointError
from trainer.ranks.dirlock import LOCK_NAME

SEED = 0  # every run here is seeded; printed with the accuracies below
QUIET = {"metrics": {"port": 0, "linger_seconds": 0}}


def _fit(tmp: Path, export: bool = True, steps: int = 40, **sections: Any) -> dict[str, Any]:
    config = {"data": {"dataset": "digits"}, "train": {"max_steps": steps, "seed": SEED},
              "checkpoint": {"dir": str(tmp / "ckpt")},
              "output": {"dir": str(tmp / "outputs"), "export": export}, **QUIET, **sections}
    return trainer.fit(config)


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real training run: its checkpoints in ckpt/, its outputs (and model/) in outputs/, as
    `make run` leaves them."""
    tmp = tmp_path_factory.mktemp("digits")
    _fit(tmp)
    return tmp


def _plain_mlp() -> nn.Module:
    """The default MLP (64 -> 128 -> 64 -> 10) written with torch alone, keys as exported."""
    holder = nn.Module()
    holder.net = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(),
                               nn.Linear(64, 10))
    return holder


def _accuracy(model: nn.Module, config: trainer.JobConfig) -> float:
    val = build_splits(config.data, config.train.seed).val
    x, y = val.batch(list(range(len(val))))
    with torch.no_grad():
        logits = model(x)
    return float((logits.argmax(1) == y).double().mean().item())


def _export(*args: str, capfd: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """The CLI in this process; its logging set-up (a handler on the captured stderr) undone."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        code = main(["export", *args])
    finally:
        root.handlers[:], root.level = handlers, level
    out, err = capfd.readouterr()
    return code, out, err


def test_an_exported_checkpoint_loads_with_safetensors_alone_and_scores_as_evaluate(
        digits_run: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    code, out, err = _export("--checkpoint", str(digits_run / "ckpt"),
                             "--out", str(tmp_path / "model"), capfd=capfd)
    assert code == 0, err
    assert "model.safetensors" in out and "ddp-trainer.json" in out
    evaluated = trainer.evaluate(digits_run / "ckpt", output_dir=tmp_path / "eval")
    state = load_file(str(tmp_path / "model" / "model.safetensors"))
    holder = _plain_mlp()
    holder.load_state_dict(state)
    val = build_splits(trainer.load_config({"data": {"dataset": "digits"}}).data, SEED).val
    x, y = val.batch(list(range(len(val))))
    with torch.no_grad():
        accuracy = (holder.net(x.flatten(1)).argmax(1) == y).double().mean().item()
    print(f"seed {SEED}: safetensors alone {accuracy}, evaluate {evaluated['accuracy']}")
    assert accuracy == evaluated["accuracy"] > 0.5
    meta = json.loads((tmp_path / "model" / "ddp-trainer.json").read_text())
    assert meta["step"] == 40 and meta["num_classes"] == 10 and meta["sample_shape"] == [1, 8, 8]
    assert meta["config"]["data"]["dataset"] == "digits" and meta["transformers"] is False


def test_format_torch_writes_a_plain_state_dict_that_torch_load_reads(
        digits_run: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    code, _, err = _export("--checkpoint", str(digits_run / "ckpt"), "--out",
                           str(tmp_path / "m"), "--format", "torch", capfd=capfd)
    assert code == 0, err
    state = torch.load(tmp_path / "m" / "model.pt", weights_only=True)
    expected = trainer.load_checkpoint(digits_run / "ckpt").model_state
    assert state.keys() == expected.keys()
    assert all(torch.equal(state[k], expected[k]) for k in state)


def test_a_finished_run_exports_its_final_model_into_output_dir(digits_run: Path) -> None:
    exported = digits_run / "outputs" / "model"
    assert sorted(p.name for p in exported.iterdir()) == ["ddp-trainer.json",
                                                          "model.safetensors"]
    final = trainer.load_checkpoint(digits_run / "ckpt")  # the end of training is saved
    state = load_file(str(exported / "model.safetensors"))
    assert state.keys() == final.model_state.keys()
    assert all(torch.equal(state[k], final.model_state[k]) for k in state)
    meta = json.loads((exported / "ddp-trainer.json").read_text())
    summary = read_json(digits_run / "outputs" / "summary.json")
    assert meta["val_accuracy"] == summary["val_accuracy"]


def test_output_export_false_writes_no_model(tmp_path: Path) -> None:
    _fit(tmp_path, export=False, steps=2)
    assert (tmp_path / "outputs" / "summary.json").exists()
    assert not (tmp_path / "outputs" / "model").exists()
    # no temporary export left (the run's directory lock file stays: trainer/ranks/dirlock.py)
    assert [p.name for p in (tmp_path / "outputs").iterdir()
            if p.name.startswith(".") and p.name != LOCK_NAME] == []


def test_load_checkpoint_reads_a_file_a_directory_and_an_export_alike(digits_run: Path) -> None:
    newest = sorted((digits_run / "ckpt").glob("ckpt-*.pt"))[-1]
    loaded = [trainer.load_checkpoint(p) for p in
              (newest, digits_run / "ckpt", digits_run / "outputs" / "model")]
    for one in loaded:
        assert one.metadata["step"] == 40 and one.config.data.dataset == "digits"
        assert one.model_state.keys() == loaded[0].model_state.keys()
        assert all(torch.equal(one.model_state[k], loaded[0].model_state[k])
                   for k in one.model_state)
    assert loaded[0].metadata["source"] == str(newest) == loaded[1].metadata["source"]
    summary = read_json(digits_run / "outputs" / "summary.json")
    model = loaded[2].build_model().eval()
    assert _accuracy(model, loaded[2].config) == summary["val_accuracy"]


def test_load_checkpoint_refuses_a_corrupt_checkpoint_and_a_tampered_export(
        digits_run: Path, tmp_path: Path) -> None:
    newest = sorted((digits_run / "ckpt").glob("ckpt-*.pt"))[-1]
    bad = tmp_path / newest.name
    raw = bytearray(newest.read_bytes())
    raw[-10] ^= 0xFF
    bad.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="fails its checksum"):
        trainer.load_checkpoint(bad)
    export = tmp_path / "model"
    export.mkdir()
    for p in (digits_run / "outputs" / "model").iterdir():
        export.joinpath(p.name).write_bytes(p.read_bytes())
    weights = export / "model.safetensors"
    raw = bytearray(weights.read_bytes())
    raw[-1] ^= 0xFF
    weights.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="fails its checksum"):
        trainer.load_checkpoint(export)


def _one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("error: ") and "(fix: " in lines[0], err
    return lines[0]


@pytest.mark.parametrize(("case", "expected"), [
    ("missing", "does not exist"),
    ("corrupt", "fails its checksum"),
    ("empty-dir", "holds no valid checkpoint"),
    ("not-a-checkpoint", "not a ddp-trainer checkpoint"),
])
def test_export_of_bad_input_is_one_line_exit_2_and_writes_nothing(
        case: str, expected: str, digits_run: Path, tmp_path: Path,
        capfd: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "source"
    if case == "corrupt":
        source.mkdir()
        newest = sorted((digits_run / "ckpt").glob("ckpt-*.pt"))[-1]
        raw = bytearray(newest.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        source = source / newest.name
        source.write_bytes(bytes(raw))
    elif case == "empty-dir":
        source.mkdir()
    elif case == "not-a-checkpoint":
        source.write_text("hello\n")
    code, _, err = _export("--checkpoint", str(source), "--out", str(tmp_path / "model"),
                           capfd=capfd)
    assert code == 2 and expected in _one_error_line(err)
    assert not (tmp_path / "model").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".model")]


def test_export_keeps_an_existing_out_unless_forced(digits_run: Path, tmp_path: Path,
                                                    capfd: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "model"
    out.mkdir()
    (out / "mine.txt").write_text("keep me\n")
    code, _, err = _export("--checkpoint", str(digits_run / "ckpt"), "--out", str(out),
                           capfd=capfd)
    assert code == 2 and "--force" in _one_error_line(err)
    assert [p.name for p in out.iterdir()] == ["mine.txt"]
    assert (out / "mine.txt").read_text() == "keep me\n"
    afile = tmp_path / "afile"
    afile.write_text("x")
    code, _, err = _export("--checkpoint", str(digits_run / "ckpt"), "--out", str(afile),
                           capfd=capfd)
    assert code == 2 and "is a file" in _one_error_line(err) and afile.read_text() == "x"
    code, _, err = _export("--checkpoint", str(digits_run / "ckpt"), "--out", str(out),
                           "--force", capfd=capfd)
    assert code == 0, err
    assert sorted(p.name for p in out.iterdir()) == ["ddp-trainer.json", "model.safetensors"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "model"]  # nothing left


def test_an_unknown_format_is_a_usage_error(digits_run: Path, tmp_path: Path,
                                            capfd: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["export", "--checkpoint", str(digits_run / "ckpt"), "--out",
              str(tmp_path / "m"), "--format", "onnx"])
    assert exit_.value.code == 2
    assert "invalid choice: 'onnx'" in _one_error_line(capfd.readouterr().err)


@pytest.fixture
def mytask(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(REPO / "examples" / "mytask"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.mark.slow  # transformers' import and a BERT: ~10 s, kept out of make test-fast
def test_a_transformers_model_exports_as_save_pretrained_and_loads_offline(
        mytask: None, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    from transformers import AutoModelForSequenceClassification

    config = {"data": {"dataset": "mytask.text:SentimentDataset",
                       "options": {"samples": 64}},
              "model": {"name": "mytask.text:tiny_bert", "options": {"hidden_size": 16}},
              "optim": {"name": "adamw", "lr": 0.003},
              "train": {"max_steps": 3, "batch_size": 8, "seed": SEED},
              "checkpoint": {"dir": str(tmp_path / "ckpt")},
              "output": {"dir": str(tmp_path / "out")}, **QUIET}
    trainer.fit(config)
    code, _, err = _export("--checkpoint", str(tmp_path / "ckpt"), "--out",
                           str(tmp_path / "hf"), capfd=capfd)
    assert code == 0, err
    from mytask.text import SentimentDataset

    batch = SentimentDataset(8, seed=1)[list(range(8))]
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    reference = trainer.load_checkpoint(tmp_path / "ckpt").build_model().eval()
    with torch.no_grad():
        expected = reference(**inputs).logits
    for exported in (tmp_path / "hf", tmp_path / "out" / "model"):
        assert {"config.json", "model.safetensors", "ddp-trainer.json"} <= {
            p.name for p in exported.iterdir()}
        model = AutoModelForSequenceClassification.from_pretrained(
            str(exported), local_files_only=True).eval()
        with torch.no_grad():
            assert torch.allclose(model(**inputs).logits, expected, atol=1e-6), exported
    assert "mytask" in sys.modules  # the classifier was the example's, built by the config


def readme_snippet() -> str:
    """The python block of the README's "Use your model"."""
    readme = (REPO / "README.md").read_text()
    start = readme.index("```python\n", readme.index("### Use your model")) + 10
    return readme[start:readme.index("\n```", start)]


def test_the_readmes_use_your_model_snippet_prints_the_runs_val_accuracy(
        digits_run: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(digits_run)  # a run as make run's: outputs/model, outputs/summary.json
    exec(compile(readme_snippet(), "README.md", "exec"), {})  # noqa: S102 - the doc's code
    printed = capsys.readouterr().out.split()
    summary = read_json(digits_run / "outputs" / "summary.json")
    print(f"seed {SEED}: snippet {printed}, summary {summary['val_accuracy']}")
    assert [float(printed[-1])] == [summary["val_accuracy"]] and len(printed) == 1


def test_a_checkpoint_whose_dataset_is_gone_exports_its_plain_state_dict(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    import numpy as np

    rng = np.random.default_rng(SEED)
    y = rng.integers(0, 3, 120)
    x = (rng.standard_normal((120, 6)) + y[:, None]).astype("float32")
    data = tmp_path / "small.npz"
    np.savez(data, x=x, y=y)
    _fit(tmp_path, steps=4, data={"dataset": str(data)})
    data.unlink()  # the checkpoint was copied to a machine without the data
    code, _, err = _export("--checkpoint", str(tmp_path / "ckpt"), "--out",
                           str(tmp_path / "model"), capfd=capfd)
    assert code == 0, err
    assert "the model is not rebuilt" in err and "writing its state_dict alone" in err
    state = load_file(str(tmp_path / "model" / "model.safetensors"))
    assert state.keys() == trainer.load_checkpoint(tmp_path / "ckpt").model_state.keys()
    meta = json.loads((tmp_path / "model" / "ddp-trainer.json").read_text())
    assert meta["num_classes"] is None and meta["config"]["data"]["dataset"] == str(data)


def test_an_empty_out_or_checkpoint_is_one_line_exit_2(digits_run: Path, tmp_path: Path,
                                                      capfd: pytest.CaptureFixture[str]) -> None:
    code, _, err = _export("--checkpoint", str(digits_run / "ckpt"), "--out", "", capfd=capfd)
    assert code == 2 and "--out is empty" in _one_error_line(err)
    code, _, err = _export("--checkpoint", "", "--out", str(tmp_path / "m"), capfd=capfd)
    assert code == 2 and "the checkpoint path is empty" in _one_error_line(err)
    assert list(tmp_path.iterdir()) == []


def test_a_disk_full_mid_export_keeps_the_previous_export_whole(
        digits_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capfd: pytest.CaptureFixture[str]) -> None:
    import errno

    from trainer.export import files

    out = tmp_path / "model"
    assert _export("--checkpoint", str(digits_run / "ckpt"), "--out", str(out),
                   capfd=capfd)[0] == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def full(*args: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files, "_write_weights", full)
    code, _, err = _export("--checkpoint", str(digits_run / "ckpt"), "--out", str(out),
                           "--force", "--format", "torch", capfd=capfd)
    assert code == 2 and "No space left on device" in _one_error_line(err)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["model"]  # no temporary directory left


@pytest.mark.slow  # imports transformers (~5 s)
def test_class_names_become_the_transformers_labels_and_the_model_is_left_as_it_was(
        mytask: None, tmp_path: Path) -> None:
    from mytask.text import tiny_bert
    from transformers import AutoConfig

    from trainer.export.files import write_export

    model = tiny_bert(2, hidden_size=16)
    before = dict(model.config.id2label)
    write_export(tmp_path / "m", model.state_dict(), {"class_names": ["negative", "positive"]},
                 model=model)
    saved = AutoConfig.from_pretrained(str(tmp_path / "m"), local_files_only=True)
    assert saved.id2label == {0: "negative", 1: "positive"}
    assert model.config.id2label == before
