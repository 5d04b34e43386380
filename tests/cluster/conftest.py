"""The real single-node cluster (docs/cluster.md), brought up once per session if it is not
already running; `make test` takes it down after the run."""

from __future__ import annotations

import pytest

from tests.cluster.helm import push_chart
from tests.cluster.kube import Cluster, bring_up


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/cluster/" in str(item.fspath):
            item.add_marker(pytest.mark.cluster)
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def cluster() -> Cluster:
    return bring_up()


@pytest.fixture(scope="session")
def chart_ref(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The chart packaged and pushed to the cluster's registry: its oci:// reference."""
    return push_chart(cluster, tmp_path_factory.mktemp("chart"))
