"""A spec change's backfill (``etl.spec_change``): an output brought to a new
``aggregations:`` and ``derive:`` spec equals a full run with that spec over the same events,
its unchanged files linked, not written."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from featureline.etl import job
from featureline.etl.config import EtlConfig
from featureline.etl.incremental import STATE_DIR, read_state
from featureline.etl.spec_change import backfill_if_changed, run_incremental, spec_change
from featureline.etl.tfrecord.reader import read_numpy
from tests.job_config import make_config
from tests.test_incremental import (
    AGGREGATIONS,
    NEW_DAYS,
    _split_log,
    _table,
    same_records_and_metadata,
    same_table,
)

# A full run and the backfill after it, then a full run with the new spec (~2 min on 2 cores).
pytestmark = pytest.mark.slow

BEFORE_DERIVE = [{"name": "hour_share", "expr": "item_hour:count_1h / (item_hour:count_1h + 1)"}]
# The new spec: user_recent's count_1d counts clicks only (changed) and gains positives_1d
# (added); item_recent is removed, item_hour loses its approx_distinct, item_day is new; a
# derived feature reads the added and the changed output, hour_share is kept.
AFTER = [{"name": "user_recent", "keys": ["user_id"], "features": [
             {"op": "count", "windows": ["1d"], "filter": "event_type in (click)"},
             {"op": "count", "name": "positives", "filter": "label", "windows": ["1d"]},
             *AGGREGATIONS[0]["features"][1:]]},
         {"name": "item_hour", "keys": ["item_id"], "features": [
             f for f in AGGREGATIONS[2]["features"] if f["op"] != "approx_distinct"]},
         {"name": "item_day", "keys": ["item_id"], "features": [
             {"op": "count", "windows": ["1d"]}]}]
AFTER_DERIVE = [*BEFORE_DERIVE, {"name": "click_rate", "expr": (
    "ratio(user_recent:positives_1d, user_recent:count_1d, prior=0.1, weight=2)")}]


def _config(root: Path, log: Path, name: str, aggregations: list, derive: list,
            **overrides: object) -> EtlConfig:
    config = make_config(root / name, log, aggregations=aggregations, **overrides)
    return config.model_copy(update={"derive": EtlConfig.model_validate(
        {**config.model_dump(mode="json"), "derive": derive}).derive})


@pytest.fixture(scope="module")
def changed(spark, small_log, tmp_path_factory):
    """The old spec's full run, a copy of it brought to the new spec, and the new spec's full
    run over the same log."""
    root = tmp_path_factory.mktemp("spec-change")
    files = _split_log(small_log, root / "raw")
    before = job.run(_config(root, files["old"], "before", AGGREGATIONS, BEFORE_DERIVE), spark,
                     progress=lambda _: None)
    output = root / "backfilled"
    shutil.copytree(before.output, output)
    inodes = {path.relative_to(output): path.stat().st_ino for path in output.rglob("*")
              if path.is_file()}
    config = _config(root, files["old"], "ignored", AFTER, AFTER_DERIVE, mode="incremental")
    config = config.model_copy(update={"output": config.output.model_copy(
        update={"path": str(output)})})
    lines: list[str] = []
    state = read_state(output)
    found = spec_change(state, config)
    backfilled = backfill_if_changed(config, spark, lines.append)
    full = job.run(_config(root, files["old"], "full", AFTER, AFTER_DERIVE), spark,
                   progress=lambda _: None)
    return {"before": before, "backfilled": backfilled, "full": full, "change": found,
            "lines": lines, "config": config, "inodes": inodes, "files": files}


def test_the_change_names_what_was_added_changed_and_removed(changed):
    change = changed["change"]
    assert set(change.changed) == {"user_recent:count_1d", "user_recent:positives_1d",
                                   "item_day:count_1d", "click_rate"}
    assert set(change.removed) == {"item_recent:value_sum_7d",
                                   "item_hour:user_id_approx_distinct_1h"}
    assert changed["lines"][0] == f"spec change: {change.reason}"
    assert change.reason.startswith("added click_rate, item_day:count_1d, "
                                    "user_recent:positives_1d; changed user_recent:count_1d; "
                                    "removed ")


@pytest.mark.parametrize("table", [
    "examples", "aggregations/user_recent", "aggregations/item_hour", "aggregations/item_day",
    f"{STATE_DIR}/day_partials/user_recent",
    "tiles/user_recent/count_1d", "tiles/user_recent/positives_1d",
    "tiles/user_recent/label_mean_all", "tiles/item_day/count_1d", "tiles/item_hour/count_1h",
    "entities/user", f"{STATE_DIR}/events"])
def test_every_table_equals_the_new_specs_full_run(changed, table):
    same_table(changed["backfilled"].output, changed["full"].output, table)


def test_tfrecords_metadata_and_profile_equal_the_full_runs(changed):
    same_records_and_metadata(changed["backfilled"], changed["full"])
    assert changed["backfilled"].metadata["mode"] == "backfill"


def test_removed_outputs_are_gone_and_kept_files_are_linked(changed):
    ours = changed["backfilled"].output
    assert not (ours / "aggregations/item_recent").exists()
    assert not (ours / "tiles/item_recent").exists()
    assert not (ours / f"{STATE_DIR}/day_partials/item_recent").exists()
    assert not (ours / "tiles/item_hour/user_id_approx_distinct_1h").exists()
    columns = _table(ours / "examples").column_names
    assert "item_recent__value_sum_7d" not in columns
    assert {"click_rate", "user_recent__positives_1d", "item_day__count_1d"} <= set(columns)
    kept = ["tiles/item_hour/count_1h", "tiles/user_recent/label_mean_all", "entities/user",
            f"{STATE_DIR}/events", "artifacts/categorify/item_id"]
    for folder in kept:
        files = sorted(p.relative_to(ours) for p in (ours / folder).rglob("*.parquet"))
        assert files, folder
        assert all((ours / f).stat().st_ino == changed["inodes"][f] for f in files), folder
    rewritten = sorted(p.relative_to(ours) for p in (ours / "examples").rglob("*.parquet"))
    assert rewritten and not any(f in changed["inodes"] for f in rewritten)


def test_the_state_takes_the_new_spec_and_the_next_day_extends_it(changed, spark):
    config = changed["config"]
    output = changed["backfilled"].output
    assert spec_change(read_state(output), config) is None
    assert backfill_if_changed(config, spark, lambda _: None) is None
    # The day's run after it: nothing left to backfill; the new days' rows get the new
    # features.
    lines: list[str] = []
    day = run_incremental(config.model_copy(update={"source": config.source.model_copy(
        update={"path": str(changed["files"]["new"])})}), spark, lines.append)
    assert not any(line.startswith("spec change") for line in lines)
    examples = _table(day.output / "examples").to_pylist()
    new_days = [row for row in examples if str(row["day"]) in NEW_DAYS]
    assert new_days and len(examples) > len(new_days)
    rates = [row["click_rate"] for row in new_days if not row["click_rate_missing"]]
    assert len(rates) > len(new_days) / 2 and len(set(rates)) > 10


def test_a_removal_copies_each_examples_file_less_its_columns(changed, spark, tmp_path):
    """Outputs removed only: every examples file copied less their columns, its rows in
    their order; the TFRecords hold the same rows as the new spec's full run's, less them."""
    source, output = changed["full"].output, tmp_path / "removed"
    shutil.copytree(source, output)
    config = _config(tmp_path, changed["files"]["old"], "ignored", AFTER[:2], BEFORE_DERIVE,
                     mode="incremental")
    config = config.model_copy(update={"output": config.output.model_copy(
        update={"path": str(output)})})
    lines: list[str] = []
    result = backfill_if_changed(config, spark, lines.append)
    assert result is not None
    assert lines[0] == "spec change: removed click_rate, item_day:count_1d"
    dropped = ["item_day__count_1d", "click_rate", "click_rate_missing"]
    for old in sorted((source / "examples").rglob("*.parquet")):
        ours, theirs = pq.read_table(output / old.relative_to(source)), pq.read_table(old)
        assert ours.schema == theirs.drop_columns(dropped).schema
        assert ours.equals(theirs.drop_columns(dropped))
    assert spark.read.parquet(str(output / "examples")).columns == [
        c for c in spark.read.parquet(str(source / "examples")).columns if c not in dropped]
    for split in ("train", "valid"):
        ours, theirs = read_numpy(output, split), read_numpy(source, split)
        assert set(ours) == set(theirs) - set(dropped) and len(ours["label"]) > 0
        for name, values in ours.items():
            assert np.array_equal(values, theirs[name]), name
    assert not (output / "aggregations/item_day").exists()
