"""The alert rules file is valid and its promtool unit tests pass."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support.prometheus import require_binary

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
ALERTS = REPO / "charts" / "ddp-trainer" / "files" / "alerts.yaml"
ALERTS_TEST = Path(__file__).with_name("alerts_test.yaml")


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [require_binary("promtool"), *args], capture_output=True, text=True, timeout=120
    )


def test_promtool_check_rules_accepts_the_alerts_file() -> None:
    result = promtool("check", "rules", str(ALERTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 6 rules found" in result.stdout


def test_promtool_rule_unit_tests_pass() -> None:
    result = promtool("test", "rules", str(ALERTS_TEST))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_is_unit_tested_and_documented() -> None:
    rules = yaml.safe_load(ALERTS.read_text())
    names = {r["alert"] for g in rules["groups"] for r in g["rules"]}
    tested = {
        t["alertname"]
        for case in yaml.safe_load(ALERTS_TEST.read_text())["tests"]
        for t in case.get("alert_rule_test", [])
        if t["exp_alerts"]
    }
    assert names == tested
    docs = (REPO / "docs" / "metrics.md").read_text()
    for name in names:
        assert f"`{name}`" in docs, name
    for g in rules["groups"]:
        for r in g["rules"]:
            assert r["labels"]["severity"] in ("warning", "critical")
            assert {"summary", "description"} <= set(r["annotations"])
