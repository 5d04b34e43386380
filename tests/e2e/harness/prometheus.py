"""A real Prometheus scraping a played job's pods as the chart's PodMonitor makes it scrape.

No Kubernetes API server runs here, so Kubernetes service discovery is replaced by file
service discovery: the harness writes, for every container port of every pod, the target
and the ``__meta_kubernetes_*`` labels Kubernetes SD (role ``pod``) would give it, and
rewrites the file when pods start, restart, stop or move. The scrape config is the one
prometheus-operator v0.93.0 generates for a PodMonitor (pkg/prometheus/promcfg.go,
generatePodMonitorConfig, commit f8fafd47, Apache-2.0), for the fields the chart uses: keep
running pods, the selector's ``matchLabels``, the endpoint's port; the ``namespace``,
``container``, ``pod``, ``job`` and ``endpoint`` labels; then the PodMonitor's own
relabelings, verbatim. Prometheus itself applies all of it.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tests.e2e.harness.job import PlayedJob
from tests.support.prometheus import PrometheusServer

_INVALID = re.compile(r"[^a-zA-Z0-9_]")


def sanitize(name: str) -> str:
    """sanitizeLabelName: a Kubernetes label key as a Prometheus label name."""
    return _INVALID.sub("_", name)


def relabel(rule: Mapping[str, Any]) -> dict[str, Any]:
    """A PodMonitor RelabelConfig (camelCase) as Prometheus config (generateRelabelConfig)."""
    keys = {"sourceLabels": "source_labels", "targetLabel": "target_label"}
    out = {keys.get(k, k): v for k, v in rule.items()}
    if "action" in out:
        out["action"] = str(out["action"]).lower()
    return out


def scrape_config(monitor: Mapping[str, Any], endpoint: int, sd_file: Path) -> dict[str, Any]:
    """generatePodMonitorConfig for endpoint `endpoint` of `monitor`."""
    meta, spec = monitor["metadata"], monitor["spec"]
    ep = spec["podMetricsEndpoints"][endpoint]
    rules: list[dict[str, Any]] = [
        {"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"},
        {"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"],
         "regex": "(Failed|Succeeded)"},
    ]
    for key, value in sorted(spec.get("selector", {}).get("matchLabels", {}).items()):
        rules.append({"action": "keep",
                      "source_labels": [f"__meta_kubernetes_pod_label_{sanitize(key)}",
                                        f"__meta_kubernetes_pod_labelpresent_{sanitize(key)}"],
                      "regex": f"({value});true"})
    rules.append({"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_name"],
                  "regex": ep["port"]})
    rules += [{"source_labels": [f"__meta_kubernetes_{src}"], "target_label": dst}
              for src, dst in (("namespace", "namespace"), ("pod_container_name", "container"),
                               ("pod_name", "pod"))]
    rules.append({"target_label": "job", "replacement": f"{meta['namespace']}/{meta['name']}"})
    rules.append({"target_label": "endpoint", "replacement": ep["port"]})
    rules += [relabel(r) for r in ep.get("relabelings", [])]
    config: dict[str, Any] = {
        "job_name": f"podMonitor/{meta['namespace']}/{meta['name']}/{endpoint}",
        "file_sd_configs": [{"files": [str(sd_file)]}],
        "relabel_configs": rules,
    }
    for key, name in (("interval", "scrape_interval"), ("scrapeTimeout", "scrape_timeout"),
                      ("path", "metrics_path")):
        if ep.get(key):
            config[name] = ep[key]
    return config


def pod_targets(job: PlayedJob) -> list[dict[str, Any]]:
    """Kubernetes SD role=pod: one target per declared container port of every pod."""
    out: list[dict[str, Any]] = []
    for pod in job.pods:
        state = job.state(pod)
        if state.status == "missing":
            continue  # deleted: Kubernetes SD drops it
        record = job.records[pod.name]
        phase = ("Running" if state.running or not record.done else
                 "Succeeded" if record.exits[-1:] == [0] else "Failed")
        manifest = pod.replica.manifest  # the operator's pod (the played one has no ports)
        labels = {"__meta_kubernetes_namespace": manifest["metadata"]["namespace"],
                  "__meta_kubernetes_pod_name": pod.name,
                  "__meta_kubernetes_pod_phase": phase}
        for key, value in manifest["metadata"].get("labels", {}).items():
            labels[f"__meta_kubernetes_pod_label_{sanitize(key)}"] = str(value)
            labels[f"__meta_kubernetes_pod_labelpresent_{sanitize(key)}"] = "true"
        ip = job.pod_ip(pod)
        if not ip:
            continue  # stopped: no address (and its phase drops it anyway)
        for container in manifest["spec"]["containers"]:
            for port in container.get("ports", []):
                out.append({"targets": [f"{ip}:{port['containerPort']}"], "labels": {
                    **labels, "__meta_kubernetes_pod_container_name": container["name"],
                    "__meta_kubernetes_pod_container_port_name": port.get("name", ""),
                    "__meta_kubernetes_pod_container_port_number": str(port["containerPort"])}})
    return out


def write_targets(path: Path, targets: Sequence[Mapping[str, Any]]) -> None:
    """Atomically, so Prometheus never reads half a file."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(list(targets), indent=1))
    os.replace(tmp, path)


class PodMonitorPrometheus(PrometheusServer):
    """tests/support/prometheus.py's server with a PodMonitor's scrape config instead of a
    static one. Call :meth:`refresh` (the job's ``on_change``) when pods change."""

    def __init__(self, monitor: Mapping[str, Any], directory: Path) -> None:
        super().__init__([], scrape_interval="1s")
        self.sd_file = directory / "pods.json"
        write_targets(self.sd_file, [])
        self.monitor = monitor

    def _config(self) -> dict[str, Any]:
        config = super()._config()
        config["scrape_configs"] = [scrape_config(self.monitor, 0, self.sd_file)]
        return config

    def refresh(self, job: PlayedJob) -> None:
        write_targets(self.sd_file, pod_targets(job))
