"""Tasks beyond classification: a step's named sums reduce exactly over ranks, and their
metrics reach summary.json, the exporter and the TrainJob status (docs/custom-code.md)."""

from __future__ import annotations

import math
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import REPO, free_port, read_json, run_cli
from prometheus_client import CollectorRegistry
from torch import nn

from tests.metrics.helpers import rank_env, samples, scrape
from trainer.components import checkpoint
from trainer.components.evaluation import EvalResult, evaluate
from trainer.components.steps import StepError, as_output, build_step
from trainer.components.tasks import CLASSIFICATION, LANGUAGE_MODEL, REGRESSION, Ratio, Task
from trainer.errors import ConfigError
from trainer.metrics.families import RunInfo, TrainerMetrics
from trainer.metrics.trainjob_status import StatusTracker
from trainer.placement import DistContext

FIXTURES = REPO / "tests" / "fixtures"
sys.path.insert(0, str(FIXTURES))
import taskdata  # noqa: E402

# Sums of float64 values in another order (per rank, per batch) differ from one process's by
# rounding only: a few ulps of the sum, far below this.
REL = 1e-12


def _train_two_ranks(tmp_path: Path, dataset: str, model: str, step: str,
                     batch: int) -> tuple[dict[str, Any], nn.Module]:
    """A 2-rank `ddp-trainer run`; its summary and its final model (from the checkpoint)."""
    proc = run_cli("run", "--nproc-per-node", "2", "--dataset", f"taskdata:{dataset}",
                   "--model", f"taskdata:{model}", "--step", step, "--epochs", "2",
                   "--batch-size", str(batch), "--metrics-port", "0",
                   "--checkpoint-dir", str(tmp_path / "ckpt"), "--output-dir", str(tmp_path),
                   env={"PYTHONPATH": f"{REPO}:{FIXTURES}"}, timeout=300)
    assert proc.returncode == 0, proc.stderr
    newest = checkpoint.list_checkpoints(tmp_path / "ckpt")[0]
    trained = getattr(taskdata, model)(**({"sample_shape": (5,)} if dataset.startswith("reg")
                                          else {}))
    trained.load_state_dict(checkpoint.read(newest)["model"])
    return read_json(tmp_path / "summary.json"), trained.eval()


def test_regression_mae_and_rmse_of_two_ranks_equal_one_process(tmp_path: Path) -> None:
    summary, model = _train_two_ranks(tmp_path, "regression_data", "regression_model",
                                      "regression", batch=16)
    _, val = taskdata.regression_data()
    with torch.no_grad():
        err = model(val.x).reshape(-1).double() - val.y.double()
    mae, rmse = err.abs().mean().item(), err.square().mean().sqrt().item()
    print("two ranks:", summary["val_metrics"], "one process:", mae, rmse)
    assert summary["val_total"] == len(val) == 53  # 27 + 26: the padded item not counted
    assert set(summary["val_metrics"]) == {"mae", "rmse"}
    assert summary["val_metrics"]["mae"] == pytest.approx(mae, rel=REL)
    assert summary["val_metrics"]["rmse"] == pytest.approx(rmse, rel=REL)
    assert summary["val_accuracy"] is None  # regression scores no accuracy, not 0


def test_lm_perplexity_and_token_accuracy_of_two_ranks_equal_one_process(
        tmp_path: Path) -> None:
    summary, model = _train_two_ranks(tmp_path, "token_data", "tiny_lm", "lm", batch=8)
    _, val = taskdata.token_data()
    with torch.no_grad():
        logits = model(val.x)[:, :-1].flatten(0, 1).double()
    labels = val.y[:, 1:].flatten()
    kept = labels != -100
    nll = nn.functional.cross_entropy(logits[kept], labels[kept], reduction="sum").item()
    tokens = int(kept.sum())
    hits = int((logits.argmax(-1)[kept] == labels[kept]).sum())
    print("two ranks:", summary["val_metrics"], "one process:", math.exp(nll / tokens),
          hits / tokens)
    assert summary["val_total"] == tokens == 41 * 8 - 12  # the -100 labels not counted
    assert summary["val_metrics"]["perplexity"] == pytest.approx(math.exp(nll / tokens),
                                                                 rel=REL)
    assert summary["val_metrics"]["token_accuracy"] == hits / tokens  # integer counts: exact
    assert summary["val_accuracy"] is None


ENV = {"PYTHONPATH": f"{REPO}:{FIXTURES}"}
CUSTOM = ("--dataset", "taskdata:regression_data", "--model", "taskdata:regression_model",
          "--batch-size", "16")


