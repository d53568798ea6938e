"""The operators' kit in k8s/monitoring: the Grafana dashboard queries only metrics the API
and the stream processor export (read off the demo's running API and processor), and the
alert rules pass promtool's checks and its unit tests (tests/monitoring/alerts_test.yaml:
each alert fires on the series that should raise it, and only then)."""

from __future__ import annotations

import json
import re
import subprocess
import urllib.request
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
MONITORING = REPO / "k8s" / "monitoring"
METRIC = re.compile(r"\b(featureline_[a-z0-9_]+)")


def _exported(text: str) -> set[str]:
    """Every series name a Prometheus text page can hold, from its TYPE lines."""
    names = set()
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", text, flags=re.MULTILINE):
        names.add(name)
        suffixes = {"histogram": ("_bucket", "_count", "_sum"), "counter": ("_total",),
                    "summary": ("_count", "_sum")}.get(kind, ())
        names.update(name.removesuffix("_total") + s for s in suffixes)
    return names


def test_the_dashboard_queries_only_metrics_the_api_exports(demo_run):
    out, result, _ = demo_run
    assert result.exit_code == 0, result.output
    dashboard = json.loads((MONITORING / "dashboard.json").read_text())
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    queried = {name for p in panels for t in p["targets"] for name in METRIC.findall(t["expr"])}
    settings = yaml.safe_load((out / "featureline.yaml").read_text())
    api = settings["api"]
    # The API's /metrics, and the stream processor's (the demo's serve runs one).
    exported: set[str] = set()
    for url in (f"http://{api['host']}:{api['port']}/metrics",
                f"http://127.0.0.1:{settings['stream']['metrics_port']}/metrics"):
        with urllib.request.urlopen(url, timeout=30) as answer:
            exported |= _exported(answer.read().decode())
    assert queried and queried <= exported, sorted(queried - exported)
    # What the issue asks the dashboard to show is there.
    for wanted in ("featureline_api_request_seconds_bucket", "featureline_api_errors_total",
                   "featureline_hps_keys_share", "featureline_online_store_available",
                   "featureline_dataset_info", "featureline_hps_update_lag_seconds",
                   "featureline_feature_freshness_seconds_bucket",
                   "featureline_consistency_mismatch_ratio", "featureline_check_breaches",
                   "featureline_checks_run_timestamp_seconds"):
        assert wanted in queried


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
            "FeaturelineChecksStale"} <= alerts
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
