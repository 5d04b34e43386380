"""One statement per fact, and every statement true: the versions, counts and claims that the
README, docs/*.md and the chart's and manifests' READMEs state agree with the file each fact
comes from (go.mod pins, the Makefile, the installers, Chart.yaml, the test suites), and a fact
stated in one place is not restated in another."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from tools.cluster.layout import Versions

PAGES = {p.relative_to(REPO).as_posix(): p.read_text() for p in (
    REPO / "README.md", *sorted((REPO / "docs").glob("*.md")),
    REPO / "charts" / "ddp-trainer" / "README.md", REPO / "k8s" / "README.md",
    REPO / "examples" / "mytask" / "README.md", REPO / "examples" / "causal_lm" / "README.md")}
# Records of past runs state what they ran with, with their date; a pin bump does not rewrite them.
RECORDS = {"docs/benchmarks.md"}
CURRENT = {path: text for path, text in PAGES.items() if path not in RECORDS}
PINS = Versions.read()


def stated(pattern: str, pages: dict[str, str] = CURRENT) -> list[tuple[str, str]]:
    """(page, first group) of every match of `pattern`, newlines in the text read as spaces."""
    return [(path, m.group(1)) for path, text in pages.items()
            for m in re.finditer(pattern, text.replace("\n", " "))]


def prometheus_release(module_version: str) -> str:
    # Prometheus' Go module v0.313.0 is its release v3.13.0 (major folded into the minor)
    major_minor, patch = module_version.removeprefix("v0.").split(".")
    return f"v{major_minor[0]}.{int(major_minor[1:])}.{patch}"


def shell_pin(script: str, name: str) -> str:
    found = re.search(rf"^{name}=v?(\S+)$", (REPO / "tools" / script).read_text(), re.M)
    assert found, f"{name} in tools/{script}"
    return found.group(1)


VERSION_CLAIMS = [  # (what, pattern capturing a version as the docs write it, its source)
    ("Kubernetes", r"Kubernetes (v\d+\.\d+\.\d+)", PINS.kubernetes),
    ("training operator", r"training operator (v\d+\.\d+\.\d+)", PINS.training_operator),
    ("training operator line", r"training operator (v\d+\.\d+)(?:\.x)?\b(?!\.\d)",
     PINS.training_operator.rsplit(".", 1)[0]),
    ("Kubeflow Trainer", r"Trainer (v2\.\d+\.\d+)", PINS.trainer),
    ("Kubeflow Trainer line", r"Trainer (v2\.\d+)\b(?!\.\d)", PINS.trainer.rsplit(".", 1)[0]),
    ("Trainer's install ref", r"kubeflow/trainer\.git/manifests/\S+\?ref=(v[\d.]+)", PINS.trainer),
    ("operator's install ref", r"training-operator\.git/manifests/\S+\?ref=(v[\d.]+)",
     PINS.training_operator),
    ("JobSet", r"JobSet (v\d+\.\d+\.\d+)", PINS.jobset),
    ("prometheus-operator", r"prometheus-operator (v\d+\.\d+\.\d+)", PINS.prometheus_operator),
    ("Prometheus", r"Prometheus (v\d+\.\d+\.\d+)", prometheus_release(PINS.prometheus)),
    ("Kueue", r"Kueue (v\d+\.\d+\.\d+)", PINS.kueue),
    ("Kueue's version line", r"\*\*Version: (v\d+\.\d+\.\d+)\*\*", PINS.kueue),
    ("kubectl", r"kubectl (\d+\.\d+)\b", shell_pin("install-helm.sh", "KUBECTL_VERSION")[:4]),
]


@pytest.mark.parametrize(("what", "pattern", "source"), VERSION_CLAIMS,
                         ids=[c[0] for c in VERSION_CLAIMS])
def test_every_stated_version_is_the_pinned_one(what: str, pattern: str, source: str) -> None:
    claims = stated(pattern)
    wrong = [(path, version) for path, version in claims if version != source]
    assert wrong == [], f"{what} is {source} where it is pinned; the docs say {wrong}"


def test_the_jobs_cli_prints_the_pinned_install_commands() -> None:
    # `ddp-trainer jobs` names the install command when a cluster serves neither kind
    text = (REPO / "trainer" / "jobs" / "kinds.py").read_text()
    for pattern, pin in ((r"training-operator\.git/\S+\?ref=(v[\d.]+)", PINS.training_operator),
                         (r"kubeflow/trainer\.git/\S+\?ref=(v[\d.]+)", PINS.trainer)):
        assert re.findall(pattern, text) == [pin], pattern


def test_the_main_versions_are_stated_somewhere() -> None:
    # the patterns above match what the docs say: an empty match would prove nothing
    for what in ("Kubernetes", "training operator", "Kubeflow Trainer", "JobSet",
                 "prometheus-operator", "Prometheus"):
        pattern = next(p for w, p, _ in VERSION_CLAIMS if w == what)
        assert stated(pattern), f"no page states the {what} version ({pattern})"


def test_the_helm_versions_tested_are_the_installed_ones() -> None:
    helm3 = shell_pin("install-helm.sh", "HELM3_VERSION").rsplit(".", 1)[0]
    helm4 = shell_pin("install-helm.sh", "HELM4_VERSION").rsplit(".", 1)[0]
    claims = stated(r"Helm (\d+\.\d+/\d+\.\d+)") + stated(r"tested with (\d+\.\d+ and \d+\.\d+)")
    assert claims, "no page states the Helm versions the tests run"
    for path, claim in claims:
        assert re.split(r"/| and ", claim) == [helm3, helm4], (path, claim)


def test_every_torch_version_is_the_tests_or_the_images() -> None:
    makefile = (REPO / "Makefile").read_text()
    tests_torch = re.search(r"^TORCH_SPEC \?= torch==(\S+)$", makefile, re.M)
    dockerfile = (REPO / "Dockerfile").read_text()
    image_torch = re.search(r"^ARG TORCH_VERSION=(\S+)$", dockerfile, re.M)
    gpu_base = re.search(r"^ARG PYTORCH_IMAGE=pytorch/pytorch:([\d.]+)-", dockerfile, re.M)
    assert tests_torch and image_torch and gpu_base
    known = {tests_torch.group(1), image_torch.group(1), gpu_base.group(1)}
    claims = stated(r"torch (?:\*\*)?(\d+\.\d+\.\d+)") + stated(r"torch==(\d+\.\d+\.\d+)")
    assert (tests_torch.group(1) in {v for _, v in claims}), "the tests' torch is stated nowhere"
    assert [(p, v) for p, v in claims if v not in known] == []


def test_the_minimum_kubernetes_is_the_charts_kube_version() -> None:
    chart = yaml.safe_load((REPO / "charts" / "ddp-trainer" / "Chart.yaml").read_text())
    minimum = re.fullmatch(r">=(\d+\.\d+)\.0-0", chart["kubeVersion"])
    assert minimum, chart["kubeVersion"]
    claims = stated(r"Kubernetes with GPU nodes \| (\d+\.\d+) or newer")
    assert claims == [("README.md", minimum.group(1))], claims


def test_the_bad_input_counts_are_stated_once_and_are_the_suites() -> None:
    from tests.chart.test_chart_values_errors import BAD_VALUES
    from tests.robustness.test_one_line import CASES

    assert stated(r"a table of (\d+) CLI cases") == [("docs/cli.md", str(len(CASES)))]
    assert stated(r"(\d+) bad chart values fail") == [("docs/cli.md", str(len(BAD_VALUES)))]


ALERTS = yaml.safe_load((REPO / "charts" / "ddp-trainer" / "files" / "alerts.yaml").read_text())
ALERT_NAMES = [rule["alert"] for group in ALERTS["groups"] for rule in group["rules"]]


def test_no_page_says_an_alert_does_not_fire_on_the_test_stack() -> None:
    # docs/cluster.md once said no test made the alerts fire while the README said each did
    denials = stated(r"((?:no test makes|does not make|never makes|don't|do not|does not|never)"
                     r" [^.]{0,40}alerts? [^.]{0,20}fire)", PAGES)
    denials += stated(r"(the alerts firing on this stack)", PAGES)
    assert denials == []


def test_each_alert_is_claimed_to_fire_where_a_cluster_test_makes_it_fire() -> None:
    table = PAGES["docs/metrics.md"]
    fired = {name: Path(test) for name, test in re.findall(
        r"^\| `(DDPTrainer\w+)` \| [^|]+ \| `(tests/cluster/\w+\.py)` \|$", table, re.M)}
    assert sorted(fired) == sorted(ALERT_NAMES), "docs/metrics.md's table of alerts fired"
    for name, test in fired.items():
        assert re.search(rf'wait_for_alert\(release, "{name}"', (REPO / test).read_text()), (
            f"{test} does not make {name} fire, as docs/metrics.md says")


ONCE = {  # facts the docs once stated in two places; now one, the others link to it
    "the training operator's install command": r"training-operator\.git/manifests",
    "Trainer v2's install command": r"kubeflow/trainer\.git/manifests/overlays/manager",
    "kube-prometheus-stack's install": r"helm install kube-prometheus-stack",
    "the prerequisites": r"NVIDIA device plugin",
    "make run's time on a fresh clone": r"\*\*83 s\*\* wall clock",
    "the metrics table": r"\| `trainer_loss` \|",
    "the configuration table": r"\| `data\.dataset` \|",
}


@pytest.mark.parametrize("what", ONCE)
def test_a_fact_is_stated_in_one_place(what: str) -> None:
    places = [path for path, text in PAGES.items()
              for _ in re.finditer(ONCE[what], text.replace("\n", " "))]
    assert len(places) == 1, f"{what}: {places}"


def test_the_exit_code_list_names_ctrl_c() -> None:
    # The CLI exits 130 on Ctrl-C (trainer/cli.py); the list of exit codes left it out.
    text = " ".join((REPO / "docs" / "cli.md").read_text().split())
    assert "130 after Ctrl-C (SIGINT)" in text
