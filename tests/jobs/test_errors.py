"""Failures are one line naming the problem and the fix, exit code 2, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import kmock
import pytest

from tests.jobs.cluster import JOBS, FakeCluster, kubeconfig
from trainer.jobs.cli import kubectl_main

REPO = Path(__file__).resolve().parents[2]


def one_line_error(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ") and "(fix: " in lines[0], err
    assert "Traceback" not in err
    return lines[0]


def test_unreachable_cluster_names_the_server_and_context(ddp, closed_port_url: str) -> None:
    result = ddp("list", "--context", "down")
    assert result.code == 2
    line = one_line_error(result.err)
    assert f"cannot reach the Kubernetes API server {closed_port_url} (context 'down')" in line
    assert "Connection refused" in line
    assert "kubectl cluster-info" in line


@pytest.mark.parametrize("command", [["list"], ["status", "mnist"], ["logs", "mnist"],
                                     ["wait", "mnist"], ["delete", "mnist"],
                                     ["suspend", "mnist"], ["resume", "mnist"]])
def test_every_command_reports_a_missing_crd_with_the_install_command(
        command: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    with FakeCluster(crd=False) as bare:
        path = tmp_path / "config"
        kubeconfig(path, {"bare": (bare.url, "training")}, current="bare")
        code = kubectl_main([*command, "--kubeconfig", str(path)])
    assert code == 2
    line = one_line_error(capsys.readouterr().err)
    assert ("serves neither pytorchjobs.kubeflow.org/v1 nor "
            "trainjobs.trainer.kubeflow.org/v1alpha1") in line
    assert "(no PyTorchJob or TrainJob CRD is installed)" in line
    assert "kubectl apply --server-side -k" in line and "training-operator" in line
    assert "kubeflow/trainer.git/manifests/overlays/manager?ref=v2.3.0" in line


@pytest.mark.parametrize(("kind", "resource", "hint"), [
    ("pytorchjob", "pytorchjobs.kubeflow.org/v1 (the PyTorchJob CRD", "training-operator"),
    ("trainjob", "trainjobs.trainer.kubeflow.org/v1alpha1 (the TrainJob CRD", "kubeflow/trainer")])
def test_asking_for_one_kind_names_only_its_crd(
        kind: str, resource: str, hint: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    with FakeCluster(crd=False) as bare:
        path = tmp_path / "config"
        kubeconfig(path, {"bare": (bare.url, "training")}, current="bare")
        code = kubectl_main(["list", "--kind", kind, "--kubeconfig", str(path)])
    assert code == 2
    line = one_line_error(capsys.readouterr().err)
    assert f"does not serve {resource} is not installed)" in line
    assert hint in line


@pytest.mark.parametrize("command", ["status", "logs", "wait", "delete", "suspend", "resume"])
def test_a_missing_job_is_named_with_its_namespace(ddp, command: str) -> None:
    result = ddp(command, "nope")
    assert result.code == 2
    line = one_line_error(result.err)
    assert 'pytorchjob "nope" not found in namespace "training"' in line
    assert "kubectl get pytorchjobs -A" in line


def test_rbac_denial_says_which_permissions_are_missing(ddp, cluster: FakeCluster) -> None:
    denied = kmock.KubernetesError(
        status=403, reason="Forbidden",
        message='pytorchjobs.kubeflow.org is forbidden: User "dev" cannot list resource '
                '"pytorchjobs" in API group "kubeflow.org" in the namespace "secret"')
    cluster.call(lambda: cluster.k["list", JOBS, kmock.namespace("secret")] << denied)
    result = ddp("list", "-n", "secret")
    assert result.code == 2
    line = one_line_error(result.err)
    assert "not allowed to list pytorchjobs in namespace 'secret'" in line
    assert 'User "dev" cannot list resource' in line
    assert "ask for RBAC on pytorchjobs.kubeflow.org" in line


@pytest.mark.parametrize(("status", "reason", "needles"), [
    (422, "Invalid", ["refused to suspend", "as invalid", "no suspending here",
                      "ask the cluster's admin"]),
    (409, "Conflict", ["409 Conflict", "the job changed meanwhile"]),
])
def test_a_refused_or_conflicting_change_is_one_line_naming_the_rule(
        ddp, cluster: FakeCluster, status: int, reason: str, needles: list[str]) -> None:
    refused = kmock.KubernetesError(status=status, reason=reason,
                                    message="no suspending here")
    cluster.call(lambda: cluster.k["patch", JOBS, kmock.namespace("training")] << refused)
    result = ddp("suspend", "mnist")
    assert result.code == 2
    line = one_line_error(result.err)
    for needle in needles:
        assert needle in line, line


def test_a_missing_crd_of_one_kind_does_not_hide_the_jobs_of_the_other(ddp) -> None:
    # The emulator of the `cluster` fixture serves PyTorchJobs only.
    result = ddp("list")
    assert result.code == 0, result.err
    assert result.out.splitlines()[0].split() == ["NAME", "STATE", "AGE", "REPLICAS", "GPUS"]
    assert ddp("list", "--kind", "trainjob").code == 2


def test_unknown_context_lists_the_known_ones(ddp) -> None:
    result = ddp("list", "--context", "prod")
    assert result.code == 2
    line = one_line_error(result.err)
    assert "context 'prod' is not in kubeconfig" in line
    assert "use one of: emulator, down" in line


def test_missing_kubeconfig_says_how_to_point_at_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert kubectl_main(["list"]) == 2
    line = one_line_error(capsys.readouterr().err)
    assert f"no kubeconfig at {tmp_path / 'absent'}" in line
    assert "--kubeconfig" in line


@pytest.mark.parametrize(("data", "problem"), [
    (b"\x00\x01garbage: [\n", "is not valid YAML: unacceptable character #x0000"),
    (b"hello world\n", "is not a kubeconfig: a str, not a mapping"),
    (b"\xff\xfe", "is not UTF-8 text (byte 0xff at offset 0)"),
    (b"apiVersion: v1\nclusters: 3\n", "clusters is not a list of entries with a name"),
    (b"contexts:\n- name: a\n  context: 3\ncurrent-context: a\n",
     "has no usable context: AttributeError"),
], ids=["binary", "text", "not-utf8", "clusters-int", "context-int"])
def test_a_garbage_kubeconfig_is_named_with_its_problem(
        data: bytes, problem: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "garbage"
    path.write_bytes(data)
    assert kubectl_main(["list", "--kubeconfig", str(path)]) == 2
    line = one_line_error(capsys.readouterr().err)
    assert f"kubeconfig {path}" in line and problem in line, line
    assert "user code" not in line


@pytest.mark.parametrize("argv", [["list", "--request-timeout", "-1"],
                                  ["list", "--request-timeout", "nan"],
                                  ["list", "--request-timeout", "1e300"],
                                  ["wait", "mnist", "--poll-interval", "-1"],
                                  ["wait", "mnist", "--poll-interval", "inf"]])
def test_a_duration_flag_out_of_range_is_named(
        argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert kubectl_main(argv) == 2
    line = one_line_error(capsys.readouterr().err)
    assert f"{argv[-2]} {float(argv[-1]):g} is not a number of seconds > 0" in line, line


# A value the server would misread: an empty name fetches the list of jobs (shown as an empty
# job), a negative --tail shows nothing, a --rate-window is pasted into PromQL.
BAD_ARGUMENTS = {
    "empty-name": (["status", ""], "job name '' is not a Kubernetes object name"),
    "name-with-a-slash": (["logs", "mnist/x"], "job name 'mnist/x' is not a Kubernetes"),
    "name-in-capitals": (["delete", "MNIST"], "job name 'MNIST' is not a Kubernetes"),
    "name-too-long": (["wait", "a" * 254], "job name 'aaaaaaaaaa"),
    "namespace-with-underscore": (["list", "-n", "my_ns"], "namespace 'my_ns' (-n/--namespace)"),
    "namespace-with-a-dot": (["status", "mnist", "-n", "a.b"], "namespace 'a.b'"),
    "negative-tail": (["logs", "mnist", "--tail", "-5"], "--tail -5 is negative"),
    "prometheus-not-a-url": (["status", "mnist", "--prometheus", "localhost:9090"],
                             "--prometheus 'localhost:9090' is not an http(s) URL"),
    "prometheus-ftp": (["status", "mnist", "--prometheus", "ftp://prom"], "not an http(s) URL"),
    "prometheus-open-ipv6": (["status", "mnist", "--prometheus", "http://[::1"],
                             "--prometheus 'http://[::1' is not a valid URL (Invalid IPv6 URL)"),
    "prometheus-port-out-of-range": (["status", "mnist", "--prometheus", "http://h:99999"],
                                     "--prometheus 'http://h:99999' is not a valid URL (Port "),
    "rate-window-not-a-duration": (["status", "mnist", "--rate-window", "1m])"],
                                   "--rate-window '1m])' is not a Prometheus duration"),
    "rate-window-zero": (["status", "mnist", "--rate-window", "0s"], "--rate-window '0s'"),
    "timeout-not-a-duration": (["wait", "mnist", "--timeout", "soon"], "--timeout 'soon'"),
}


@pytest.mark.parametrize("case", sorted(BAD_ARGUMENTS))
def test_a_name_or_flag_the_server_would_misread_is_named_before_any_request(
        case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    # No kubeconfig at all: a check made after loading it would fail on that instead.
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    argv, named = BAD_ARGUMENTS[case]
    assert kubectl_main(argv) == 2
    line = one_line_error(capsys.readouterr().err)
    assert named in line, line
    assert len(line) < 300, line  # a long name is cut, not echoed whole


def test_a_namespace_from_the_context_that_is_no_namespace_name_is_named(
        cluster: FakeCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "kubeconfig.yaml"
    kubeconfig(path, {"typo": (cluster.url, "Training")}, current="typo")
    monkeypatch.setenv("KUBECONFIG", str(path))
    assert kubectl_main(["list"]) == 2
    line = one_line_error(capsys.readouterr().err)
    assert "namespace 'Training' (the kubeconfig context's)" in line, line


def test_kubeconfig_flag_wins_over_the_environment(
        cluster: FakeCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    path = tmp_path / "explicit"
    kubeconfig(path, {"mine": (cluster.url, "research")}, current="mine")
    assert kubectl_main(["list", "--kubeconfig", str(path)]) == 0
    assert capsys.readouterr().out.splitlines()[1].split()[0] == "sweep"


def test_kubeconfig_path_list_is_merged_like_kubectl(
        cluster: FakeCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    kubeconfig(first, {"a": ("http://127.0.0.1:9", "training")}, current="a")
    kubeconfig(second, {"b": (cluster.url, "research")}, current="b")
    monkeypatch.setenv("KUBECONFIG", f"{first}{os.pathsep}{second}")
    assert kubectl_main(["list", "--context", "b"]) == 0
    assert "sweep" in capsys.readouterr().out


def test_without_the_k8s_extra_the_trainer_works_and_jobs_say_what_to_install() -> None:
    # A fresh interpreter in which `import kubernetes` fails, as without the extra.
    code = (
        "import sys\n"
        "sys.modules['kubernetes'] = None\n"
        "from trainer.cli import build_parser\n"
        "build_parser().parse_args(['train', '--help'])\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    helped = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=env, cwd=REPO, timeout=120, check=False)
    assert helped.returncode == 0, helped.stderr
    assert "--max-steps" in helped.stdout

    code = (
        "import sys\n"
        "sys.modules['kubernetes'] = None\n"
        "from trainer.jobs.cli import kubectl_main\n"
        "sys.exit(kubectl_main(['list']))\n"
    )
    failed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=env, cwd=REPO, timeout=120, check=False)
    assert failed.returncode == 2
    line = one_line_error(failed.stderr)
    assert "need the Python package 'kubernetes'" in line
    # no ddp-trainer package is published: the fix installs the clone's extra or its one package
    assert "from the clone, pip install -e '.[k8s]'" in line
    import tomllib
    (pin,) = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["k8s"]
    assert f"pip install '{pin}'" in line
    assert "ddp-trainer[k8s]" not in line


def test_a_server_that_never_answers_fails_after_the_request_timeout(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    import socket
    import time

    # The kernel completes the TCP handshake into the backlog; nobody ever reads or answers.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        path = tmp_path / "config"
        kubeconfig(path, {"silent": (url, "training")}, current="silent")
        started = time.monotonic()
        code = kubectl_main(["status", "mnist", "--kubeconfig", str(path),
                             "--request-timeout", "0.5"])
        elapsed = time.monotonic() - started
    assert code == 2
    line = one_line_error(capsys.readouterr().err)
    assert f"cannot reach the Kubernetes API server {url}" in line
    assert "timed out" in line
    assert elapsed < 10


@pytest.mark.parametrize(("path", "answer", "needles"), [
    # A discovery document whose resource lacks `namespaced` (and `singularName`).
    ("/apis/kubeflow.org/v1",
     {"kind": "APIResourceList", "groupVersion": "kubeflow.org/v1",
      "resources": [{"name": "pytorchjobs", "kind": "PyTorchJob", "verbs": ["list"]}]},
     ["to discover the served job kinds", "namespaced: "]),
    # A list whose items are not objects.
    ("/apis/kubeflow.org/v1/namespaces/training/pytorchjobs",
     {"kind": "PyTorchJobList", "apiVersion": "kubeflow.org/v1", "items": ["mnist"]},
     ["to list pytorchjobs"]),
])
def test_a_malformed_answer_is_one_line_exit_2(ddp, cluster: FakeCluster, path: str,
                                               answer: dict[str, object],
                                               needles: list[str]) -> None:
    cluster.call(lambda: cluster.k[kmock.path(path)] << answer)
    result = ddp("list")
    assert result.code == 2
    line = one_line_error(result.err)
    assert f"unexpected answer from the API server {cluster.url}" in line
    for needle in needles:
        assert needle in line, line


EXEC_KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "http://127.0.0.1:9"}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
users:
- name: u
  user:
    exec: {apiVersion: client.authentication.k8s.io/v1beta1, command: %s%s}
"""


