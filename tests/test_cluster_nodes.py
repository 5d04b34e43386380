"""The test cluster's nodes share nothing a node owns: each writes its own configuration, with
its own runtime state, socket, runc root, pod subnet, bridge, cgroup root and addresses (what
lets two kubelets and two containerds run on one host without treading on each other); and the
node commands refuse what they cannot do in one line. No root needed: nothing is started."""

from __future__ import annotations

import ipaddress
import itertools
import json
from pathlib import Path
from typing import Any

import pytest
import tomllib
import yaml

from tools.cluster import cli, configs, nodes
from tools.cluster.layout import CLUSTER_CIDR, NODE_NETWORK_PREFIX, NODES, Paths


@pytest.fixture
def written(tmp_path: Path) -> dict[str, dict[str, Any]]:
    """Every node's containerd, CNI, kubelet and kube-proxy configuration, as `up` writes it."""
    paths = Paths(tmp_path / "state", tmp_path / "runtime")
    found: dict[str, dict[str, Any]] = {}
    for node in NODES:
        found[node.name] = {
            "containerd": tomllib.loads(configs.containerd(paths, node).read_text()),
            "cni": json.loads(configs.cni(paths, node).read_text()),
            "kubelet": json.loads(configs.kubelet(paths, node).read_text()),
            "kube-proxy": json.loads(configs.kube_proxy(paths, node).read_text()),
        }
    return found


def owned(node: dict[str, Any]) -> set[str]:
    """What a node must not share: state folders, sockets, subnets, bridges, cgroups, addresses."""
    containerd = node["containerd"]
    cni = node["cni"]["plugins"][0]
    kubelet = node["kubelet"]
    cri = containerd["plugins"]["io.containerd.grpc.v1.cri"]
    runc = cri["containerd"]["runtimes"]["runc"]["options"]
    return {
        containerd["root"], containerd["state"], containerd["grpc"]["address"],
        runc["Root"], cri["cni"]["conf_dir"], cni["bridge"], cni["ipam"]["dataDir"],
        cni["ipam"]["ranges"][0][0]["subnet"], kubelet["containerRuntimeEndpoint"],
        kubelet["tlsCertFile"], kubelet.get("cgroupRoot", "/"),
        kubelet.get("podLogsDir", "/var/log/pods"),
        node["kube-proxy"]["healthzBindAddress"],
    }


def test_no_two_nodes_share_a_folder_socket_subnet_bridge_cgroup_or_address(
        written: dict[str, dict[str, Any]]) -> None:
    assert len(written) == len(NODES) == 2
    assert len({n.netns for n in NODES}) == len(NODES)
    for (a, left), (b, right) in itertools.combinations(written.items(), 2):
        assert owned(left).isdisjoint(owned(right)), (a, b, owned(left) & owned(right))


def test_every_pod_subnet_lies_in_the_cluster_cidr_and_every_node_on_the_nodes_network() -> None:
    cluster = ipaddress.ip_network(CLUSTER_CIDR)
    network = ipaddress.ip_network(f"{NODES[0].ip}/{NODE_NETWORK_PREFIX}", strict=False)
    for node in NODES:
        assert ipaddress.ip_network(node.pod_subnet).subnet_of(cluster)
        assert ipaddress.ip_address(node.ip) in network
    assert len({ipaddress.ip_network(n.pod_subnet) for n in NODES}) == len(NODES)


def test_a_further_node_runs_in_its_network_namespace_and_the_first_on_the_host() -> None:
    first, second = NODES
    assert first.wrap(["kubelet"]) == ["kubelet"]
    assert second.wrap(["kubelet"]) == ["nsenter", "--net=/run/netns/ddp-node-2", "--", "kubelet"]
    assert nodes.veth(second) == "ddpv2" and len(nodes.veth(second)) <= 15  # IFNAMSIZ


@pytest.mark.parametrize(("argv", "says"), [
    (["up", "--nodes", "3"],
     "--nodes 3: this cluster has 1 to 2 nodes (fix: --nodes 1 or --nodes 2)"),
    (["up", "--nodes", "0"], "--nodes 0: this cluster has 1 to 2 nodes"),
    (["kill-node", "ddp-node"], "no further node ddp-node (fix: one of ddp-node-2; the first "
                                "node is the host)"),
    (["partition", "nodes-9"], "no further node nodes-9"),
])
def test_node_commands_refuse_what_they_cannot_do_in_one_line(
        argv: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err, err


def test_the_claims_helper_pods_run_on_the_first_node_which_no_test_takes_down(
        tmp_path: Path) -> None:
    paths = Paths(tmp_path / "state", tmp_path / "runtime")
    pod = yaml.safe_load(configs.helper_pod(paths).read_text())
    assert pod["spec"]["nodeSelector"] == {"kubernetes.io/hostname": NODES[0].name}
    assert pod["spec"]["containers"][0]["image"] == configs.HELPER_IMAGE
