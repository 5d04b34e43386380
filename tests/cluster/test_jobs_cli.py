"""`ddp-trainer jobs`, `kubectl ddp` and the kubeflow-training SDK against the real API server
and operator: on the chart's running, suspended and finished PyTorchJobs, and every error the
API server answers is one line with the documented exit code (docs/jobs.md)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster import sdk
from tests.cluster.helm import Release, release_name
from tests.cluster.jobs import (
    BIN,
    KEEP_OUTPUTS,
    SHORT,
    TRAINJOB,
    assert_logs_by_rank,
    jobs,
    uid,
    wait_until,
    waited_by_the_cli,
)
from tests.cluster.kube import (
    KUBECTL,
    REPO,
    STATE,
    Cluster,
    api_endpoint,
    merged,
    node_paths,
    restart_process,
)

EXIT_ERROR = 2  # every error of `jobs` (docs/jobs.md)


def assert_one_line(proc: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == code and len(lines) == 1, (proc.returncode, proc.stderr)
    assert lines[0].startswith("error: ") and "(fix: " in lines[0], lines[0]
    assert "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.fixture(scope="module")
def done(cluster: Cluster, chart_ref: str, tmp_path_factory: pytest.TempPathFactory) -> Release:
    """A chart job run to the end, found and waited for by `jobs wait`."""
    return waited_by_the_cli(Release(cluster, release_name(), cluster.namespace("jobscli"), SHORT),
                             chart_ref, tmp_path_factory.mktemp("done"))


def test_list_status_and_logs_show_the_finished_job(done: Release) -> None:
    ns = done.namespace
    listed = jobs("list", "-n", ns)
    assert listed.returncode == 0, listed.stderr
    (row,) = [line for line in listed.stdout.splitlines() if done.job in line]
    assert "Succeeded" in row.split()
    status = jobs("status", done.job, "-n", ns)
    assert status.returncode == 0, status.stderr
    # The Master's pod (a Worker still running when the Master completed is deleted by the
    # chart's cleanPodPolicy: Running, so it may be gone).
    assert f"{done.job}-master-0" in status.stdout and "State:       Succeeded" in status.stdout
    assert_logs_by_rank(done)
    # kubectl sees the same job, and the plugin is the same command.
    got = done.cluster.kubectl("get", "pytorchjobs", "-n", ns, "-o", "name").stdout
    assert f"pytorchjob.kubeflow.org/{done.job}" in got.split()
    env = {**os.environ, "KUBECONFIG": str(STATE / "kubeconfig"), "PATH":
           f"{BIN}:{KUBECTL.parent}:{os.environ['PATH']}"}
    plugin = subprocess.run([str(KUBECTL), "ddp", "list", "-n", ns], capture_output=True,
                            text=True, env=env, check=False)
    assert plugin.returncode == 0 and done.job in plugin.stdout, plugin.stderr


SDK_SCRIPT = """
from kubeflow.training import TrainingClient
client = TrainingClient(config_file=config, namespace=namespace)
listed = [job.metadata.name for job in client.list_jobs(job_kind="PyTorchJob")]
job = client.get_job(name, job_kind="PyTorchJob")
waited = client.wait_for_job_conditions(name, job_kind="PyTorchJob",
                                        expected_conditions={"Succeeded"},
                                        polling_interval=1, wait_timeout=60)
logs, _ = client.get_job_logs(name, job_kind="PyTorchJob", is_master=True)
print(json.dumps({"listed": listed,
                  "workers": job.spec.pytorch_replica_specs["Worker"].replicas,
                  "waited": [c.type for c in waited.status.conditions if c.status == "True"],
                  "logs": logs}))