def test_a_custom_steps_metrics_are_identical_on_1_2_and_3_ranks(tmp_path: Path) -> None:
    """The user's path: a step of their own by --set train.step=module:fn; its named sums are
    integer counts, so its metrics are bit-identical for any number of ranks (53 validation
    samples: 2 and 3 ranks pad their shards)."""
    proc = run_cli("run", "--nproc-per-node", "2", *CUSTOM, "--epochs", "2",
                   "--set", "train.step=taskdata:max_err_step", "--metrics-port", "0",
                   "--checkpoint-dir", str(tmp_path / "ckpt"), "--output-dir", str(tmp_path),
                   env=ENV, timeout=300)
    assert proc.returncode == 0, proc.stderr
    summary = read_json(tmp_path / "summary.json")
    assert set(summary["val_metrics"]) == {"within_1", "positive_share"}
    assert summary["val_total"] == 53
    assert summary["val_accuracy"] is None  # the task declares no accuracy
    scored = {}
    for n in (1, 2, 3):
        out = tmp_path / f"eval{n}"
        proc = run_cli("evaluate", "--checkpoint", str(tmp_path / "ckpt"), "--nproc-per-node",
                       str(n), "--output-dir", str(out), env=ENV, timeout=300)
        assert proc.returncode == 0, proc.stderr
        report = read_json(out / "eval.json")
        assert (report["world_size"], report["total"], report["accuracy"]) == (n, 53, None)
        assert "within_1 " in proc.stdout, proc.stdout
        scored[n] = report["metrics"]
    print("summary:", summary["val_metrics"], "evaluate:", scored)
    assert scored[1] == scored[2] == scored[3] == summary["val_metrics"]
    # ... and those of one process over the whole set, counted here.
    _, val = taskdata.regression_data()
    model = taskdata.regression_model((5,))
    model.load_state_dict(checkpoint.read(
        checkpoint.list_checkpoints(tmp_path / "ckpt")[0])["model"])
    with torch.no_grad():
        err = (model(val.x).reshape(-1).double() - val.y.double()).abs()
    assert scored[1] == {"within_1": int((err < 1).sum()) / 53,
                         "positive_share": int((val.y > 0).sum()) / 53}


@pytest.mark.parametrize("step, needle", [
    ("no_loss_step", "['loss'] missing by its task 'within'"),
    ("vector_sum_step", "returned within_1=a tensor of shape (3,), not a number"),
    ("nan_sum_step", "returned positive=nan, not finite"),
    ("float_count_step", "returned count=inf, not an integer"),
])
def test_a_bad_named_step_output_is_one_line_exit_2_before_any_step(
        tmp_path: Path, step: str, needle: str) -> None:
    proc = run_cli("train", *CUSTOM, "--epochs", "1", "--set", f"train.step=taskdata:{step}",
                   "--metrics-port", "0", "--output-dir", str(tmp_path), env=ENV)
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert len(errors) == 1 and needle in errors[0] and "(fix:" in errors[0], proc.stderr
    assert not (tmp_path / "steps.jsonl").exists(), "a step ran"


def test_a_regression_run_exports_mae_and_rmse_per_rank_and_exactly_on_rank_0(
        tmp_path: Path) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainer", "run", "--nproc-per-node", "2", *CUSTOM,
         "--step", "regression", "--epochs", "2", "--metrics-port", str(port),
         "--metrics-bind-address", "127.0.0.1", "--set", "metrics.linger_seconds=5",
         "--checkpoint-dir", str(tmp_path / "ckpt"), "--output-dir", str(tmp_path)],
        cwd=REPO, env=rank_env(ENV), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True)
    try:
        # The endpoint lingers after the run: a scrape then holds the final validation.
        deadline, text = time.monotonic() + 240, ""
        while not (tmp_path / "summary.json").exists():
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "the run did not finish"
            time.sleep(0.2)
        text = scrape(port)
        _, err = proc.communicate(timeout=120)  # the linger's end
        assert proc.returncode == 0, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    summary = read_json(tmp_path / "summary.json")
    series = {(n, dict(ls).get("rank"), dict(ls).get("name")): v
              for (n, ls), v in samples(text).items() if dict(ls).get("split") == "val"
              and n in ("trainer_metric", "trainer_global_metric", "trainer_accuracy_ratio",
                        "trainer_global_accuracy_ratio")}
    print(series, summary["val_metrics"])
    assert {k for k in series} == {(f, r, m) for m in ("mae", "rmse") for f, r in (
        ("trainer_metric", "0"), ("trainer_metric", "1"), ("trainer_global_metric", "0"))}
    for name, exact in summary["val_metrics"].items():
        assert series["trainer_global_metric", "0", name] == exact
    # Each rank's is of its shard (27 and 26 of the 53 samples): they weigh into the exact one.
    mae = {r: series["trainer_metric", r, "mae"] for r in "01"}
    assert mae["0"] * 27 + mae["1"] * 26 == pytest.approx(summary["val_metrics"]["mae"] * 53,
                                                          rel=REL)
    assert mae["0"] != mae["1"]


def _one_process() -> DistContext:
    return DistContext(rank=0, world_size=1, local_rank=0, local_world_size=1,
                       device=torch.device("cpu"), backend="gloo", initialized=False)


