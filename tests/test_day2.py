"""Day 2: the job run again on a grown log keeps every id it gave, extends the vocabularies
and records their lineage; a refit starts a new one."""

from __future__ import annotations

import json
import shutil
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
import pytest

from core.metadata import compatible
from etl import job
from tests.job_config import make_config


def _vocabulary(output: Path, column: str) -> dict[str, int]:
    table = pd.read_parquet(output / "artifacts" / "categorify" / column)
    return dict(zip(table["value"], table["id"], strict=True))


def _time(line: str) -> pd.Timestamp | None:
    """An event's time as the log holds it (ISO text or epoch s/ms); None when unreadable."""
    try:
        ts = json.loads(line).get("ts")
        if isinstance(ts, int | float):
            return pd.Timestamp(ts, unit="ms" if ts > 1e11 else "s", tz="UTC")
        return pd.Timestamp(ts).tz_convert("UTC") if ts else None
    except (ValueError, TypeError, AttributeError):
        return None


def _first_days(log: Path, target: Path, days: int) -> Path:
    """The log's events of its first ``days`` days, and its unreadable lines."""
    lines = log.read_text().splitlines()
    times = [_time(line) for line in lines]
    first = min(t for t in times if t is not None and t.year >= 2020).normalize()
    cutoff = first + pd.Timedelta(days=days)
    target.write_text("\n".join(line for line, t in zip(lines, times, strict=True)
                                if t is None or t < cutoff) + "\n")
    return target


@pytest.fixture(scope="session")
def day2(spark, small_log, tmp_path_factory):
    """Day 1 on the log's first four days, day 2 on all six into the same output; day 1's
    output copied aside before day 2 replaced it."""
    root = tmp_path_factory.mktemp("day2")
    config = make_config(root, _first_days(small_log, root / "day1.jsonl", days=4))
    first = job.run(config, spark, progress=lambda _: None)
    kept = root / "day1-output"
    shutil.copytree(first.output, kept)
    grown = make_config(root, small_log)
    second = job.run(grown, spark, progress=lambda _: None)
    return kept, second.output, grown


def test_day_two_keeps_every_id_and_numbers_new_values_after_them(day2):
    day1, day2_output, _ = day2
    for column in ("user_id", "item_id", "category"):
        before, after = _vocabulary(day1, column), _vocabulary(day2_output, column)
        assert {value: after[value] for value in before} == before
        new = set(after) - set(before)
        assert new or column == "category", f"the grown log brings new {column} values"
        assert sorted(after[v] for v in new) == list(range(max(before.values()) + 1,
                                                           max(after.values()) + 1))
        assert new or after == before
        # Contiguous from 2: the embedding plan's cardinality is the table size.
        assert sorted(after.values()) == list(range(2, len(after) + 2))


def test_examples_and_entities_use_the_extended_ids(day2):
    _, output, _ = day2
    users = _vocabulary(output, "user_id")
    examples = pd.read_parquet(output / "examples")
    assert (examples["user_id"].map(users).fillna(1) == examples["user_id_cat"]).all()
    snapshots = pd.read_parquet(output / "entities" / "user")
    assert (snapshots["user_id"].map(users).fillna(1) == snapshots["user_id_cat"]).all()
    metadata = json.loads((output / "metadata.json").read_text())
    plan = metadata["embedding_plan"]["features"]["user_id_cat"]
    assert plan["cardinality"] == len(users) + 2


def test_metadata_records_versions_and_their_lineage(day2):
    day1, output, _ = day2
    first = json.loads((day1 / "metadata.json").read_text())
    second = json.loads((output / "metadata.json").read_text())
    for column, entry in second["vocabularies"].items():
        parent = first["vocabularies"][column]
        assert entry["parent"] in (parent["version"], parent["parent"])
        assert entry["lineage"][:len(parent["lineage"])] == parent["lineage"]
        assert compatible(entry["lineage"], parent["lineage"])
    assert second["vocabularies"]["user_id"]["parent"] == first["vocabularies"]["user_id"][
        "version"]
    assert second["dataset"]["version"] != first["dataset"]["version"]
    assert second["dataset"]["vocabularies"] == {
        c: v["version"] for c, v in second["vocabularies"].items()}
    assert first["dataset"]["extends"] is None
    assert second["dataset"]["extends"] == str(Path(output).resolve())
    created = datetime.fromisoformat(second["created_at"])
    assert created <= datetime.now(timezone.utc)


def test_a_refit_starts_a_new_lineage(spark, day2, tmp_path):
    _, output, grown = day2
    refit = job.run(grown.model_copy(update={
        "output": grown.output.model_copy(update={"path": str(tmp_path / "refit")}),
        "vocabulary": grown.vocabulary.model_copy(update={"refit": True})}),
        spark, progress=lambda _: None)
    extended = json.loads((output / "metadata.json").read_text())["vocabularies"]["user_id"]
    fresh = refit.metadata["vocabularies"]["user_id"]
    assert fresh["parent"] is None and fresh["lineage"] == [fresh["version"]]
    assert not compatible(fresh["lineage"], extended["lineage"])
    # Fitted afresh on all six days: ids by descending frequency again, not day 1's.
    assert _vocabulary(tmp_path / "refit", "user_id") != _vocabulary(output, "user_id")


def test_vocabulary_from_extends_another_output(spark, day2, tmp_path):
    day1, _, grown = day2
    other = job.run(grown.model_copy(update={
        "output": grown.output.model_copy(update={"path": str(tmp_path / "other")}),
        "vocabulary": grown.vocabulary.model_copy(update={"previous": str(day1)})}),
        spark, progress=lambda _: None)
    before = _vocabulary(day1, "item_id")
    after = _vocabulary(other.output, "item_id")
    assert {value: after[value] for value in before} == before
    assert other.metadata["dataset"]["extends"] == str(day1.resolve())
