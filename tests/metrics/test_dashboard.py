"""The Grafana dashboard's structure: variables, datasource, units, selectors, names."""

from __future__ import annotations

import re

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.metrics.dashboard import load, panels, targets
from tests.metrics.test_alerts import ALERTS
from trainer.metrics import RunInfo
from trainer.metrics.families import TrainerMetrics

REQUIRED_PANELS = {
    "Train loss per rank",
    "Validation loss",
    "Accuracy per rank and global",
    "Samples/s per rank",
    "Step time p50 / p95 per rank",
    "Data-wait fraction per rank",
    "Epoch",
    "Progress",
    "Time since last step",
}


def exported_names() -> set[str]:
    """Every sample name a rank-0 CUDA rank exports (the superset of all ranks)."""
    reg = CollectorRegistry()
    TrainerMetrics(reg, RunInfo(0, 0, 2, 2, "nccl", "ddp", "mlp", "digits", "cuda", "x"))
    return {
        s.name
        for f in text_string_to_metric_families(generate_latest(reg).decode())
        for s in f.samples
    }


def test_variables_are_datasource_namespace_and_pytorchjob() -> None:
    variables = {v["name"]: v for v in load()["templating"]["list"]}
    assert list(variables) == ["datasource", "namespace", "pytorchjob"]
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("namespace", "pytorchjob"):
        assert variables[name]["type"] == "query"
        assert variables[name]["datasource"]["uid"] == "${datasource}"
    assert '{namespace="$namespace"}' in variables["pytorchjob"]["definition"]


def test_every_panel_uses_the_datasource_variable_and_sets_a_unit() -> None:
    for p in panels(load()):
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        assert p["fieldConfig"]["defaults"].get("unit"), p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}", p["title"]


def test_every_query_is_scoped_to_the_selected_job() -> None:
    for t in targets(load()):
        selectors = re.findall(r"\{([^}]*)\}", t.expr)
        metric_selectors = [s for s in selectors if "=" in s]
        assert metric_selectors, t
        for s in metric_selectors:
            assert 'namespace="$namespace"' in s and 'pytorchjob="$pytorchjob"' in s, t


def test_required_panels_exist_and_ids_are_unique() -> None:
    all_panels = list(panels(load()))
    assert {p["title"] for p in all_panels} >= REQUIRED_PANELS
    ids = [p["id"] for p in all_panels]
    assert len(ids) == len(set(ids))


def test_dashboard_and_alerts_only_use_exported_metric_names() -> None:
    names = exported_names()
    referenced = set()
    texts = [t.expr for t in targets(load())] + [ALERTS.read_text()]
    for text in texts:
        referenced |= set(re.findall(r"\btrainer_[a-z_]+", text))
    assert referenced, "no trainer_ metric referenced"
    assert referenced <= names, sorted(referenced - names)