"""


def test_the_kubeflow_training_sdk_reads_and_waits_on_the_charts_job(done: Release) -> None:
    got = sdk.run(SDK_SCRIPT, config=str(STATE / "kubeconfig"), namespace=done.namespace,
                  name=done.job)
    assert done.job in got["listed"]
    assert got["workers"] == 1
    assert "Succeeded" in got["waited"]
    (master_log,) = got["logs"].values()
    assert "done:" in master_log


def test_suspend_deletes_the_pods_and_resume_runs_the_job_to_the_end(
        cluster: Cluster, chart_ref: str, tmp_path: Path) -> None:
    # 100 short epochs (about 10 s of training), so the run is still going when it is
    # suspended. It is suspended once rank 0 has logged the global batch, which it does after
    # the rendezvous, so both trainers handle SIGTERM by then: a pod deleted before its
    # trainer does (PID 1 ignores what it has no handler for) stays Terminating for its whole
    # grace period, 120 s (CI took 156 s once, suspending as soon as the containers ran).
    release = Release(cluster, release_name(), cluster.namespace("suspend"),
                      merged(SHORT, {"runPolicy": {"suspend": True},
                                     "trainerConfig": {"train": {"epochs": 100}}}))
    release.install(chart_ref, tmp=tmp_path)
    ns = release.namespace
    cluster.wait(f"pytorchjob/{release.job}", "condition=Suspended", ns)
    assert uid(release, "master") is None  # suspended from the start: no pods
    resumed = jobs("resume", release.job, "-n", ns)
    assert resumed.returncode == 0, resumed.stderr
    for replica in ("master", "worker"):
        wait_until(lambda r=replica: uid(release, r) is not None, f"the {replica} pod")
    wait_until(lambda: "INFO global batch " in cluster.kubectl(
        "logs", release.pod("master"), "-n", ns, check=False).stdout, "the ranks' rendezvous")
    suspended = jobs("suspend", release.job, "-n", ns)
    assert suspended.returncode == 0, suspended.stderr
    cluster.wait(f"pytorchjob/{release.job}", "condition=Suspended", ns)
    wait_until(lambda: uid(release, "master") is None, "the pods deleted by the suspension")
    assert jobs("resume", release.job, "-n", ns).returncode == 0
    waited = jobs("wait", release.job, "-n", ns, timeout=600)
    assert waited.returncode == 0, waited.stderr
    deleted = jobs("delete", release.job, "-n", ns)
    assert deleted.returncode == 0, deleted.stderr
    gone = cluster.kubectl("get", "pytorchjob", release.job, "-n", ns, check=False)
    assert gone.returncode != 0 and "NotFound" in gone.stderr


def test_a_change_an_admission_policy_refuses_is_one_line_exit_2(
        cluster: Cluster, chart_ref: str, tmp_path: Path) -> None:
    # A ValidatingAdmissionPolicy (the API server's own CEL admission) that keeps PyTorchJobs
    # of this namespace suspended: the API server answers a resume with 422 and its message.
    release = Release(cluster, release_name(), cluster.namespace("vap"),
                      merged(SHORT, {"runPolicy": {"suspend": True}}))
    release.install(chart_ref, tmp=tmp_path)
    ns, name = release.namespace, f"stay-suspended-{release.namespace}"
    cluster.apply(
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
         "metadata": {"name": name},
         "spec": {"failurePolicy": "Fail",
                  "matchConstraints": {"resourceRules": [{
                      "apiGroups": ["kubeflow.org"], "apiVersions": ["v1"],
                      "operations": ["UPDATE"], "resources": ["pytorchjobs"]}]},
                  "validations": [{
                      "expression": "has(object.spec.runPolicy) && "
                                    "has(object.spec.runPolicy.suspend) && "
                                    "object.spec.runPolicy.suspend",
                      "message": "jobs stay suspended here", "reason": "Invalid"}]}},
        {"apiVersion": "admissionregistration.k8s.io/v1",
         "kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": name},
         "spec": {"policyName": name, "validationActions": ["Deny"],
                  "matchResources": {"namespaceSelector": {"matchLabels": {
                      "kubernetes.io/metadata.name": ns}}}}})
    try:
        # The API server enforces the policy once its informer has it; a resume that got
        # through before is suspended back (which the policy allows) and tried again.
        def refused() -> bool:
            proc = jobs("resume", release.job, "-n", ns)
            if proc.returncode == 0:
                assert jobs("suspend", release.job, "-n", ns).returncode == 0
                return False
            assert_one_line(proc, EXIT_ERROR, "refused to", "as invalid",
                            "jobs stay suspended here")
            return True

        wait_until(refused, "the admission policy enforced", timeout=60)
    finally:
        cluster.kubectl("delete", "validatingadmissionpolicybinding,"
                        "validatingadmissionpolicy", name, check=False)


# The API server's admission refuses each pod; the controllers only record it as an event on
# the object they act for: the PyTorchJob (the training operator's FailedCreatePod) and the
# TrainJob's child Job (the Job controller's FailedCreate).
NO_PRIORITY_CLASS = {"priorityClassName": "no-such-class"}
NO_CLASS_FOUND = "no PriorityClass with name no-such-class was found"


@pytest.mark.parametrize("kind", [{}, merged(TRAINJOB, {"trainJob": {"createRuntime": True}})],
                         ids=["pytorchjob", "trainjob"])
def test_status_shows_why_a_job_has_no_pods(
        cluster: Cluster, chart_ref: str, tmp_path: Path, kind: dict[str, object]) -> None:
    release = Release(cluster, release_name(), cluster.namespace("nopods"),
                      merged(SHORT, NO_PRIORITY_CLASS, kind))
    release.install(chart_ref, tmp=tmp_path)
    # as a user holding only the documented Role: it must be enough to see the warnings
    role = documented_role(release.namespace)
    cluster.apply(role)
    user = service_account_kubeconfig(cluster, release.namespace, "viewer",
                                      tmp_path / "viewer.kubeconfig")
    cluster.kubectl("create", "rolebinding", "viewer", "-n", release.namespace,
                    f"--role={role['metadata']['name']}",
                    f"--serviceaccount={release.namespace}:viewer")
    shown: list[str] = []

    def refusal_shown() -> bool:
        proc = jobs("status", release.job, kubeconfig=user)
        assert proc.returncode == 0, proc.stderr
        shown[:] = proc.stdout.split("Warnings:\n")[1].splitlines()
        return any(NO_CLASS_FOUND in line for line in shown)

    wait_until(refusal_shown, f"the {release.kind}'s refused pods in `jobs status`", timeout=120)
    print("\n".join(shown))
    assert cluster.kubectl("get", "pods", "-n", release.namespace, "-o", "name").stdout == ""


def test_a_missing_job_is_one_line_exit_2(done: Release) -> None:
    proc = jobs("status", "nosuch", "-n", done.namespace)
    assert_one_line(proc, EXIT_ERROR, "nosuch", "not found")


def service_account_kubeconfig(cluster: Cluster, ns: str, name: str, path: Path) -> Path:
    """A kubeconfig at `path` of a new ServiceAccount `name` in `ns` (its token from the
    TokenRequest API), with whatever RBAC is bound to it."""
    cluster.kubectl("create", "serviceaccount", name, "-n", ns)
    token = cluster.kubectl("create", "token", name, "-n", ns).stdout.strip()
    base = cluster.kubectl("config", "view", "--raw", "--minify", "-o",
                           "jsonpath={.clusters[0].cluster.server}").stdout
    ca = STATE / "pki" / "ca.crt"
    path.write_text(
        f"apiVersion: v1\nkind: Config\ncurrent-context: {name}\n"
        f"clusters: [{{name: c, cluster: {{server: '{base}', certificate-authority: '{ca}'}}}}]\n"
        f"users: [{{name: {name}, user: {{token: '{token}'}}}}]\n"
        f"contexts: [{{name: {name}, context: {{cluster: c, user: {name}, namespace: {ns}}}}}]\n")
    return path


@pytest.fixture
def unprivileged(cluster: Cluster, tmp_path: Path) -> Iterator[Path]:
    """A kubeconfig of a ServiceAccount with no RBAC binding at all: every read of a job is
    refused with 403."""
    yield service_account_kubeconfig(cluster, cluster.namespace("rbac"), "nobody",
                                     tmp_path / "nobody.kubeconfig")


def documented_role(namespace: str) -> dict[str, Any]:
    """The Role docs/jobs.md (Permissions) tells users to grant."""
    text = (REPO / "docs" / "jobs.md").read_text()
    found = re.search(r"### Permissions\n.*?```yaml\n(.*?)```", text, re.S)
    assert found, "no Role under docs/jobs.md's Permissions"
    role: dict[str, Any] = yaml.safe_load(found.group(1))
    role["metadata"]["namespace"] = namespace
    return role


def test_a_forbidden_user_is_one_line_exit_2(done: Release, unprivileged: Path) -> None:
    for args in (("list", "-n", done.namespace), ("status", done.job, "-n", done.namespace),
                 ("delete", done.job, "-n", done.namespace)):
        proc = jobs(*args, kubeconfig=unprivileged)
        assert_one_line(proc, EXIT_ERROR, "forbidden")
    done.cluster.get("pytorchjob", done.job, done.namespace)  # the refused delete left it


def test_the_api_server_going_away_mid_wait_is_one_line_exit_2(
        cluster: Cluster, chart_ref: str, tmp_path: Path) -> None:
    release = Release(cluster, release_name(), cluster.namespace("apigone"),
                      merged(SHORT, {"runPolicy": {"suspend": True}}))
    release.install(chart_ref, tmp=tmp_path)
    cluster.wait(f"pytorchjob/{release.job}", "condition=Suspended", release.namespace)
    env = {**os.environ, "KUBECONFIG": str(STATE / "kubeconfig")}
    waiting = subprocess.Popen([str(BIN / "ddp-trainer"), "jobs", "wait", release.job, "-n",
                                release.namespace, "--poll-interval", "0.5"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=env)
    try:
        # Mid-wait: the command holds a connection to the API server (a suspended job never
        # ends, so it keeps polling); then the API server dies and stays down until it gave up.
        wait_until(lambda: _connected(waiting.pid), "jobs wait connected to the API server",
                   timeout=60)
        pid = int((node_paths().pids / "kube-apiserver.pid").read_text())
        os.kill(pid, signal.SIGKILL)
        out, err = waiting.communicate(timeout=180)
    finally:
        waiting.kill()
        restart_process("kube-apiserver")  # the pid is gone: this starts it again
    assert_one_line(subprocess.CompletedProcess(waiting.args, waiting.returncode, out, err),
                    EXIT_ERROR)


def _connected(pid: int) -> bool:
    listed = subprocess.run(["ss", "-tnpH", "state", "established", "dst", api_endpoint()],
                            capture_output=True, text=True, check=False).stdout
    return f"pid={pid}," in listed


def test_fetch_copies_a_finished_jobs_outputs_claim_and_names_an_empty_dir(
        cluster: Cluster, chart_ref: str, tmp_path: Path, done: Release) -> None:
    # `done` kept its outputs in an emptyDir: gone with its pods, said in one line.
    gone = jobs("fetch", done.job, "-n", done.namespace, "--to", str(tmp_path / "none"))
    assert_one_line(gone, EXIT_ERROR, "an emptyDir: they went with its pods")
    kept = waited_by_the_cli(Release(cluster, release_name(), cluster.namespace("fetch"),
                                     merged(SHORT, KEEP_OUTPUTS)), chart_ref, tmp_path)
    got = jobs("fetch", kept.job, "-n", kept.namespace, "--to", str(tmp_path / "got"))
    assert got.returncode == 0, got.stderr
    assert "from claim " in got.stdout, got.stdout
    got_files = {p.relative_to(tmp_path / "got").as_posix()
                 for p in (tmp_path / "got").rglob("*") if p.is_file()}
    assert got_files == {"summary.json", "steps.jsonl", "model/model.safetensors",
                         "model/ddp-trainer.json"}, got_files
    summary = yaml.safe_load((tmp_path / "got" / "summary.json").read_text())
    assert summary["steps"] > 0 and summary["val_total"] == 359, summary
    # the pod that mounted the claim is gone
    left = cluster.kubectl("get", "pods", "-n", kept.namespace, "-l",
                           "app.kubernetes.io/component=fetch", "-o", "name").stdout
    assert left.strip() == "", left
