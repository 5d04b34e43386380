"""Bad input that used to end in a traceback, a multi-line message or silence: each is one
line ``error: ... (fix: ...)`` with exit 2 (input), no traceback, and nothing touched."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import REPO, run_cli

from tests.robustness.harness import Case, assert_one_error_line, assert_unchanged, snapshot
from trainer.components import checkpoint

QUICK = ("--dataset", "synthetic", "--metrics-port", "0", "--output-dir", "{tmp}/out")
"""Every case writes its outputs into its own directory, which holds earlier outputs."""


def _file(name: str, data: bytes) -> object:
    def setup(tmp: Path) -> None:
        (tmp / name).write_bytes(data)
    return setup


def _dir(name: str) -> object:
    def setup(tmp: Path) -> None:
        (tmp / name).mkdir()
    return setup


def _loop(tmp: Path) -> None:
    (tmp / "loop-a").symlink_to(tmp / "loop-b")
    (tmp / "loop-b").symlink_to(tmp / "loop-a")


def _one_class_folder(tmp: Path) -> None:
    from tests.data.datagen import images

    images(tmp / "pics", classes=("cat",), per_class=6)


def _npz(name: str, y_dtype: str = "int64", features: int = 3, label: int = 1) -> object:
    def setup(tmp: Path) -> None:
        import numpy as np

        y = (np.arange(20) % 2).astype(y_dtype)
        y[3] = label
        np.savez(tmp / name, x=np.ones((20, features), dtype=np.float32), y=y)
    return setup


DEEP = "[" * 3000 + "]" * 3000
"""A list nested 3000 levels deep: PyYAML's loader recursed into a RecursionError."""


def _foreign_payload(tmp: Path) -> None:
    checkpoint.save(tmp, 7, {"weights": torch.zeros(2)}, keep=1)  # our header, not our state


