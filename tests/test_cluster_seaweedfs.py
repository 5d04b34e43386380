"""SeaweedFS on the test cluster (tools/cluster/seaweedfs.py): the object store action runs
after the operators, its pod passes Pod Security `restricted` in its namespace, the Secret the
tests copy holds the identity the server accepts, and its image is tagged by the build of
`weed`. Nothing is started (tests/cluster/test_s3_jobs.py runs it)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tools.cluster import actions, seaweedfs
from tools.cluster.procs import ClusterError

REF = "10.250.0.1:5000/seaweedfs:abc"


def kinds() -> dict[str, dict[str, Any]]:
    return {f"{o['kind']}/{o['metadata']['name']}": o for o in seaweedfs.objects(REF)}


def test_the_object_store_is_set_up_after_the_operators_and_before_the_chart_values() -> None:
    names = [a.name for a in actions.ACTIONS]
    assert names.index("operators") < names.index("object store") < names.index("chart values")


def test_the_secret_holds_the_identity_the_server_is_given() -> None:
    objects = kinds()
    secret = objects[f"Secret/{seaweedfs.SECRET}"]["stringData"]
    identities = json.loads(objects["Secret/seaweedfs-identities"]["stringData"]["s3.json"])
    (identity,) = identities["identities"]
    assert identity["credentials"] == [{"accessKey": secret["AWS_ACCESS_KEY_ID"],
                                        "secretKey": secret["AWS_SECRET_ACCESS_KEY"]}]
    assert {"Read", "Write", "List"} <= set(identity["actions"])


def test_the_pod_is_restricted_and_serves_s3_behind_the_service() -> None:
    objects = kinds()
    namespace = objects[f"Namespace/{seaweedfs.NAMESPACE}"]
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    pod = objects[f"Deployment/{seaweedfs.NAME}"]["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    assert container["image"] == REF
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert f"-s3.port={seaweedfs.PORT}" in container["args"]
    service = objects[f"Service/{seaweedfs.NAME}"]["spec"]
    assert service["ports"][0]["port"] == seaweedfs.PORT
    assert seaweedfs.ENDPOINT == "http://seaweedfs.s3.svc.cluster.local:8333"


def test_the_image_tag_follows_the_build_of_weed() -> None:
    one = seaweedfs.image(Path("/cache/seaweedfs-85ec14b6f32ae4d2/weed"))
    other = seaweedfs.image(Path("/cache/seaweedfs-0123456789abcdef/weed"))
    assert one.endswith(":85ec14b6f32ae4d2") and one != other


def test_without_s3fs_the_bucket_step_fails_in_one_line_naming_the_fix(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "s3fs", None)  # import s3fs raises ImportError
    with pytest.raises(ClusterError, match=r"s3fs.*fix: make venv"):
        seaweedfs.bucket_made("http://127.0.0.1:1")
