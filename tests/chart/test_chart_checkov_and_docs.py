"""checkov finds nothing on the rendered manifests beyond the skips the chart README justifies,
and every value is documented (values.yaml comments, README table)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import yaml

from .chartlib import (
    CHART,
    REPO,
    RESTRICTED_VALUE_SETS,
    TRAINJOB_VALUE_SETS,
    as_pod,
    find_tool,
    render,
    trainjob_pod,
)

README = CHART / "README.md"
# Skipped checks that may fail only on some objects (by the value set in their name).
ONLY_ON = {"CKV_K8S_38": re.compile(r"-trainjob-(defaults|cpu-only|gpu-3x8|everything)$")}


def documented_skips() -> dict[str, str]:
    text = README.read_text()
    block = text.split("<!-- checkov-skips: begin -->", 1)[1].split(
        "<!-- checkov-skips: end -->", 1
    )[0]
    rows = re.findall(r"^\| (CKV2?_[A-Z0-9_]+) \| (.+?) \|$", block, flags=re.M)
    return dict(rows)


def test_readme_gives_a_reason_for_every_skipped_check() -> None:
    skips = documented_skips()
    assert skips, "no checkov skip table in charts/ddp-trainer/README.md"
    for check, reason in skips.items():
        assert len(reason.split()) >= 8, f"{check}: give a real reason"


def test_checkov_fails_only_the_checks_the_readme_justifies(helm4: str, tmp_path: Path) -> None:
    """One checkov run over the objects of every restricted value set, pod templates as Pods."""
    objects = []
    for value_set in [*RESTRICTED_VALUE_SETS, *TRAINJOB_VALUE_SETS]:
        rendered = render(helm4, value_set)
        for doc in rendered:
            if doc["kind"] == "PyTorchJob":
                docs = [as_pod(doc, rtype) for rtype in doc["spec"]["pytorchReplicaSpecs"]]
            elif doc["kind"] == "TrainJob":
                docs = [trainjob_pod(rendered)]  # the pod the Trainer controller builds
            elif doc["kind"] == "TrainingRuntime":
                docs = []  # its pod template is in that pod
            else:
                docs = [doc]
            for d in docs:  # unique names, so that checkov reports each object of each set
                d["metadata"]["name"] = f"{d['metadata']['name']}-{value_set.replace('/', '-')}"
                objects.append(d)
    (tmp_path / "rendered.yaml").write_text(yaml.safe_dump_all(objects))
    proc = subprocess.run(
        [
            find_tool("checkov"),
            "--directory",
            str(tmp_path),
            "--framework",
            "kubernetes",
            "--skip-download",
            "--quiet",
            "--compact",
            "--output",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.stdout.strip(), proc.stderr
    report = json.loads(proc.stdout)
    report = report[0] if isinstance(report, list) else report
    assert report["summary"]["parsing_errors"] == 0
    assert report["summary"]["resource_count"] >= len(objects) - 1
    assert report["summary"]["passed"] > 0
    failed: dict[str, set[str]] = {}
    for r in report["results"]["failed_checks"]:
        failed.setdefault(r["check_id"], set()).add(r["resource"])
    skips = documented_skips()
    unexplained = {k: sorted(v)[:3] for k, v in failed.items() if k not in skips}
    assert unexplained == {}, "fix these or justify them in the README's checkov table"
    for check, allowed in ONLY_ON.items():
        elsewhere = sorted(r for r in failed.get(check, ()) if not allowed.search(r))
        assert elsewhere == [], f"{check} may fail only on {allowed.pattern} pods"
    stale = set(skips) - set(failed)
    assert stale == set(), f"{stale} no longer fail: remove them from the README's checkov table"


def values_key_lines() -> list[tuple[str, int, list[str]]]:
    """(dotted path, line number, lines) of every key in values.yaml."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    out, stack = [], []
    for i, line in enumerate(lines):
        m = re.match(r"^(\s*)([A-Za-z0-9_.\-/]+):", line)
        if not m or line.lstrip().startswith(("#", "-")):
            continue
        indent, key = len(m.group(1)), m.group(2)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        out.append((".".join([k for _, k in stack] + [key]), i, lines))
        stack.append((indent, key))
    return out


def schema_paths(node: dict, prefix: str = "") -> set[str]:
    """Dotted paths of the values the schema declares, not descending into free-form maps or
    the trainer config (documented as a whole)."""
    paths = set()
    for key, sub in node.get("properties", {}).items():
        path = f"{prefix}{key}"
        paths.add(path)
        if key != "trainerConfig" and sub.get("additionalProperties") is False:
            paths |= schema_paths(sub, f"{path}.")
    return paths


def test_every_value_has_a_comment_and_a_schema_entry() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    declared = schema_paths(schema) - {"global"}
    keys = {path: (i, lines) for path, i, lines in values_key_lines()}
    missing = sorted(declared - set(keys))
    assert missing == [], f"in the schema but without a default in values.yaml: {missing}"
    undocumented = sorted(
        p for p in declared if not keys[p][1][keys[p][0] - 1].strip().startswith("#")
    )
    assert undocumented == [], f"values without a comment: {undocumented}"


def test_readme_values_table_lists_every_value() -> None:
    readme = README.read_text()
    declared = schema_paths(json.loads((CHART / "values.schema.json").read_text())) - {"global"}
    leaves = {p for p in declared if not any(q.startswith(p + ".") for q in declared)}
    missing = sorted(p for p in leaves if f"| `{p}` |" not in readme)
    assert missing == [], f"add to the README values table: {missing}"
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    stale = []
    table = readme.split("\n## Values\n", 1)[1]
    for path, default in re.findall(r"^\| `([^`]+)` \| `(.+?)` \|", table, flags=re.M):
        value = values
        for part in path.split("."):
            value = value[part]
        if default != "(see values.yaml)" and json.loads(default.replace("\\|", "|")) != value:
            stale.append(path)
    assert stale == [], f"defaults in the README values table differ from values.yaml: {stale}"


YAMLLINT_CONFIG = """
extends: default
rules:
  line-length: {max: 120, level: warning}  # the dashboard JSON carries long PromQL
  document-start: disable
  indentation: {spaces: consistent, indent-sequences: whatever}
  comments: {min-spaces-from-content: 1}
  truthy: {check-keys: false}
"""


def test_chart_values_and_plain_manifests_pass_yamllint() -> None:
    from yamllint import linter
    from yamllint.config import YamlLintConfig

    config = YamlLintConfig(YAMLLINT_CONFIG)
    files = [CHART / "Chart.yaml", CHART / "values.yaml", *sorted((REPO / "k8s").glob("*.yaml"))]
    files += sorted((REPO / "tests" / "chart" / "values").glob("**/*.yaml"))
    problems = [
        f"{f.relative_to(REPO)}:{p.line}: {p.desc}"
        for f in files
        for p in linter.run(f.read_text(), config, str(f))
        if p.level == "error"
    ]
    assert problems == []
