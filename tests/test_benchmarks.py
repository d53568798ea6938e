"""The benchmark scripts run in a tiny smoke size (speed itself is never asserted here)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_etl_smoke(spark):
    report = _load("bench_etl").run([3000, 6000], spark)
    json.dumps(report)  # printable as JSON
    first, second = report["runs"]
    assert (first["events"], second["events"]) == (3000, 6000)
    for entry in report["runs"]:
        rows = entry["rows"]
        assert rows["read"] == entry["events"]
        assert rows["read"] == rows["accepted"] + rows["duplicates"] + sum(
            rows["quarantined"].values())
        assert entry["events_per_s"] > 0 and entry["job_vs_read_baseline"] > 0
        assert set(entry["stages_s"]) >= {"ingest", "features", "write_examples", "total"}
    assert first["cost_per_event_vs_smallest"] == 1.0
