"""Bad input: one clear line naming the problem and the fix, non-zero exit, nothing lost."""

from __future__ import annotations

import socket
from pathlib import Path

import numpy as np
import pytest
from conftest import free_port, read_json, run_cli

from trainer.components import checkpoint


def assert_one_clear_error(proc, *needles: str) -> None:  # type: ignore[no-untyped-def]
    assert proc.returncode != 0, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert errors, proc.stderr
    assert "(fix:" in errors[0], errors[0]
    for needle in needles:
        assert needle in errors[0], errors[0]


def test_unknown_config_key_in_file(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("train:\n  batchsize: 4\n")
    proc = run_cli("train", "--config", str(cfg), "--metrics-port", "0")
    assert proc.returncode == 2
    assert_one_clear_error(proc, "train.batchsize", "batch_size")


def test_wrong_type_on_command_line() -> None:
    proc = run_cli("train", "--set", "train.epochs=many", "--metrics-port", "0")
    assert_one_clear_error(proc, "train.epochs", "int")


@pytest.mark.parametrize("command", ["train", "run"])
def test_a_config_error_is_answered_before_torch_is_imported(command: str) -> None:
    proc = run_cli(command, "--set", "train.epochs=many", env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert_one_clear_error(proc, "train.epochs", "whole number")
    imported = {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines()
                if line.startswith("import time:")}
    assert "trainer.config_load" in imported and "torch" not in imported, sorted(imported)


def test_flag_with_wrong_type_is_rejected_by_the_parser() -> None:
    proc = run_cli("train", "--epochs", "two")
    assert proc.returncode == 2 and "invalid int value" in proc.stderr


def test_missing_data_file(tmp_path: Path) -> None:
    proc = run_cli("train", "--dataset", str(tmp_path / "x.npz"), "--metrics-port", "0")
    assert_one_clear_error(proc, "does not exist")


def test_corrupt_data_file_under_the_launcher(tmp_path: Path) -> None:
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not an npz at all")
    proc = run_cli("run", "--nproc-per-node", "2", "--dataset", str(bad), "--metrics-port", "0")
    assert_one_clear_error(proc, "bad.npz", "not a readable .npz")


def test_label_out_of_range(tmp_path: Path) -> None:
    p = tmp_path / "d.npz"
    np.savez(p, x=np.zeros((8, 2), "float32"), y=np.array([0, 1, 0, 1, 0, 1, 0, 7]))
    proc = run_cli("train", "--dataset", str(p), "--set", "data.num_classes=2",
                   "--metrics-port", "0")
    assert_one_clear_error(proc, "label 7 is out of range")


def test_diverging_loss_stops_every_rank_and_keeps_earlier_outputs(tmp_path: Path) -> None:
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    ckpt.mkdir()
    out.mkdir()
    checkpoint.save(ckpt, 3, {"marker": 1}, keep=3)
    (out / "summary.json").write_text('{"kept": true}\n')
    proc = run_cli("run", "--nproc-per-node", "2", "--dataset", "synthetic", "--lr", "1e30",
                   "--log-every", "2", "--output-dir", str(out), "--checkpoint-dir",
                   str(tmp_path / "ckpt2"), "--metrics-port", "0")
    assert proc.returncode == 3
    assert_one_clear_error(proc, "loss became", "lower --lr")
    assert read_json(out / "summary.json") == {"kept": True}
    assert checkpoint.load_latest(ckpt)[0] == {"marker": 1}  # type: ignore[index]
    assert checkpoint.load_latest(tmp_path / "ckpt2") is None  # nothing diverged was saved


def test_metrics_port_in_use(tmp_path: Path) -> None:
    port = free_port()
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", port))
        busy.listen()
        proc = run_cli("run", "--nproc-per-node", "2", "--metrics-port", str(port),
                       "--output-dir", str(tmp_path))
    assert_one_clear_error(proc, str(port))
    assert not (tmp_path / "summary.json").exists()


@pytest.mark.parametrize("args", [["--nproc-per-node", "0"], ["--max-restarts", "-1"]])
def test_bad_launcher_flags(args: list[str]) -> None:
    assert_one_clear_error(run_cli("run", *args, "--metrics-port", "0"))


def test_evaluate_missing_checkpoint(tmp_path: Path) -> None:
    proc = run_cli("evaluate", "--checkpoint", str(tmp_path / "none.pt"))
    assert_one_clear_error(proc, "does not exist")


@pytest.mark.parametrize("ranks", ["1", "2"])
def test_evaluate_a_directory_without_checkpoints(tmp_path: Path, ranks: str) -> None:
    proc = run_cli("evaluate", "--checkpoint", str(tmp_path), "--nproc-per-node", ranks)
    assert_one_clear_error(proc, f"{tmp_path} holds no valid checkpoint (ckpt-*.pt, ckpt-*.dcp)")


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    proc = run_cli("train", "--dataset", str(tmp_path / "x.npz"), "--debug")
    assert proc.returncode != 0 and "Traceback" in proc.stderr


def _laughs(levels: int) -> str:
    """model.options whose aliases nest `levels` deep, 9 copies each: 9**levels values."""
    lines = ["model:", "  options:", "    l0: &l0 [1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    lines += [f"    l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("command", ["train", "run"])
def test_a_billion_laughs_config_is_one_line_at_once(tmp_path: Path, command: str) -> None:
    # 9**9 values: `run` grew to 3.4 GB writing them out for its ranks, silently.
    cfg = tmp_path / "laughs.yaml"
    cfg.write_text(_laughs(9))
    proc = run_cli(command, "--config", str(cfg), "--metrics-port", "0", "--output-dir",
                   str(tmp_path / "out"), timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert_one_clear_error(proc, f"config file {cfg} expands to more than 1,000,000 values")


def test_nproc_per_node_has_a_ceiling_even_oversubscribed(tmp_path: Path) -> None:
    proc = run_cli("run", "--nproc-per-node", "1000000", "--oversubscribe", "--metrics-port",
                   "0", "--output-dir", str(tmp_path / "out"), timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert_one_clear_error(proc, "--nproc-per-node 1000000 is more than 1024")
    assert not (tmp_path / "out").exists()
