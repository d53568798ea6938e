"""ETL throughput: events/s of the whole job at several log sizes on local[2].

Prints one JSON document. In the same run it measures a baseline, Spark reading and parsing
the same raw log (the floor any job on it pays), and reports the job's cost relative to it,
plus the cost per event at each size relative to the smallest size (1.0 = linear scaling).

    python benchmarks/bench_etl.py                        # 1M and 10M events
    python benchmarks/bench_etl.py --sizes 20000 --smoke  # the tiny size CI runs
    python benchmarks/bench_etl.py --sizes 1000000 --profile  # + the slowest Spark stages
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from featureline.etl import job
from featureline.etl.config import EtlConfig, SparkSettings, with_overrides
from featureline.etl.datagen import write_log
from featureline.etl.qualification import stage_times
from featureline.etl.session import build_session
from featureline.etl.stages import STAGE_PROPERTY

BENCH_SPARK = SparkSettings(master="local[2]", properties={
    "spark.driver.memory": "12g", "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "8"})
# Spark stages listed per size with --profile.
PROFILE_TOP = 10


def _profiled(settings: SparkSettings, event_log: Path) -> SparkSettings:
    """``settings`` writing an uncompressed event log (read while the session runs)."""
    return settings.model_copy(update={"properties": {
        **settings.properties, "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": event_log.as_uri(), "spark.eventLog.compress": "false"}})


def _read_baseline(spark: SparkSession, path: Path) -> float:
    spark.sparkContext.setLocalProperty(STAGE_PROPERTY, "read_baseline")
    try:
        start = time.perf_counter()
        spark.read.json(str(path)).count()
        return time.perf_counter() - start
    finally:
        spark.sparkContext.setLocalProperty(STAGE_PROPERTY, None)  # type: ignore[arg-type]


def measure(spark: SparkSession, events: int, workdir: Path) -> dict[str, Any]:
    raw = workdir / f"events-{events}.jsonl"
    users, items = max(100, events // 40), max(50, events // 100)
    start = time.perf_counter()
    write_log(raw, events=events, users=users, items=items, days=28, seed=1,
              bad_fraction=0.001)
    datagen_s = time.perf_counter() - start
    read_s = _read_baseline(spark, raw)
    config = with_overrides(EtlConfig(), input_path=str(raw), output=str(workdir / "out"))
    start = time.perf_counter()
    result = job.run(config, spark, progress=lambda _: None)
    job_s = time.perf_counter() - start
    return {
        "events": events, "users": users, "items": items,
        "datagen_s": round(datagen_s, 2),
        "read_baseline_s": round(read_s, 2),
        "job_s": round(job_s, 2),
        "events_per_s": round(events / job_s),
        "job_vs_read_baseline": round(job_s / read_s, 2),
        "stages_s": result.metadata["timings_s"],
        "rows": result.metadata["rows"],
    }


def run(sizes: list[int], spark: SparkSession | None = None,
        event_log: Path | None = None) -> dict[str, Any]:
    """``event_log``: the folder of the session's event log, whose slowest Spark stages are
    listed per size (``--profile``)."""
    spark = spark or build_session(BENCH_SPARK)
    runs = []
    seen: set[int] = set()
    with tempfile.TemporaryDirectory(prefix="bench-etl-") as tmp:
        for events in sizes:
            runs.append(measure(spark, events, Path(tmp)))
            if event_log is not None:
                stages = [s for s in stage_times(event_log) if s["stage_id"] not in seen]
                seen.update(s["stage_id"] for s in stages)
                runs[-1]["spark_stages"] = stages[:PROFILE_TOP]
    smallest = runs[0]
    for entry in runs:
        per_event = entry["job_s"] / entry["events"]
        entry["cost_per_event_vs_smallest"] = round(
            per_event / (smallest["job_s"] / smallest["events"]), 2)
    return {
        "benchmark": "etl",
        "machine": {"platform": platform.platform(), "python": platform.python_version(),
                    "spark_master": spark.sparkContext.master, "spark": spark.version},
        "runs": runs,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000000,10000000",
                        help="comma-separated event counts")
    parser.add_argument("--smoke", action="store_true", help="tiny run for CI")
    parser.add_argument("--profile", action="store_true",
                        help=f"list each size's {PROFILE_TOP} slowest Spark stages, with the "
                             "stage of the job that ran each (from an event log)")
    args = parser.parse_args(argv)
    sizes = [20_000, 40_000] if args.smoke else [int(s) for s in args.sizes.split(",")]
    if not args.profile:
        print(json.dumps(run(sizes), indent=2))
        return
    with tempfile.TemporaryDirectory(prefix="bench-etl-events-") as event_log:
        spark = build_session(_profiled(BENCH_SPARK, Path(event_log)))
        try:
            print(json.dumps(run(sizes, spark, Path(event_log)), indent=2))
        finally:
            spark.stop()  # closes the log before its folder goes


if __name__ == "__main__":
    main()