CASES = [
    # flags and --set values whose range used to crash deep inside torch or Python
    Case("timeout-inf", ("run", "--nproc-per-node", "2", "--timeout", "inf", *QUICK), 2,
         ("dist.timeout_seconds",)),
    Case("timeout-1e300", ("run", "--nproc-per-node", "2", "--timeout", "1e300", *QUICK), 2,
         ("dist.timeout_seconds",)),
    Case("evaluate-timeout-inf", ("evaluate", "--checkpoint", "{tmp}", "--timeout", "inf",
                                  "--output-dir", "{tmp}/out"), 2, ("--timeout",)),
    Case("seed-huge", ("train", "--seed", "99999999999999999999999", *QUICK), 2,
         ("train.seed",)),
    Case("lr-400-digits", ("train", "--set", "optim.lr=1" + "0" * 400, *QUICK), 2,
         ("optim.lr",)),
    Case("epochs-400-digits", ("train", "--set", "train.epochs=1" + "0" * 400, *QUICK), 2,
         ("train.epochs",)),
    Case("format-with-builtin-dataset", ("train", "--set", "data.format=parquet", *QUICK), 2,
         ("data.format", "'synthetic'")),
    Case("weight-decay-inf", ("train", "--set", "optim.weight_decay=.inf", *QUICK), 2,
         ("optim.weight_decay",)),
    # sizes whose weights cannot fit: they used to initialise until the OOM killer came
    Case("hidden-sizes-huge", ("train", "--set", "model.hidden_sizes=[100000000000]", *QUICK),
         2, ("parameters", "GB of float32 weights", "model.hidden_sizes")),
    Case("num-classes-huge", ("train", "--set", "data.num_classes=1000000000", *QUICK), 2,
         ("parameters", "data.num_classes")),
    Case("builtin-model-bad-option", ("train", "--set", 'model.options={"bogus": 1}', *QUICK),
         2, ("model.name 'mlp'", "bogus", "model.options")),
    # output directories
    Case("output-dir-is-a-file", ("train", *QUICK[:-1], "{tmp}/out/summary.json"), 2,
         ("output.dir", "not a directory")),
    Case("output-dir-under-proc", ("train", *QUICK[:-1], "/proc/ddp-trainer-out"), 2,
         ("output.dir",)),
    Case("output-dir-empty", ("train", *QUICK[:-1], ""), 2, ("output.dir",)),
    Case("run-output-dir-is-a-file", ("run", "--nproc-per-node", "2", *QUICK[:-1],
                                      "{tmp}/out/summary.json"), 2, ("not a directory",)),
    Case("run-output-dir-under-proc", ("run", "--nproc-per-node", "2", *QUICK[:-1],
                                       "/proc/ddp-trainer-out"), 2, ("output.dir",)),
    Case("evaluate-output-dir-is-a-file", ("evaluate", "--checkpoint", "{tmp}/ckpt-000000007.pt",
                                           "--nproc-per-node", "2", "--output-dir",
                                           "{tmp}/out/summary.json"), 2, ("not a directory",),
         _foreign_payload),
    # --config files
    Case("config-proc-self-mem", ("train", "--config", "/proc/self/mem", *QUICK), 2,
         ("/proc/self/mem",)),
    Case("config-not-utf8", ("train", "--config", "{tmp}/c.yaml", *QUICK), 2,
         ("c.yaml", "UTF-8"), _file("c.yaml", b"train:\n  epochs: \xff\xfe\n")),
    Case("config-directory", ("train", "--config", "{tmp}/confdir", *QUICK), 2,
         ("confdir", "directory"), _dir("confdir")),
    Case("config-dev-null", ("train", "--config", "/dev/null", *QUICK), 2,
         ("/dev/null", "not a regular file")),
    Case("config-empty-name", ("train", "--config", "", *QUICK), 2, ("--config",)),
    Case("config-duplicate-key", ("train", "--config", "{tmp}/c.yaml", *QUICK), 2,
         ("duplicate key", "epochs"), _file("c.yaml", b"train:\n  epochs: 1\n  epochs: 2\n")),
    Case("config-duplicate-section", ("train", "--config", "{tmp}/c.yaml", *QUICK), 2,
         ("duplicate key", "train"),
         _file("c.yaml", b"train:\n  epochs: 1\noptim:\n  lr: 0.1\ntrain:\n  seed: 2\n")),
    Case("config-bad-yaml", ("train", "--config", "{tmp}/c.yaml", *QUICK), 2,
         ("c.yaml", "not valid YAML", "line"), _file("c.yaml", b"train: [1, 2\n")),
    # a symlink loop is named as one, not as a missing path
    Case("config-symlink-loop", ("train", "--config", "{tmp}/loop-a", *QUICK), 2,
         ("config file", "loop-a", "symlink loop"), _loop),
    Case("dataset-symlink-loop", ("train", *QUICK[:1], "{tmp}/loop-a", *QUICK[2:]), 2,
         ("data.dataset", "loop-a", "symlink loop"), _loop),
    Case("output-dir-symlink-loop", ("train", *QUICK[:-1], "{tmp}/loop-a"), 2,
         ("output.dir", "loop-a", "symlink loop"), _loop),
    Case("checkpoint-dir-symlink-loop", ("train", *QUICK, "--checkpoint-dir", "{tmp}/loop-a"), 2,
         ("checkpoint dir", "loop-a", "symlink loop"), _loop),
    Case("evaluate-checkpoint-symlink-loop", ("evaluate", "--checkpoint", "{tmp}/loop-a",
                                              "--output-dir", "{tmp}/out"), 2,
         ("checkpoint", "loop-a", "symlink loop"), _loop),
    Case("config-nested-3000-deep", ("train", "--config", "{tmp}/c.yaml", *QUICK), 2,
         ("config file", "c.yaml", "nests lists or mappings more than 100 levels deep"),
         _file("c.yaml", f"model:\n  options:\n    a: {DEEP}\n".encode())),
    Case("set-nested-3000-deep", ("train", "--set", f"model.options={{a: {DEEP}}}", *QUICK), 2,
         ("--set 'model.options' nests lists or mappings more than 100 levels deep",)),
    Case("config-key-with-a-trailing-space", ("train", "--config", "{tmp}/c.yaml", *QUICK), 2,
         ("unknown key train.'epochs '",), _file("c.yaml", b"train:\n  'epochs ': 1\n")),
    Case("every-seconds-inf", ("train", "--set", "checkpoint.every_seconds=.inf", *QUICK), 2,
         ("checkpoint.every_seconds: inf is not a finite number >= 0",)),
    Case("run-every-seconds-inf", ("run", "--set", "checkpoint.every_seconds=.inf", *QUICK), 2,
         ("checkpoint.every_seconds: inf is not a finite number >= 0",)),
    # a --set value is validated even when a flag sets the same key
    Case("set-list-under-flag", ("train", "--epochs", "1", "--set", "train.epochs=[1,2]",
                                 *QUICK), 2, ("train.epochs", "expected int")),
    Case("set-empty-under-flag", ("train", "--epochs", "1", "--set", "train.epochs=", *QUICK),
         2, ("train.epochs",)),
    # a mapping as a key (found by test_config_properties: a TypeError from the key check)
    Case("set-mapping-as-key", ("train", "--set", "data.dataset={{}}", *QUICK), 2,
         ("data.dataset", "not valid YAML", "used as a key")),
    # argparse's own errors
    Case("argparse-bad-int", ("train", "--epochs", "two"), 2, ("invalid int value", "--help")),
    Case("argparse-unknown-flag", ("train", "--bogus", "2"), 2,
         ("unrecognized arguments", "--help")),
    Case("argparse-missing-command", (), 2, ("required", "--help")),
    Case("argparse-missing-checkpoint", ("evaluate",), 2, ("--checkpoint", "--help")),
    # data
    Case("dataset-dev-null", ("train", *QUICK[:1], "/dev/null", *QUICK[2:]), 2,
         ("/dev/null", "not a regular file or a directory")),
    Case("one-class-image-folder", ("train", *QUICK[:1], "{tmp}/pics", *QUICK[2:]), 2,
         ("only one class folder", "'cat'"), _one_class_folder),
    Case("run-one-class-image-folder", ("run", "--nproc-per-node", "2", *QUICK[:1], "{tmp}/pics",
                                        *QUICK[2:]), 2, ("only one class folder",),
         _one_class_folder),
    Case("label-2-63-minus-1", ("train", *QUICK[:1], "{tmp}/d.npz", *QUICK[2:]), 2,
         ("d.npz", "label 9223372036854775807 is too large to be a class index"),
         _npz("d.npz", label=2**63 - 1)),
    Case("label-uint64-max", ("train", *QUICK[:1], "{tmp}/d.npz", *QUICK[2:]), 2,
         ("d.npz", "label 18446744073709551615 is too large to be a class index"),
         _npz("d.npz", "uint64", label=2**64 - 1)),
    Case("npz-with-0-features", ("train", *QUICK[:1], "{tmp}/d.npz", *QUICK[2:]), 2,
         ("d.npz", "each sample has 0 features (shape (0,))"), _npz("d.npz", features=0)),
    # `run SCRIPT` with a file that is not a Python script, or does not compile: checked
    # before any rank starts (a syntax error is the user's code: exit 5)
    Case("run-script-syntax-error", ("run", "--nproc-per-node", "2", "--metrics-port", "0",
                                     "{tmp}/train.py"), 5,
         ("train.py", "does not compile", "SyntaxError", "train.py:2"),
         _file("train.py", b"import trainer\nx = (\n")),
    Case("run-script-is-a-csv", ("run", "--nproc-per-node", "2", "--metrics-port", "0",
                                 "{tmp}/d.csv"), 2, ("d.csv", "not a Python file", "--dataset"),
         _file("d.csv", b"a,b\n1,2\n")),
    Case("run-script-is-an-npz", ("run", "--nproc-per-node", "2", "--metrics-port", "0",
                                  "{tmp}/d.npz"), 2, ("d.npz", "not a Python file"),
         _file("d.npz", b"PK\x03\x04" + bytes(60))),
    # checkpoints
    Case("evaluate-foreign-payload", ("evaluate", "--checkpoint", "{tmp}/ckpt-000000007.pt",
                                      "--output-dir", "{tmp}/out"), 2,
         ("not a ddp-trainer training checkpoint", "config"), _foreign_payload),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_one_line_and_touches_nothing(case: Case, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "summary.json").write_text('{"earlier": true}\n')
    (out / "steps.jsonl").write_text('{"step": 1, "epoch": 0, "loss": 1.0}\n')
    if case.setup is not None:
        case.setup(tmp_path)  # type: ignore[operator]
    before = snapshot(tmp_path)
    argv = [a.replace("{tmp}", str(tmp_path)) for a in case.argv]
    proc = run_cli(*argv, cwd=tmp_path)  # a case that trains by mistake writes there
    assert_one_error_line(proc, case.code, case.needles, case.warnings)
    assert_unchanged(before)


def _unprivileged(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI as a user who may not read a file of mode 000. Root reads one through
    CAP_DAC_OVERRIDE, so as root the CLI runs with it and CAP_DAC_READ_SEARCH dropped (setpriv,
    util-linux): the kernel refuses the read as for any user. Not as `nobody`: a checkout in a
    0700 folder (`mktemp -d`) is closed to it."""
    argv = [sys.executable, "-m", "trainer", *args]
    if os.geteuid() == 0:
        argv = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", *argv]
    return subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=240,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, check=False)


def test_unreadable_config_file(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("train:\n  epochs: 1\n")
    cfg.chmod(0)
    proc = _unprivileged(tmp_path, "train", "--config", str(cfg), "--metrics-port", "0",
                         "--output-dir", str(tmp_path / "out"))
    assert_one_error_line(proc, 2, ("c.yaml",))
    assert not (tmp_path / "out").exists()


def test_an_unreadable_npz_dataset_says_permission_denied_not_re_create_it(
        tmp_path: Path) -> None:
    import numpy as np

    data = tmp_path / "d.npz"
    np.savez(data, x=np.zeros((20, 3), dtype=np.float32), y=np.arange(20) % 2)
    data.chmod(0)
    proc = _unprivileged(tmp_path, "train", "--dataset", str(data), "--metrics-port", "0",
                         "--output-dir", str(tmp_path / "out"))
    line = assert_one_error_line(proc, 2, ("d.npz", "permission denied", "chmod"))
    assert "re-create" not in line
    assert not (tmp_path / "out").exists()


def test_a_flag_and_set_disagreeing_is_one_warning_and_the_flag_wins(tmp_path: Path) -> None:
    proc = run_cli("train", "--dataset", "synthetic", "--set", "data.synthetic_samples=60",
                   "--batch-size", "16", "--epochs", "1", "--set",
                   "train.epochs=3", "--metrics-port", "0", "--output-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if "WARNING" in line]
    assert len(warnings) == 1, proc.stderr
    assert "--epochs 1" in warnings[0] and "train.epochs=3" in warnings[0], warnings[0]
    assert '"epochs": 1' in (tmp_path / "summary.json").read_text()


def test_a_megabyte_long_value_is_cut_in_the_error_line(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("model:\n  name: " + "x" * 1_000_000 + "\n")
    proc = run_cli("train", "--config", str(cfg), *(a.replace("{tmp}", str(tmp_path))
                                                   for a in QUICK))
    line = assert_one_error_line(proc, 2, ("model.name", "unknown model 'xxxx",
                                           "(1000002 characters)"))
    assert len(line) < 400, len(line)


def test_every_error_line_is_cut_to_a_readable_length() -> None:
    from trainer.errors import ConfigError

    err = ConfigError("model.name: no module " + "x" * 5_000_000 + " found", "f" * 3000)
    assert len(err.problem) <= 1100 and err.problem.startswith("model.name: no module xxx")
    assert "(5000028 characters, cut)" in err.problem and err.problem.endswith("xxx found")
    assert len(err.fix) <= 1100 and "(3000 characters, cut)" in err.fix