def test_a_custom_step_reports_the_ratios_of_its_own_sums() -> None:
    _, val = taskdata.regression_data()
    model = taskdata.regression_model((5,)).eval()
    batches = [(val.x[i:i + 10], val.y[i:i + 10]) for i in range(0, len(val), 10)]
    _, glob = evaluate(model, taskdata.max_err_step, batches, len(val), _one_process())
    with torch.no_grad():
        err = (model(val.x).reshape(-1).double() - val.y.double()).abs()
    assert glob.metrics == {"within_1": int((err < 1).sum()) / len(val),
                            "positive_share": int((val.y > 0).sum()) / len(val)}


def test_classification_reports_accuracy_as_its_one_metric() -> None:
    result = EvalResult(correct=7, total=9, loss_sum=3.0)
    assert result.metrics == {"accuracy": result.accuracy} == {"accuracy": 7 / 9}
    assert EvalResult(0, 0, 0.0).metrics == {}  # nothing scored: no metric, not 0


def test_the_classification_summary_keeps_its_fields_and_adds_val_metrics(
        tmp_path: Path) -> None:
    proc = run_cli("train", "--dataset", "synthetic", "--epochs", "1", "--metrics-port", "0",
                   "--output-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    summary = read_json(tmp_path / "summary.json")
    assert summary["val_accuracy"] == summary["val_correct"] / summary["val_total"]
    assert summary["val_metrics"] == {"accuracy": summary["val_accuracy"]}


def test_a_mapping_with_undeclared_sums_is_one_line_naming_them() -> None:
    loss = torch.tensor(1.0)
    with pytest.raises(StepError) as err:
        as_output({"loss": loss, "count": 3, "sum_abs_err": 1.0}, task=CLASSIFICATION)
    assert "['sum_abs_err'] not declared by its task 'classification'" in str(err.value)
    with pytest.raises(StepError, match=r"\['sum_sq_err'\] missing"):
        as_output({"loss": loss, "count": 3, "sum_abs_err": 1.0}, task=REGRESSION)
    out = as_output({"loss": loss, "tokens": 4, "correct_tokens": 2, "nll_sum": 5.0},
                    task=LANGUAGE_MODEL)
    assert (out.count, out.correct, out.sums) == (4, 0, {"correct_tokens": 2, "nll_sum": 5.0})


@pytest.mark.parametrize("ratios, sums, message", [
    ((Ratio("x", "nope", "count"),), (), "uses ['nope']"),
    ((Ratio("x", "a", "count", "log"),), ("a",), "uses 'log'"),
    ((Ratio("x", "a", "count"),), ("a", "count"), "clash"),
    ((Ratio("x" * 61, "a", "count"),), ("a",), "at most 60 characters"),
    ((Ratio("x-y", "a", "count"),), ("a",), "letters, digits and underscores"),
])
def test_a_task_declaring_unknown_sums_is_refused(ratios: tuple[Ratio, ...],
                                                   sums: tuple[str, ...], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        Task("mine", ratios, sums=sums)


def test_built_in_steps_declare_their_tasks() -> None:
    assert build_step("regression").task is REGRESSION  # type: ignore[attr-defined]
    assert build_step("lm").task is LANGUAGE_MODEL  # type: ignore[attr-defined]
    assert REGRESSION.names() == ("mae", "rmse")
    assert LANGUAGE_MODEL.names() == ("perplexity", "token_accuracy")


def _info(rank: int, names: tuple[str, ...]) -> RunInfo:
    return RunInfo(rank=rank, local_rank=rank, world_size=2, local_world_size=2,
                   backend="gloo", strategy="ddp", model="m", dataset="d", device="cpu",
                   version="0", metrics=names)


def test_the_exporter_publishes_each_declared_metric_per_rank_from_start_up() -> None:
    registry = CollectorRegistry()
    metrics = TrainerMetrics(registry, _info(0, ("mae", "rmse")))

    def value(family: str, name: str) -> float | None:
        return registry.get_sample_value(family, {"rank": "0", "split": "val", "name": name})

    assert value("trainer_metric", "mae") == 0.0 and value("trainer_metric", "rmse") == 0.0
    metrics.update({"val/metric/mae": 1.5, "val/metric/rmse": 2.25,
                    "val/global_metric/mae": 1.25, "val/global_metric/rmse": 2.0})
    assert (value("trainer_metric", "mae"), value("trainer_metric", "rmse")) == (1.5, 2.25)
    assert value("trainer_global_metric", "mae") == 1.25
    assert value("trainer_global_metric", "rmse") == 2.0

    other = CollectorRegistry()
    TrainerMetrics(other, _info(1, ("mae",)))
    labels = {"rank": "1", "split": "val", "name": "mae"}
    assert other.get_sample_value("trainer_metric", labels) == 0.0
    assert other.get_sample_value("trainer_global_metric", labels) is None  # rank 0's only


def test_the_trainjob_status_reports_the_tasks_metrics() -> None:
    tracker = StatusTracker(world_size=2)
    assert tracker.update({"val/global_loss": 2.5, "val/global_metric/perplexity": 12.25,
                           "val/global_metric/token_accuracy": 0.5}, step=4)
    assert tracker.values == {"val_loss": 2.5, "val_perplexity": 12.25,
                              "val_token_accuracy": 0.5}
