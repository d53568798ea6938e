"""The validation gate on a generated 30-day log with its natural day-to-day variation: ten
clean consecutive days raise no breach; each injected fault is caught and names its column;
an ETL run of a bad day records the failed verdict, `featureline validate` exits 1, and
publish refuses the output — nothing reaches Redis — unless told why."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from featureline.core.drift import ChecksConfig, check
from featureline.etl import job
from featureline.etl.data_profile import profile
from featureline.etl.datagen import write_log
from featureline.etl.features.base import LABEL
from featureline.etl.features.cyclic_time import SAME_ALL_DAY
from featureline.etl.outputs import read_as_written
from tests.feast_data import copy_project, fresh_db
from tests.job_config import make_config

pytestmark = pytest.mark.slow

DAYS = 30
RAW_NUMERIC = ["value", "price"]
RAW_CATEGORICAL = ["user_id", "item_id", "event_type", "category", "device"]


@pytest.fixture(scope="module")
def month(spark, tmp_path_factory) -> Iterator[dict[str, Any]]:
    """One run over 30 days of generated events (1,200 a day on average, 1 % bad rows), and
    its events and examples."""
    root = tmp_path_factory.mktemp("gate")
    log = root / "events.jsonl"
    write_log(log, events=36_000, users=900, items=360, days=DAYS, seed=5, bad_fraction=0.01)
    result = job.run(make_config(root, log), spark, progress=lambda _: None)
    output = Path(result.output)
    features = result.metadata["features"]
    # In memory: each test profiles them again, day by day.
    events = spark.read.parquet(str(output / "state" / "events")).cache()
    examples = read_as_written(spark, output / "examples").cache()
    yield {
        "root": root, "log": log, "output": output, "metadata": result.metadata,
        "events": events, "examples": examples,
        "numeric": [f["name"] for f in features
                    if f["kind"] == "continuous" and f["name"] not in SAME_ALL_DAY],
        "categorical": [f["name"] for f in features if f["kind"] == "categorical"],
    }
    events.unpersist()
    examples.unpersist()


def _day_profile(month: dict[str, Any], day: str,
                 fault: Callable[[DataFrame], DataFrame] | None = None,
                 rows: dict[str, Any] | None = None) -> dict[str, Any]:
    """The profile a run ending on ``day`` writes, with ``fault`` applied to that day's
    events (and their examples, where it drops rows)."""
    until = F.to_date("ts") <= F.lit(day).cast("date")
    events, examples = month["events"].where(until), month["examples"].where(until)
    if fault is not None:
        on_day = F.to_date("ts") == F.lit(day).cast("date")
        changed = fault(events.where(on_day))
        events = events.where(~on_day).unionByName(changed)
        examples = examples.join(changed.select("user_id", "item_id", "ts").distinct(),
                                 ["user_id", "item_id", "ts"], "left_semi") \
            .unionByName(examples.where(~on_day))
    return profile(events, examples, raw_numeric=RAW_NUMERIC, raw_categorical=RAW_CATEGORICAL,
                   feature_numeric=month["numeric"], feature_categorical=month["categorical"],
                   rows=rows or month["metadata"]["rows"])


def _days(month: dict[str, Any]) -> list[str]:
    return sorted(str(row[0]) for row in
                  month["events"].select(F.to_date("ts")).distinct().collect())


def test_ten_clean_consecutive_days_raise_no_breach(month):
    days = _days(month)[-11:]
    profiles = [_day_profile(month, day) for day in days]
    found = {day: [str(b) for b in check(ours, reference, ChecksConfig())]
             for day, ours, reference in zip(days[1:], profiles[1:], profiles[:-1],
                                             strict=True)}
    assert all(not breaches for breaches in found.values()), found
    # The profile holds what the checks read, for the newest day only.
    newest = profiles[-1]
    assert newest["day"] == days[-1] and newest["day_events"] == \
        month["events"].where(F.to_date("ts") == F.lit(days[-1]).cast("date")).count()
    assert set(newest["columns"]) >= {*RAW_NUMERIC, *RAW_CATEGORICAL, "user_id_cat"}
    assert not set(SAME_ALL_DAY) & set(newest["columns"])
    price = newest["columns"]["price"]
    assert sum(price["histogram"].values()) == round(newest["day_events"]
                                                     * (1 - price["missing"]))


def _top_renamed(day: DataFrame) -> DataFrame:
    top = day.groupBy("category").count().orderBy(F.desc("count"), "category").first()[0]
    return day.withColumn("category", F.when(F.col("category") == top, f"{top}-renamed")
                          .otherwise(F.col("category")))


def _no_positives(day: DataFrame) -> DataFrame:
    return day.withColumn("event_type", F.lit("view")).withColumn(LABEL, F.lit(0))


FAULTS: dict[str, tuple[Callable[[DataFrame], DataFrame], str, str]] = {
    "prices x100": (lambda d: d.withColumn("price", F.col("price") * 100), "js", "price"),
    "the top category renamed": (_top_renamed, "unseen", "category"),
    "a day at 10 % volume": (lambda d: d.sample(fraction=0.1, seed=3), "volume", ""),
    "value all zero": (lambda d: d.withColumn("value", F.lit(0.0)), "js", "value"),
    "a context column dropped upstream": (lambda d: d.withColumn(
        "device", F.lit(None).cast("string")), "missing", "device"),
    "no positives (the label rate collapsed)": (_no_positives, "label_rate", "label"),
    "a flood of a new category": (lambda d: d.withColumn("category", F.when(
        F.rand(seed=1) < 0.5, "c-flood").otherwise(F.col("category"))), "linf", "category"),
}


@pytest.fixture(scope="module")
def day_before(month) -> dict[str, Any]:
    """The reference of the faulty days: the clean profile of the day before the last."""
    return _day_profile(month, _days(month)[-2])


@pytest.mark.parametrize("name", list(FAULTS))
def test_each_fault_is_caught_naming_its_column(month, day_before, name):
    fault, check_name, column = FAULTS[name]
    breaches = check(_day_profile(month, _days(month)[-1], fault), day_before, ChecksConfig())
    assert (check_name, column) in {(b.check, b.column) for b in breaches}, breaches


def test_quarantine_rate_x10_is_caught(month, day_before):
    rows = month["metadata"]["rows"]
    tenfold = {**rows, "quarantined": {k: v * 10 for k, v in rows["quarantined"].items()}}
    breaches = check(_day_profile(month, _days(month)[-1], rows=tenfold), day_before,
                     ChecksConfig())
    assert [(b.check, b.column) for b in breaches] == [("quarantine_rate", "")]


def _event(line: str) -> dict[str, Any] | None:
    try:
        event = json.loads(line)
    except ValueError:
        return None
    return event if isinstance(event, dict) else None


def test_a_bad_day_is_refused_at_publish(job_output, small_log, spark, redis_server,
                                         tmp_path):
    """The shared small log again, its last day's prices in cents: the run's verdict fails
    against the output it replaces, validate exits 1, publish writes nothing to Redis, and
    --accept-drift publishes it and records why."""
    from featureline.cli import main
    from featureline.feature_store.errors import DriftRefusedError
    from featureline.feature_store.publish import ACCEPTED_DRIFT_FILE, publish
    from featureline.feature_store.repo import open_repo

    output = tmp_path / "out"
    shutil.copytree(job_output.output, output)
    lines = small_log.read_text().splitlines(keepends=True)
    last_day = json.loads((output / "profile.json").read_text())["day"]
    cents = tmp_path / "events.jsonl"
    with cents.open("w") as target:
        for line in lines:
            event = _event(line)
            if (event is not None and str(event.get("ts", "")).startswith(last_day)
                    and isinstance(event.get("price"), (int, float))):
                line = json.dumps({**event, "price": event["price"] * 100}) + "\n"
            target.write(line)
    config = make_config(tmp_path, cents)  # writes tmp_path/out: the copy it replaces
    metadata = job.run(config, spark, progress=lambda _: None).metadata
    verdict = metadata["checks"]
    assert not verdict["passed"] and verdict["reference"] == str(output)
    assert ("js", "price") in {(b["check"], b["column"]) for b in verdict["breaches"]}
    assert (output / "profile.reference.json").is_file()

    validated = CliRunner().invoke(main, ["validate", str(output)])
    assert validated.exit_code == 1, validated.output
    assert "BREACH js price" in validated.output
    passed = CliRunner().invoke(main, ["validate", str(output), "--reference", str(output)])
    assert passed.exit_code == 0 and "PASSED" in passed.output, passed.output

    project = copy_project(tmp_path)
    url = fresh_db(redis_server, 1)  # a database no other test uses
    with pytest.raises(DriftRefusedError, match="js price"):
        publish(open_repo(project.feature_store, output, url=url), progress=lambda _: None)
    assert redis.Redis.from_url(url).dbsize() == 0
    summary = publish(open_repo(project.feature_store, output, url=url),
                      progress=lambda _: None, accept_drift="prices are in cents since today")
    assert summary.keys > 0 and redis.Redis.from_url(url).dbsize() > 0
    [record] = [json.loads(line) for line in
                (output / ACCEPTED_DRIFT_FILE).read_text().splitlines()]
    assert record["reason"] == "prices are in cents since today"
    assert record["dataset_version"] == metadata["dataset"]["version"]
