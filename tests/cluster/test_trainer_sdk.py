"""Kubeflow SDK users train on our trainer: the chart's ClusterTrainingRuntime `ddp-trainer`
(`trainJob.sdkRuntime`), applied with the one command docs/trainer-v2.md gives, and the real
`kubeflow.trainer.TrainerClient` (kubeflow 0.5.0) running a `CustomTrainer` function that calls
`trainer.fit(...)` across 2 nodes under torchrun, on the real Trainer v2.3.0: the job completes,
rank 0's exact evaluation of its checkpoint equals what training reported, and its progress
reached `status.trainerStatus`."""

from __future__ import annotations

import json
import subprocess

from tests.cluster import sdk
from tests.cluster.helm import CHART, HELM4, helm
from tests.cluster.kube import KUBECTL, STATE, Cluster

SDK_TRAIN = '''
def train_ddp_trainer():
    # Runs in every pod of the TrainJob, under torchrun (one process per node here).
    import json
    import os
    import subprocess

    import trainer

    config = {"train": {"epochs": 4}, "metrics": {"linger_seconds": 0},
              "checkpoint": {"dir": "/workspace/checkpoints"},
              "output": {"dir": "/workspace/outputs"}}
    summary = trainer.fit(config)
    if os.environ["RANK"] == "0":
        # The checkpoint is in this pod only, so it is scored by one process: ddp-trainer
        # evaluate without torchrun's variables (with them it would wait for the other ranks).
        # No backquote or dollar sign anywhere in this function: the SDK pastes its source
        # into an unquoted bash here-document, which runs them (docs/trainer-v2.md, SDK).
        alone = {k: v for k, v in os.environ.items() if k not in (
            "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
        subprocess.run(["ddp-trainer", "evaluate", "--checkpoint", "/workspace/checkpoints",
                        "--output-dir", "/workspace/eval"], env=alone, check=True)
        with open("/workspace/eval/eval.json") as f:
            scored = json.load(f)
        print("SDK-RESULT " + json.dumps({"summary": summary, "eval": scored}), flush=True)


from kubeflow.trainer import CustomTrainer, KubernetesBackendConfig, TrainerClient

client = TrainerClient(KubernetesBackendConfig(namespace=namespace, config_file=config))
name = client.train(runtime=client.get_runtime("ddp-trainer"),
                    trainer=CustomTrainer(func=train_ddp_trainer, num_nodes=2))
job = client.wait_for_job_status(name, status={"Complete", "Failed"}, timeout=600,
                                 polling_interval=2)
print(json.dumps({"name": name, "status": job.status, "nodes": job.num_nodes,
                  "logs": list(client.get_job_logs(name))}))
'''


def test_a_custom_trainer_function_calling_fit_trains_on_two_nodes(cluster: Cluster) -> None:
    # docs/trainer-v2.md's one command (with this cluster's values for the image).
    rendered = helm(HELM4, "template", "ddp-trainer", str(CHART), "-f",
                    str(STATE / "values-local.yaml"), "--set", "trainJob.sdkRuntime.enabled=true",
                    "--show-only", "templates/clustertrainingruntime.yaml",
                    cluster=cluster).stdout
    subprocess.run([str(KUBECTL), "--kubeconfig", str(cluster.kubeconfig), "apply", "-f", "-"],
                   input=rendered, text=True, check=True, capture_output=True)
    ns = cluster.namespace("sdk")
    got = sdk.run(SDK_TRAIN, extra="trainer-sdk", config=str(STATE / "kubeconfig"),
                  namespace=ns)
    assert got["status"] == "Complete", got["logs"][-30:]
    assert got["nodes"] == 2
    (line,) = [line for line in got["logs"] if line.startswith("SDK-RESULT ")]
    # With a backquoted ddp-trainer in a comment the log began "error: the following
    # arguments are required: COMMAND": bash ran it while writing the script.
    assert not [x for x in got["logs"] if x.startswith("error:")], got["logs"][:5]
    result = json.loads(line.removeprefix("SDK-RESULT "))
    summary, scored = result["summary"], result["eval"]
    assert summary["world_size"] == 2
    assert (scored["correct"], scored["total"]) == (summary["val_correct"], summary["val_total"])
    assert scored["accuracy"] == summary["val_accuracy"]
    status = cluster.get("trainjob", got["name"], ns)["status"]["trainerStatus"]
    assert status["progressPercentage"] == 100
    metrics = {m["name"]: m["value"] for m in status["metrics"]}
    assert metrics["val_accuracy"] == f"{summary['val_accuracy']:.6g}"
