"""Bring-your-own input that is wrong: one line naming the problem and the fix, exit 2, before
any optimizer step, and an earlier run's outputs untouched."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import REPO, run_cli

FIXTURES = str(REPO / "tests" / "fixtures")


def _train(tmp_path: Path, *args: str, launcher: bool = False) -> tuple[int, str, list[str]]:
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    (out / "summary.json").write_text('{"earlier": true}\n')
    cmd = ("run", "--nproc-per-node", "2") if launcher else ("train",)
    proc = run_cli(*cmd, "--epochs", "1", "--metrics-port", "0", "--output-dir", str(out),
                   *args, env={"PYTHONPATH": f"{REPO}:{FIXTURES}"})
    assert (out / "summary.json").read_text() == '{"earlier": true}\n', "an output was lost"
    assert not (out / "steps.jsonl").exists(), "a step ran"
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert "Traceback" not in proc.stderr, proc.stderr
    assert errors and all("(fix:" in e for e in errors), proc.stderr
    return proc.returncode, errors[0], errors


@pytest.mark.parametrize(("args", "needles"), [
    (["--model", "nosuchpkg.models:Net"], ["module 'nosuchpkg.models'", "cannot be imported"]),
    (["--model", "userplugins:NoSuchNet"], ["module 'userplugins' has no attribute 'NoSuchNet'"]),
    (["--model", "userplugins:NOT_CALLABLE"], ["is a int, not a callable"]),
    (["--model", "userplugins_broken:Net"], ["raised RuntimeError: CUDA_HOME is not set"]),
    (["--model", "userplugins:raising_model"],
     ["userplugins:raising_model(num_classes) raised ValueError: depth must be even"]),
    (["--model", "userplugins:not_a_module"], ["returned a str, not a torch.nn.Module"]),
    (["--dataset", "userplugins:not_a_dataset"], ["is a dict, not a Dataset"]),
    (["--dataset", "userplugins:stream_dataset"], ["IterableDataset", "random access"]),
    (["--dataset", "userplugins:text_dataset", "--model", "userplugins:plain_model"],
     ["batch['text'][0] is a str, not a tensor"]),
    (["--dataset", "userplugins:five_classes", "--model", "userplugins:wide_model"],
     ["returns 7 logits per sample but the dataset has 5 classes"]),
    (["--dataset", "userplugins:five_classes", "--model", "userplugins:narrow_model"],
     ["returns 3 logits per sample but a label is 4"]),
    (["--dataset", "userplugins:five_classes", "--step", "userplugins:vector_loss_step"],
     ["returned a loss of shape (32,), not a scalar"]),
    (["--step", "userplugins:no_such_step"], ["has no attribute 'no_such_step'"]),
    (["--set", "data.options.samples=oops", "--dataset", "userplugins:five_classes"],
     ["five_classes(samples) raised TypeError"]),
])
def test_bad_user_input_is_one_line_exit_2(tmp_path: Path, args: list[str],
                                          needles: list[str]) -> None:
    code, first, _ = _train(tmp_path, *args)
    assert code == 2
    for needle in needles:
        assert needle in first, first


def test_launcher_rejects_an_unresolvable_import_path_before_any_rank_starts(
        tmp_path: Path) -> None:
    code, first, errors = _train(tmp_path, "--model", "userplugins:NoSuchNet", launcher=True)
    assert code == 2 and len(errors) == 1 and not first.startswith("[rank")
    assert "has no attribute 'NoSuchNet'" in first


def test_launcher_ranks_report_a_model_that_does_not_fit_the_labels(tmp_path: Path) -> None:
    code, first, _ = _train(tmp_path, "--dataset", "userplugins:five_classes", "--model",
                            "userplugins:narrow_model", launcher=True)
    assert code == 2 and "returns 3 logits per sample but a label is 4" in first


def _raise_line() -> str:
    """tests/fixtures/userplugins.py:LINE of the fixture model's `raise`."""
    source = (REPO / "tests" / "fixtures" / "userplugins.py").read_text().splitlines()
    line = next(i for i, text in enumerate(source, 1) if 'raise ValueError("bad input' in text)
    return f"{REPO / 'tests' / 'fixtures' / 'userplugins.py'}:{line} in forward"


def test_a_users_model_raising_on_one_rank_is_the_reported_cause_exit_5(tmp_path: Path) -> None:
    """Rank 1's model raises at its 20th training batch: rank 0 only sees it vanish (exit 4
    on its own), but the launcher reports rank 1's exception, file and line, exit 5."""
    proc = run_cli("run", "--nproc-per-node", "2", "--dataset", "digits", "--model",
                   "userplugins:fails_on_rank1", "--epochs", "2", "--metrics-port", "0",
                   "--output-dir", str(tmp_path), env={"PYTHONPATH": f"{REPO}:{FIXTURES}"})
    assert proc.returncode == 5, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    cause = f"user code raised ValueError: bad input at batch 20 at {_raise_line()}"
    lines = proc.stderr.splitlines()
    assert f"[rank 1] error: {cause} (fix: fix the error in your code" in "\n".join(lines)
    launcher = [line for line in lines if line.startswith("error: ")]
    assert len(launcher) == 1, proc.stderr
    assert launcher[0].startswith(f"error: rank 1: {cause}; the other ranks stopped"), launcher
    assert not (tmp_path / "summary.json").exists()


def test_a_users_model_raising_in_one_process_is_one_line_exit_5(tmp_path: Path) -> None:
    proc = run_cli("train", "--dataset", "digits", "--model", "userplugins:fails_on_rank1",
                   "--metrics-port", "0", "--output-dir", str(tmp_path),
                   env={"PYTHONPATH": f"{REPO}:{FIXTURES}", "FAIL_ON_RANK": "0"})
    assert proc.returncode == 5, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert errors == [f"error: user code raised ValueError: bad input at batch 20 at "
                      f"{_raise_line()} (fix: fix the error in your code; rerun with --debug "
                      "for the full traceback)"], proc.stderr
