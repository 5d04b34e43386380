"""The chart's PyTorchJob with its checkpoints and outputs in the cluster's SeaweedFS
(`storage.s3`, docs/checkpoints.md), no claim and no emptyDir for either: its Worker pod and
then its Master pod deleted mid-run, it ends exactly as the same run left alone with its
checkpoints on disk (conftest's `uninterrupted`), and the model it exported into the bucket
loads with `safetensors` alone and scores what `ddp-trainer evaluate` of its final checkpoint
(eval.json) does."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from tests.cluster.helm import Release, release_name
from tests.cluster.jobs import (
    BIN,
    DONE,
    FAILOVER,
    MID_RUN,
    Finished,
    assert_same_as,
    uid,
    wait_until,
)
from tests.cluster.kube import Cluster, merged, node_paths
from tools.cluster import seaweedfs

S3_VALUES: dict[str, Any] = {"storage": {"s3": {
    "bucket": seaweedfs.BUCKET, "endpoint": seaweedfs.ENDPOINT, "region": seaweedfs.REGION,
    "secretName": seaweedfs.SECRET}}}


def store() -> Any:
    """s3fs on the cluster's SeaweedFS, reached from the host at its pod's address."""
    import s3fs

    paths = node_paths()
    kubectl = Path(__file__).resolve().parents[2] / ".tools" / "cluster" / "bin" / "kubectl"
    endpoint = seaweedfs.pod_endpoint(paths, kubectl)
    assert endpoint, "no Ready SeaweedFS pod in namespace s3 (tools/cluster's object store)"
    return s3fs.S3FileSystem(key=seaweedfs.ACCESS_KEY, secret=seaweedfs.SECRET_KEY,
                             endpoint_url=endpoint,
                             client_kwargs={"region_name": seaweedfs.REGION},
                             skip_instance_cache=True, use_listings_cache=False)


def run(cluster: Cluster, chart_ref: str, tmp: Path, prefix: str) -> Release:
    namespace = cluster.namespace(prefix)
    secret = cluster.get("secret", seaweedfs.SECRET, seaweedfs.NAMESPACE)
    cluster.apply({"apiVersion": "v1", "kind": "Secret",
                   "metadata": {"name": seaweedfs.SECRET, "namespace": namespace},
                   "data": secret["data"]})
    release = Release(cluster, release_name(), namespace, merged(FAILOVER, S3_VALUES))
    release.install(chart_ref, tmp=tmp)
    return release


def base(release: Release) -> str:
    """The release's prefix in the bucket (the chart's default: the release's full name)."""
    return f"{seaweedfs.BUCKET}/{release.job}"


def checkpoint_steps(fs: Any, release: Release) -> list[int]:
    try:
        names = fs.ls(f"{base(release)}/checkpoints", refresh=True)
    except FileNotFoundError:
        return []
    return sorted(int(Path(n).stem.split("-")[1]) for n in names
                  if Path(n).name.startswith("ckpt-") and n.endswith(".pt"))


def wait_for_checkpoints(fs: Any, release: Release, count: int, after: int = -1,
                         timeout: float = 300) -> int:
    """Until the bucket holds `count` checkpoints of steps past `after` (a listing every
    0.5 s); the newest one's step."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        steps = checkpoint_steps(fs, release)
        if len([s for s in steps if s > after]) >= count:
            return steps[-1]
        time.sleep(0.5)
    raise AssertionError(f"{release.job}: fewer than {count} checkpoints past step {after} in "
                         f"s3://{base(release)}/checkpoints after {timeout} s")


def finished(fs: Any, release: Release, tmp: Path) -> tuple[Finished, float]:
    """The job Succeeded; the Master's log line, summary.json from the bucket, `evaluate` of
    the bucket's final checkpoint (its eval.json) and the accuracy of the bucket's exported
    model loaded with safetensors alone."""
    release.wait_condition("Succeeded")
    log = release.cluster.logs(release.rank0_pod(), release.namespace)
    done = DONE.search(log)
    assert done is not None, log[-3000:]
    summary = json.loads(fs.cat(f"{base(release)}/outputs/summary.json"))
    fs.get(f"{base(release)}/checkpoints/", str(tmp / "ckpt"), recursive=True)
    proc = subprocess.run([str(BIN / "ddp-trainer"), "evaluate", "--checkpoint", str(tmp / "ckpt"),
                           "--output-dir", str(tmp / "eval")], capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    scored = json.loads((tmp / "eval" / "eval.json").read_text())
    fs.get(f"{base(release)}/outputs/model/", str(tmp / "model"), recursive=True)
    return Finished(summary, scored, done), model_accuracy(tmp / "model")


def model_accuracy(model: Path) -> float:
    """The exported default MLP (64 -> 128 -> 64 -> 10), written with torch alone, its weights
    from model.safetensors by safetensors alone, on the digits validation split."""
    import trainer
    from trainer.data import build_splits

    meta = json.loads((model / "ddp-trainer.json").read_text())
    holder = nn.Module()
    holder.net = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(),
                               nn.Linear(64, 10))
    holder.load_state_dict(load_file(str(model / "model.safetensors")))
    config = trainer.load_config(meta["config"])
    val = build_splits(config.data, config.train.seed).val
    x, y = val.batch(list(range(len(val))))
    with torch.no_grad():
        return float((holder.net(x.flatten(1)).argmax(1) == y).double().mean().item())


@pytest.fixture(scope="module")
def fs(cluster: Cluster) -> Any:
    return store()


def test_s3_job_with_worker_then_master_deleted_ends_as_uninterrupted_and_its_model_loads(
        cluster: Cluster, chart_ref: str, fs: Any, tmp_path: Path,
        uninterrupted: Finished) -> None:
    release = run(cluster, chart_ref, tmp_path, "s3del")
    job = cluster.get("pytorchjob", release.job, release.namespace)
    for spec in job["spec"]["pytorchReplicaSpecs"].values():  # nothing but the bucket
        volumes = {v["name"]: v for v in spec["template"]["spec"]["volumes"]}
        assert not any("persistentVolumeClaim" in v for v in volumes.values()), volumes
        assert not {"checkpoints", "outputs"} & set(volumes), volumes
    step = wait_for_checkpoints(fs, release, MID_RUN)
    before: dict[str, int] = {}
    for replica in ("worker", "master"):
        assert step < uninterrupted.summary["steps"], f"the run ended before {replica} left"
        before[replica], old = step, uid(release, replica)
        cluster.kubectl("delete", "pod", release.pod(replica), "-n", release.namespace,
                        "--wait=false")
        wait_until(lambda r=replica, o=old: uid(release, r) not in (None, o),
                   f"a new {replica} pod")
        # Two more: the one the ranks agreed on at the deletion's SIGTERM, and one the ranks
        # trained to with the new pod, resumed from the bucket.
        step = wait_for_checkpoints(fs, release, 2, after=step)
    got, accuracy = finished(fs, release, tmp_path)
    assert_same_as(got, uninterrupted)
    # The Master's pod made anew resumed from the bucket, where the ranks had got to.
    assert got.summary["resumed_from_step"] >= before["master"]
    print(f"{release.job}: resumed from step {got.summary['resumed_from_step']}; "
          f"model.safetensors alone {accuracy}, eval.json {got.scored}")
    assert got.scored is not None and accuracy == got.scored["accuracy"] \
        == got.summary["val_accuracy"]
