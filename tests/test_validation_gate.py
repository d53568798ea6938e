"""The validation gate on a generated 30-day log with its natural day-to-day variation: ten
clean consecutive days raise no breach; each injected fault is caught and names its column;
an ETL run of a bad day records the failed verdict, `featureline validate` exits 1, and
publish refuses the output — nothing reaches Redis — unless told why."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from click.testing import CliRunner
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from featureline.core.drift import METRICS_FILE, REPORT_FILE, ChecksConfig, check
from featureline.core.drift_window import PROFILES_DIR, pooled
from featureline.etl import job
from featureline.etl.checks_history import output_days
from featureline.etl.data_profile import profiles
from featureline.etl.datagen import write_log
from featureline.etl.features.base import LABEL
from featureline.etl.features.cyclic_time import SAME_ALL_DAY
from tests.browser import CHROMIUM, headless_page
from tests.feast_data import copy_project, fresh_db
from tests.gate_days import Fault, day_profile, days_of
from tests.job_config import make_config
from tests.metric_samples import Samples, samples

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
    config = make_config(root, log)
    result = job.run(config, spark, progress=lambda _: None)
    output = Path(result.output)
    # In memory: each test profiles them again, day by day.
    with output_days(spark, output, config) as days:
        yield {"root": root, "log": log, "config": config, "output": output,
               "metadata": result.metadata, "events": days.events, "examples": days.examples,
               "columns": days.columns, "days": days}


def _day_profile(month: dict[str, Any], day: str, fault: Fault | None = None,
                 rows: dict[str, Any] | None = None) -> dict[str, Any]:
    return day_profile(month["days"], day, fault, rows or month["metadata"]["rows"])


def _days(month: dict[str, Any]) -> list[str]:
    return days_of(month["days"])


def test_ten_clean_consecutive_days_raise_no_breach(month, spark, tmp_path):
    """`featureline etl checks-history` replays the gate over the output's last ten days."""
    from featureline.cli import main

    settings = month["config"].model_dump(mode="json", exclude={"checks", "aggregations"})
    config = tmp_path / "featureline.yaml"
    config.write_text(yaml.safe_dump({"etl": settings}))
    replayed = CliRunner().invoke(main, ["etl", "checks-history", "--config", str(config),
                                         "--days", "10", "--json"])
    assert replayed.exit_code == 0, replayed.output
    days = json.loads(replayed.output)
    assert [d["day"] for d in days] == _days(month)[-10:]
    assert all(not d["breaches"] for d in days), days
    assert sum(d["events"] for d in days) == month["events"].where(
        F.to_date("ts") >= F.lit(days[0]["day"]).cast("date")).count()
    # The profile holds what the checks read, for the newest day only.
    newest = _day_profile(month, days[-1]["day"])
    assert newest["day"] == days[-1]["day"] and newest["day_events"] == days[-1]["events"]
    assert set(newest["columns"]) >= {*RAW_NUMERIC, *RAW_CATEGORICAL, "user_id_cat"}
    assert not set(SAME_ALL_DAY) & set(newest["columns"])
    assert {name for name, c in newest["columns"].items() if c.get("key")} >= {
        "user_id", "item_id", "user_id_cat", "item_id_cat"}
    assert not newest["columns"]["category"].get("key")
    price = newest["columns"]["price"]
    assert sum(price["histogram"].values()) == round(newest["day_events"]
                                                     * (1 - price["missing"]))


def test_the_replay_profiles_each_day_as_its_own_run_would(month):
    """The replay's profiles of the last days, grouped by day in one pass, are the profiles
    the runs ending on each of those days write (the events up to it, its newest day)."""
    days = _days(month)[-3:]
    together = profiles(month["events"], month["examples"], 3,
                        rows=month["metadata"]["rows"], **month["columns"])
    assert [p["day"] for p in together] == days
    assert together == [_day_profile(month, day) for day in days]


