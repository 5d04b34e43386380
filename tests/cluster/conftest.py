"""The real cluster (docs/cluster.md), brought up once per session if it is not already
running; `make test` takes it down after the run, and runs the two-node tests beside the others
(tests/cluster/reserve.py): the tests marked `alone` run first, and never beside them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.cluster.helm import release
from tests.cluster.kube import Cluster, bring_up
from tests.cluster.reserve import holding


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/cluster/" in str(item.fspath):
            item.add_marker(pytest.mark.cluster)
            item.add_marker(pytest.mark.slow)
    # The `alone` tests first, so that they are over before `make test` starts the two-node
    # tests beside these; one that shares a module-scoped fixture (a finished job) last of them,
    # followed by the rest of its module, which then makes that job once.
    sharing = {item.path for item in items if _alone(item) and _module_fixtures(item)}
    index = {item.nodeid: i for i, item in enumerate(items)}

    def order(item: pytest.Item) -> tuple[int, bool, int]:
        if item.path in sharing:
            return 1, not _alone(item), index[item.nodeid]
        return (0 if _alone(item) else 2), False, index[item.nodeid]

    items.sort(key=order)


def _alone(item: pytest.Item) -> bool:
    return item.get_closest_marker("alone") is not None


def _module_fixtures(item: pytest.Item) -> list[str]:
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs.items() if info is not None else ()
    return [name for name, chain in defs if chain and chain[-1].scope == "module"]


@pytest.fixture(autouse=True)
def _alone_not_beside_the_two_node_tests(request: pytest.FixtureRequest) -> Iterator[None]:
    if request.node.get_closest_marker("alone"):
        with holding(exclusive=True):
            yield
    else:
        yield


@pytest.fixture(scope="session")
def cluster() -> Cluster:
    return bring_up()


@pytest.fixture(scope="session")
def chart_ref(cluster: Cluster) -> str:
    """`make release` to the cluster's registry: the chart's oci:// reference."""
    return release(cluster)


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
