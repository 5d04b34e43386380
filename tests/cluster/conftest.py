"""The real cluster (docs/cluster.md), brought up once per session if it is not already
running; `make test` takes it down after the run."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.cluster.helm import Release, release, release_name
from tests.cluster.jobs import FAILOVER, KEEP_OUTPUTS, Finished, finished
from tests.cluster.kube import Cluster, bring_up, merged


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/cluster/" in str(item.fspath):
            item.add_marker(pytest.mark.cluster)
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def cluster() -> Cluster:
    return bring_up()


@pytest.fixture(scope="session")
def chart_ref(cluster: Cluster) -> str:
    """`make release` to the cluster's registry: the chart's oci:// reference."""
    return release(cluster)


@pytest.fixture(scope="session")
def uninterrupted(cluster: Cluster, chart_ref: str,
                  tmp_path_factory: pytest.TempPathFactory) -> Finished:
    """The failover run (tests/cluster/jobs.py) left alone: the numbers every interrupted run
    of it must end with, whatever interrupted it and wherever its checkpoints were (a pod's
    disk, a claim, the bucket). Once a session: a run is a minute of CI."""
    base = Release(cluster, release_name(), cluster.namespace("base"),
                   merged(FAILOVER, KEEP_OUTPUTS))
    base.install(chart_ref, tmp=tmp_path_factory.mktemp("base"))
    found = finished(base)
    found.assert_agrees()
    assert not found.summary.get("resumed_from_step")
    return found


@pytest.fixture
def advertised_gpus(cluster: Cluster) -> Iterator[None]:
    """The node advertises 4 `nvidia.com/gpu` (an extended resource in its status, the way
    Kubernetes documents advertising one by hand): the stand-in for a GPU node's device
    plugin, so that a pod requesting 2 is scheduled. The ranks themselves run on the CPU."""
    path = "/status/capacity/nvidia.com~1gpu"
    cluster.kubectl("patch", "node", cluster.node, "--subresource=status", "--type=json",
                    "-p", f'[{{"op": "add", "path": "{path}", "value": "4"}}]')
    yield
    cluster.kubectl("patch", "node", cluster.node, "--subresource=status", "--type=json",
                    "-p", f'[{{"op": "remove", "path": "{path}"}}]', check=False)
