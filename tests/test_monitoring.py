"""The operators' kit in k8s/monitoring: the alert rules pass promtool's checks and its unit
tests (tests/monitoring/alerts_test.yaml: each alert fires on the series that should raise
it, and only then). That the Grafana dashboard queries only metrics the API and the stream
processor export is read off the demo's running API and processor: tests/test_demo.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
MONITORING = REPO / "k8s" / "monitoring"


def _promtool() -> Path:
    from featureline.tools import PromtoolFetchError, promtool

    try:
        return promtool()
    except PromtoolFetchError as exc:  # the rules' schema is still checked in test_k8s.py
        pytest.skip(str(exc))


def test_the_alert_rules_validate_and_fire_when_they_should(tmp_path):
    rule = yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text())
    alerts = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]}
    assert {"FeaturelineHigh5xxRate", "FeaturelineRedisUnavailable",
            "FeaturelineL1HitRateCollapse", "FeaturelineVersionSkew",
            "FeaturelineUpdateConsumerLag", "FeaturelineStaleFreshFeatures",
            "FeaturelineServingSkew", "FeaturelineOnlineStoreEmpty", "FeaturelineBadDay",
            "FeaturelineChecksStale", "FeaturelineModelRefused"} <= alerts
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(rule["spec"]))
    tests = yaml.safe_load((REPO / "tests" / "monitoring" / "alerts_test.yaml").read_text())
    tests["rule_files"] = [str(rules)]
    assert {t["alertname"] for t in tests["tests"][0]["alert_rule_test"]} == alerts
    unit = tmp_path / "alerts_test.yaml"
    unit.write_text(yaml.safe_dump(tests))
    promtool = _promtool()
    checked = subprocess.run([str(promtool), "check", "rules", str(rules)],
                             capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = subprocess.run([str(promtool), "test", "rules", str(unit)],
                            capture_output=True, text=True, timeout=60)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    # The tests can fail: an alert that never fires is caught.
    broken = dict(rule["spec"])
    broken["groups"] = [{**g, "rules": [{**r, "expr": "vector(0) > 1"}
                                        if r["alert"] == "FeaturelineVersionSkew" else r
                                        for r in g["rules"]]} for g in rule["spec"]["groups"]]
    rules.write_text(yaml.safe_dump(broken))
    failed = subprocess.run([str(promtool), "test", "rules", str(unit)],
                            capture_output=True, text=True, timeout=60)
    assert failed.returncode != 0 and "FeaturelineVersionSkew" in failed.stdout + failed.stderr
