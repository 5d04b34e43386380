"""The harness's changes to the operator's pods before podman plays them: exactly the four
things podman 4.3 does differently from a kubelet (tests/e2e/harness/kubelet.py)."""

from __future__ import annotations

import copy
from typing import Any

from tests.e2e.harness.chart import render
from tests.e2e.harness.kubelet import playable
from tests.e2e.harness.operator import replica_pods


def pods(values: dict[str, Any] | None = None) -> list[Any]:
    return replica_pods(render({"gpusPerReplica": 0, **(values or {})}, "e2e-k", "ns").job)


def test_each_empty_dir_becomes_a_volume_of_its_own_pod() -> None:
    master, worker = (playable(p) for p in pods())
    assert {e.volume for e in master.empty_dirs} == {"dshm", "tmp", "checkpoints", "outputs"}
    assert master.podman_volume("checkpoints") == f"{master.name}-checkpoints"
    assert worker.podman_volume("checkpoints") == f"{worker.name}-checkpoints"
    assert [e.memory for e in master.empty_dirs if e.volume == "dshm"] == [True]
    assert master.claims == ()


def test_a_pvc_stays_a_claim_shared_by_the_pods() -> None:
    values = {"persistence": {"checkpoints": {"existingClaim": "ckpt"}}}
    master, worker = (playable(p) for p in pods(values))
    assert master.claims == worker.claims == ("ckpt",)
    assert master.podman_volume("checkpoints") == worker.podman_volume("checkpoints") == "ckpt"


def test_only_ports_namespace_and_restart_policy_change_in_the_container() -> None:
    replica = pods({"restartPolicy": "OnFailure"})[1]
    played = playable(replica)
    (before,) = replica.manifest["spec"]["containers"]
    (after,) = played.manifest["spec"]["containers"]
    expected = copy.deepcopy(before)
    expected.pop("ports")
    for env in expected["env"]:
        if env["name"] == "POD_NAMESPACE":
            env.pop("valueFrom")
            env["value"] = "ns"
    assert after == expected
    assert played.manifest["spec"]["restartPolicy"] == "Never"
    assert played.replica.restart_policy == "OnFailure"  # the harness plays it
    assert {k: v for k, v in played.manifest["spec"].items()
            if k not in ("containers", "volumes", "restartPolicy")} == {
        k: v for k, v in replica.manifest["spec"].items()
        if k not in ("containers", "volumes", "restartPolicy")}


def test_the_grace_period_and_fs_group_come_from_the_pod() -> None:
    played = playable(pods({"terminationGracePeriodSeconds": 45})[0])
    assert (played.grace_seconds, played.fs_group) == (45, 10001)
    assert played.container == f"{played.name}-pytorch"
