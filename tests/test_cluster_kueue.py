"""Kueue on the test cluster: its Configuration queues the chart's job kinds with
waitForPodsReady on, its ports are its own, only the webhooks of what it queues are installed,
and `KUEUE=0` leaves the add-on out of the build and the operators. Nothing is started."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tools.cluster import actions, builds, kueue
from tools.cluster.layout import Paths


def test_the_configuration_queues_the_charts_kinds_with_wait_for_pods_ready(
        tmp_path: Path) -> None:
    paths = Paths(tmp_path / "state", tmp_path / "runtime")
    kueue.write_config(paths)
    config = yaml.safe_load(kueue.config_path(paths).read_text())
    assert config["apiVersion"] == "config.kueue.x-k8s.io/v1beta2"
    assert set(config["integrations"]["frameworks"]) == {
        "kubeflow.org/pytorchjob", "trainer.kubeflow.org/trainjob", "jobset.x-k8s.io/jobset"}
    assert config["waitForPodsReady"]["timeout"] == "120s"
    assert config["manageJobsWithoutQueueName"] is False  # unqueued jobs run as before
    assert config["webhook"]["port"] == 9446
    assert config["internalCertManagement"]["webhookSecretName"] == kueue.KUEUE.secret
    assert kueue.arguments(paths)[-1] == str(kueue.config_path(paths))


def test_its_host_ports_are_no_other_operators() -> None:
    def ports(c: Any) -> set[str]:
        return {c.health.rsplit(":", 1)[1]} | {str(p.host) for p in c.ports}
    others = [op.controller for op in actions.OPERATORS if op.controller is not kueue.KUEUE]
    assert all(ports(kueue.KUEUE).isdisjoint(ports(c)) for c in others)


def _webhook(name: str, group: str, resource: str) -> dict[str, Any]:
    return {"name": name, "rules": [{"apiGroups": [group], "resources": [resource]}]}


def test_only_the_webhooks_of_what_it_queues_are_installed() -> None:
    config = {"kind": "MutatingWebhookConfiguration", "metadata": {"name": "m"}, "webhooks": [
        _webhook("mpod.kb.io", "", "pods"), _webhook("mjob.kb.io", "batch", "jobs"),
        _webhook("mtfjob.kb.io", "kubeflow.org", "tfjobs"),
        _webhook("mpytorchjob.kb.io", "kubeflow.org", "pytorchjobs"),
        _webhook("mtrainjob.kb.io", "trainer.kubeflow.org", "trainjobs"),
        _webhook("mjobset.kb.io", "jobset.x-k8s.io", "jobsets"),
        _webhook("vworkload.kb.io", "kueue.x-k8s.io", "workloads/status")]}
    kept = [w["name"] for w in kueue.only_our_webhooks(config)["webhooks"]]
    assert kept == ["mpytorchjob.kb.io", "mtrainjob.kb.io", "mjobset.kb.io", "vworkload.kb.io"]


@pytest.mark.parametrize(("kind", "name", "kept"), [
    ("APIService", "v1beta2.visibility.kueue.x-k8s.io", False),
    ("Deployment", "kueue-controller-manager", False),
    ("Service", "kueue-visibility-server", False),
    ("Service", "kueue-webhook-service", True),
    ("CustomResourceDefinition", "workloads.kueue.x-k8s.io", True)])
def test_the_visibility_api_and_the_deployment_are_left_out(kind: str, name: str,
                                                            kept: bool) -> None:
    assert kueue.keep({"kind": kind, "metadata": {"name": name}}) is kept


def test_kueue_0_leaves_the_add_on_out(monkeypatch: pytest.MonkeyPatch) -> None:
    assert "kueue" in {g.name for g in builds.wanted_groups()}
    assert kueue.KUEUE in [op.controller for op in actions.wanted_operators()]
    monkeypatch.setenv("KUEUE", "0")
    assert "kueue" not in {g.name for g in builds.wanted_groups()}
    assert kueue.KUEUE not in [op.controller for op in actions.wanted_operators()]
    assert len(builds.wanted_groups()) == len(builds.GROUPS) - 1