@pytest.mark.parametrize(("command", "hint", "named"), [
    ("ddp-no-such-plugin", "", "exec plugin 'ddp-no-such-plugin', which is not found on PATH "
                               "(fix: install it, or fix users[].user.exec.command there)"),
    ("./bin/ddp-no-such-plugin", ", installHint: 'pip install the-plugin'",
     "exec plugin './bin/ddp-no-such-plugin', which is not found (fix: pip install the-plugin; "
     "or fix users[].user.exec.command there)"),
], ids=["on-path", "relative-with-hint"])
def test_a_missing_exec_credential_plugin_is_named_not_the_api_server(
        command: str, hint: str, named: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(EXEC_KUBECONFIG % (command, hint))
    assert kubectl_main(["list", "--kubeconfig", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err  # no line of the client's before ours
    line = one_line_error(err)
    assert f"kubeconfig {path}: user 'u' gets its credentials from the {named}" in line, line
def test_an_exec_credential_plugin_that_never_answers_fails_after_the_request_timeout(
        tmp_path: Path) -> None:
    import time

    import yaml

    path = tmp_path / "config"
    kubeconfig(path, {"eks": ("https://127.0.0.1:1", "training")}, current="eks")
    doc = yaml.safe_load(path.read_text())
    plugin = tmp_path / "get-token"  # waits as one stuck on a login or a network would
    plugin.write_text(f"#!{sys.executable}\nimport time\ntime.sleep(120)\n")
    plugin.chmod(0o755)
    doc["users"][0]["user"] = {"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1",
                                        "command": str(plugin)}}
    path.write_text(yaml.safe_dump(doc))
    started = time.monotonic()
    # a process of its own: without the bound it would wait for ever
    proc = subprocess.run([sys.executable, "-m", "trainer", "jobs", "list", "--kubeconfig",
                           str(path), "--request-timeout", "1"], capture_output=True, text=True,
                          timeout=90, check=False, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 2, proc.stderr
    line = one_line_error(proc.stderr)
    assert f"credential plugin '{plugin}' gave no answer within 1 s" in line, line
    assert time.monotonic() - started < 60
