"""The scrape config the harness gives Prometheus for the chart's PodMonitor (what
prometheus-operator v0.93 generates; tests/e2e/harness/prometheus.py), checked by promtool."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from tests.e2e.harness.chart import render
from tests.e2e.harness.prometheus import scrape_config
from tests.support.prometheus import require_binary


def monitor() -> dict[str, object]:
    return render({"gpusPerReplica": 0}, "e2e-p", "ns").one("PodMonitor")


def test_the_config_is_valid_for_promtool(tmp_path: Path) -> None:
    sd = tmp_path / "pods.json"
    sd.write_text("[]")
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({"scrape_configs": [scrape_config(monitor(), 0, sd)]}))
    proc = subprocess.run([require_binary("promtool"), "check", "config", str(config)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_it_keeps_running_pods_of_the_selector_on_the_metrics_port(tmp_path: Path) -> None:
    config = scrape_config(monitor(), 0, tmp_path / "pods.json")
    assert config["job_name"] == "podMonitor/ns/e2e-p-ddp-trainer/0"
    assert (config["scrape_interval"], config["metrics_path"]) == ("15s", "/metrics")
    rules = config["relabel_configs"]
    keeps = {tuple(r["source_labels"]): r["regex"] for r in rules if r.get("action") == "keep"}
    assert keeps == {
        ("__meta_kubernetes_pod_label_app_kubernetes_io_instance",
         "__meta_kubernetes_pod_labelpresent_app_kubernetes_io_instance"): "(e2e-p);true",
        ("__meta_kubernetes_pod_label_app_kubernetes_io_name",
         "__meta_kubernetes_pod_labelpresent_app_kubernetes_io_name"): "(ddp-trainer);true",
        ("__meta_kubernetes_pod_container_port_name",): "metrics"}
    assert {"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"],
            "regex": "(Failed|Succeeded)"} in rules
    assert rules[-4:] == [
        *({"source_labels": [f"__meta_kubernetes_pod_label_training_kubeflow_org_{k}"],
           "target_label": t, "action": "replace"}
          for k, t in (("job_name", "pytorchjob"), ("replica_type", "replica_type"),
                       ("replica_index", "replica_index"))),
        {"replacement": "PyTorchJob", "target_label": "job_kind", "action": "replace"}]