def _top_renamed(day: DataFrame) -> DataFrame:
    top = day.groupBy("category").count().orderBy(F.desc("count"), "category").first()[0]
    return day.withColumn("category", F.when(F.col("category") == top, f"{top}-renamed")
                          .otherwise(F.col("category")))


def _no_positives(day: DataFrame) -> DataFrame:
    return day.withColumn("event_type", F.lit("view")).withColumn(LABEL, F.lit(0))


FAULTS: dict[str, tuple[Fault, str, str]] = {
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
    """The reference of the faulty days: the clean profiles of the fourteen days before the
    last, pooled, as daily runs keep them."""
    earlier = profiles(month["events"].where(F.to_date("ts") < F.lit(_days(month)[-1])),
                       month["examples"], ChecksConfig().reference_days,
                       rows=month["metadata"]["rows"], **month["columns"])
    assert len(earlier) == 14
    return pooled(earlier)


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


def _the_metrics_name_the_breach(found: Samples) -> None:
    price = (("check", "js"), ("column", "price"))
    assert found[("featureline_check_breached", price)] == 1
    assert found[("featureline_check_value", price)] > \
        found[("featureline_check_threshold", price)] == ChecksConfig().js
    assert found[("featureline_check_breaches", (("check", "js"),))] >= 1
    assert found[("featureline_check_breaches", (("check", "volume"),))] == 0
    assert found[("featureline_check_breached", (("check", "volume"), ("column", "")))] == 0
    assert found[("featureline_checks_passed", ())] == 0
    assert found[("featureline_checks_compared", ())] == 1


def _the_report_shows_the_breach(report: Path, tmp_path: Path) -> None:
    """The page opens in headless Chromium without an error or a request anywhere else; the
    breaches' table names prices, and their column comes first, drawn beside the
    reference's histogram."""
    if CHROMIUM is None:
        pytest.skip("no chromium (make test installs Debian's as root)")
    with headless_page("file://") as visit:
        page = visit.page
        page.goto(report.as_uri(), wait_until="load")
        assert page.locator("#verdict").inner_text() == "FAILED"
        assert "Reference window: 6 days" in page.locator("#window").inner_text()
        rows = page.locator("#breaches + table tr.breached")
        assert ("js", "price") in {tuple(rows.nth(i).locator("td").all_inner_texts()[:2])
                                   for i in range(rows.count())}
        first = page.locator("section.card").first
        assert first.get_attribute("id") == "column-price"
        assert "breached" in (first.get_attribute("class") or "")
        # Both sides drawn: the reference's bars and this run's, prices ×100 two decades up.
        assert first.locator("rect.theirs").count() > 0
        assert first.locator("rect.ours").count() > 0
        page.locator("a[href='#column-price']").first.click()
        shot = tmp_path / "report.png"
        page.screenshot(path=str(shot), full_page=False)
        print(f"screenshot: {shot}")
    assert not visit.problems, visit.problems
    assert not visit.outside, visit.outside


def test_a_bad_day_is_refused_at_publish(job_output, small_log, spark, redis_server,
                                         tmp_path):
    """The shared small log again, its last day's prices in cents: the run's verdict fails
    against the output it replaces, validate exits 1; sent again, the day fails again
    (against the last day that passed); publish writes nothing to Redis, and --accept-drift
    publishes it and records why, after which the day is the reference."""
    from featureline.cli import main
    from featureline.core.drift import ACCEPTED_DRIFT_FILE
    from featureline.feature_store.errors import DriftRefusedError
    from featureline.feature_store.publish import publish
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
    # The window it was checked against, kept: the log's six days — the first run's seed of
    # five and its own day, which this run sends again (the earlier version passed).
    window_days = sorted(path.stem for path in (output / PROFILES_DIR).glob("*.json"))
    assert len(window_days) == 6 and window_days[-1] == last_day
    reference = json.loads((output / "profile.reference.json").read_text())
    assert reference["window"]["first"] == window_days[0]
    assert reference["window"]["days"] == 6

    validated = CliRunner().invoke(main, ["validate", str(output)])
    assert validated.exit_code == 1, validated.output
    assert "BREACH js price" in validated.output
    assert f"report: {output / REPORT_FILE}" in validated.output
    _the_metrics_name_the_breach(samples((output / METRICS_FILE).read_text()))
    _the_report_shows_the_breach(output / REPORT_FILE, tmp_path)
    again, metrics = tmp_path / "again.html", tmp_path / "again.prom"
    CliRunner().invoke(main, ["validate", str(output), "--report", str(again),
                              "--metrics-file", str(metrics)])
    assert "price" in again.read_text()
    _the_metrics_name_the_breach(samples(metrics.read_text()))
    # Against a baseline of the day alone, it passes.
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(output / "profile.json", alone / "profile.json")
    passed = CliRunner().invoke(main, ["validate", str(output), "--reference", str(alone)])
    assert passed.exit_code == 0 and "PASSED" in passed.output, passed.output
    # The latest verdict stands: checked against the kept reference again, the day fails.
    assert CliRunner().invoke(main, ["validate", str(output)]).exit_code == 1

    # The same bad day sent again: checked against the last day that passed, not itself.
    metadata = job.run(config, spark, progress=lambda _: None).metadata
    verdict = metadata["checks"]
    assert not verdict["passed"] and "own day failed" in verdict["reference"], verdict
    assert ("js", "price") in {(b["check"], b["column"]) for b in verdict["breaches"]}

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
    # Accepted: the day starts a new window, the next run is checked against it alone.
    after = job.run(config, spark, progress=lambda _: None).metadata["checks"]
    assert after["passed"] and "published with --accept-drift" in after["reference"], after
    assert [path.stem for path in (output / PROFILES_DIR).glob("*.json")] == [last_day]


def test_the_latest_validate_verdict_is_the_one_publish_enforces(job_output, redis_server,
                                                                 tmp_path):
    """A run that passed, validated again against a reference whose day held ten times the
    events: validate exits 1 and records that verdict in the output, and publish refuses it;
    validated again and passing, publish writes it. A verdict of another dataset version is
    not this output's."""
    from featureline.cli import main
    from featureline.core.drift import VERDICTS_FILE, latest_verdict
    from featureline.core.metadata import read_metadata
    from featureline.feature_store.errors import DriftRefusedError
    from featureline.feature_store.publish import publish
    from featureline.feature_store.repo import open_repo

    output, busier = tmp_path / "out", tmp_path / "busier"
    shutil.copytree(job_output.output, output)
    (busier).mkdir()
    day = json.loads((output / "profile.json").read_text())
    (busier / "profile.json").write_text(json.dumps({**day,
                                                     "day_events": day["day_events"] * 10}))
    metadata = read_metadata(output)
    assert metadata.checks is not None and metadata.checks.passed

    refused = CliRunner().invoke(main, ["validate", str(output), "--reference", str(busier)])
    assert refused.exit_code == 1 and "BREACH volume" in refused.output, refused.output
    [record] = [json.loads(line) for line in (output / VERDICTS_FILE).read_text().splitlines()]
    assert (record["passed"], record["reference"], record["dataset_version"]) == (
        False, str(busier), metadata.dataset_version)
    assert not latest_verdict(output, metadata).passed
    project = copy_project(tmp_path)
    url = fresh_db(redis_server, 2)  # a database no other test uses
    with pytest.raises(DriftRefusedError, match="volume"):
        publish(open_repo(project.feature_store, output, url=url), progress=lambda _: None)
    assert redis.Redis.from_url(url).dbsize() == 0

    passed = CliRunner().invoke(main, ["validate", str(output), "--reference", str(output)])
    assert passed.exit_code == 0, passed.output
    assert latest_verdict(output, metadata).passed
    summary = publish(open_repo(project.feature_store, output, url=url), progress=lambda _: None)
    assert summary.keys > 0

    # A failing verdict of another dataset version (an output this one replaced) stands not.
    with (output / VERDICTS_FILE).open("a") as log:
        log.write(json.dumps({**record, "dataset_version": "another"}) + "\n")
    assert latest_verdict(output, metadata).passed
