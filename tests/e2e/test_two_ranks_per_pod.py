"""1 Master + 1 Worker with two ranks each (`ddp-trainer run --nproc-per-node 2` in every
pod, world size 4), from the chart's `gpusPerReplica: 2` on CPU: the launcher path the chart
takes on multi-GPU nodes, rendezvousing across pods on the operator's PET_* variables, with a
DataLoader worker per rank."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.harness.image import BuiltImage
from tests.e2e.harness.podman import Podman
from tests.e2e.scenario import Run, checkpoints, evaluate, played, rendered
from tests.e2e.scrape import SCRAPE_VALUES, dashboard_query, ranks_of, series
from trainer import checkpoint

# gpusPerReplica drives the chart's launcher mode; the GPU limit it adds means nothing to
# podman (no device plugin) and the trainer picks the CPU (train.device: auto). Each rank
# loads through one DataLoader worker: started from a forkserver under the pod's read-only
# root filesystem and user 10001, in training and in the evaluation of its checkpoint.
TWO_PER_POD = {"gpusPerReplica": 2, "trainerConfig": {"data": {"num_workers": 1}}}


@pytest.fixture(scope="module")
def run(podman: Podman, image: BuiltImage) -> Iterator[Run]:
    with played(podman, rendered(image, SCRAPE_VALUES, TWO_PER_POD), scrape=True) as result:
        yield result


def test_four_ranks_in_two_pods_train_to_the_end(run: Run, podman: Podman) -> None:
    assert run.outcome.phase == "Succeeded", f"{run.outcome}\n{run.logs}"
    assert list(run.outcome.exits.values()) == [[0], [0]]
    result = run.summary
    assert (result["world_size"], result["global_batch"]) == (4, 4 * 64)
    assert result["steps"] == 10 * 6  # ceil(1437 training samples / 256) per epoch
    for pod in run.job.pods:
        info = json.loads(podman.run("container", "inspect", pod.container).stdout)[0]
        assert info["Config"]["Cmd"][:3] == ["run", "--nproc-per-node", "2"]
    # the ranks loaded through workers (the config they trained with), which left no trace
    assert checkpoint.read(checkpoints(run.job)[-1])["config"]["data"]["num_workers"] == 1
    assert "Traceback" not in run.logs and "leaked" not in run.logs


def test_summary_accuracy_equals_evaluate_of_the_final_checkpoint(
        run: Run, podman: Podman, image: BuiltImage, tmp_path: Path) -> None:
    result = run.summary
    scored = evaluate(podman, image, run.job, checkpoints(run.job)[-1], tmp_path / "eval")
    assert scored["accuracy"] == result["val_accuracy"]


def test_each_pod_serves_its_own_two_global_ranks(run: Run) -> None:
    assert run.prometheus is not None
    loss = series(run.prometheus, dashboard_query("Train loss per rank", run.job),
                  run.window)
    assert ranks_of(loss) == ["0", "1", "2", "3"]
    by_pod = {p.name: ranks_of(loss, pod=p.name) for p in run.job.pods}
    assert by_pod == {run.job.pod("master-0").name: ["0", "1"],
                      run.job.pod("worker-0").name: ["2", "3"]}
    accuracy = series(run.prometheus, dashboard_query("Accuracy per rank and global", run.job),
                      run.window)
    assert ranks_of(accuracy, split="train") == ["0", "1", "2", "3"]
