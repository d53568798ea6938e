"""The whole job on a small generated log: accounting, outputs, point-in-time entities,
idempotence, atomic failure."""

from __future__ import annotations

import json
import re
import time
from datetime import timedelta
from pathlib import Path

import pandas as pd
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from featureline.core.aggregations import GroupSpec, entity_group
from featureline.core.errors import ConfigError
from featureline.core.ids import OOV_ID, PADDING_ID
from featureline.core.metadata import VOCABULARY_DIR
from featureline.core.model_inputs import Candidates, Fitted, Source, raw_value
from featureline.etl import job, job_inputs, job_writes
from featureline.etl.config import EtlConfig
from featureline.etl.datagen import BAD_KINDS_TEXT
from featureline.etl.errors import MostlyQuarantinedError, NoInputError
from tests.job_config import make_config


def _table(path: Path) -> pd.DataFrame:
    return ds.dataset(path, format="parquet", partitioning="hive").to_table().to_pandas()


def test_rows_add_up_exactly(job_output):
    rows = job_output.metadata["rows"]
    assert rows["read"] == 6000
    assert rows["read"] == rows["accepted"] + rows["duplicates"] + sum(
        rows["quarantined"].values())
    # datagen made 120 bad rows, one kind after another (11 kinds → 11 or 10 of each).
    expected = {kind: 120 // len(BAD_KINDS_TEXT) + (i < 120 % len(BAD_KINDS_TEXT))
                for i, kind in enumerate(BAD_KINDS_TEXT)}
    assert rows["duplicates"] == expected.pop("duplicate")
    assert {k: v for k, v in rows["quarantined"].items() if v} == expected
    quarantine = _table(job_output.output / "quarantine")
    assert len(quarantine) == sum(expected.values())
    assert quarantine.groupby("reason").size().to_dict() == expected
    assert quarantine["record"].str.len().min() > 0
    # datagen's duplicates repeat a line exactly: each is listed with the copy that was kept.
    duplicates = _table(job_output.output / "duplicates")
    assert len(duplicates) == rows["duplicates"]
    assert (duplicates["record"] == duplicates["kept_record"]).all()
    assert duplicates["source_file"].str.endswith(".jsonl").all()


def test_examples_match_metadata(job_output):
    metadata = job_output.metadata
    examples = _table(job_output.output / "examples")
    assert len(examples) == metadata["rows"]["accepted"]
    assert examples.groupby("split").size().to_dict() == metadata["split"]["rows"]
    # A folder per split and UTC day, holding that day's rows only.
    days = sorted(p.name for p in (job_output.output / "examples" / "split=train").iterdir())
    assert len(days) > 1 and all(d.startswith("day=") for d in days)
    assert (examples["ts"].dt.strftime("%Y-%m-%d") == examples["day"].astype(str)).all()
    schema = pq.read_schema(next((job_output.output / "examples" / "split=train")
                                 .rglob("*.parquet")))
    for feature in metadata["features"]:
        field = schema.field(feature["name"])
        if feature["kind"] == "multi_hot":
            assert str(field.type.value_type) == "int64"
            assert examples[feature["name"]].map(len).eq(feature["width"]).all()
        else:
            assert str(field.type) == {"int64": "int64", "float32": "float"}[feature["dtype"]]
        if feature["kind"] == "categorical":
            values = examples[feature["name"]]
            assert values.min() >= 0 and values.max() < feature["cardinality"]
    assert set(examples["label"]) == {0, 1}
    valid_from = pd.Timestamp(metadata["split"]["valid_from"]).tz_localize(None)
    assert (examples.loc[examples.split == "valid", "ts"] >= valid_from).all()
    assert (examples.loc[examples.split == "train", "ts"] < valid_from).all()
    shorts = [f["short_name"] for f in metadata["features"]] + [metadata["label"]["short_name"]]
    assert len(set(shorts)) == len(shorts) and all(1 <= len(s) <= 3 for s in shorts)


def test_label_rule_applied(job_output, small_log):
    kinds: dict[tuple[str, str, pd.Timestamp], set[str]] = {}
    for line in small_log.read_text().splitlines():
        try:
            record = json.loads(line)
            key = (record["user_id"], record["item_id"],
                   pd.Timestamp(record["ts"]).tz_localize(None))
        except (ValueError, KeyError, TypeError):
            continue
        kinds.setdefault(key, set()).add(record.get("event_type"))
    examples = _table(job_output.output / "examples")
    checked = 0
    for row in examples.itertuples():
        types = kinds[(row.user_id, row.item_id, row.ts)]
        if len(types) == 1:
            assert row.label == int(types.pop() in {"click", "purchase"})
            checked += 1
    assert checked > 0.99 * len(examples)
    assert 0 < examples["label"].mean() < 0.5


def test_embedding_plan(job_output):
    plan = job_output.metadata["embedding_plan"]
    features = plan["features"]
    assert features["user_prev_item"]["shares"] == "item_id_cat"
    assert features["user_hist_items"]["row_offset"] == features["item_id_cat"]["row_offset"]
    for table in plan["fused_tables"].values():
        assert table["width"] * 4 % 16 == 0
        offset = 0
        for member in table["features"]:
            assert member["row_offset"] == offset
            offset += member["rows"]
        assert table["rows"] == offset


def test_artifacts_readable_with_pyarrow_alone(job_output):
    artifacts = job_output.output / "artifacts"
    vocabulary = pq.read_table(artifacts / "categorify" / "item_id").to_pandas()
    assert vocabulary["id"].tolist() == list(range(2, len(vocabulary) + 2))
    assert vocabulary["count"].is_monotonic_decreasing
    examples = _table(job_output.output / "examples")
    train = examples[examples.split == "train"]
    # The same ids the examples carry: a (raw id, encoded id) pair maps one to one.
    pairs = train[["item_id", "item_id_cat"]].drop_duplicates()
    lookup = dict(zip(vocabulary["value"], vocabulary["id"], strict=True))
    assert (pairs["item_id"].map(lookup) == pairs["item_id_cat"]).all()
    stats = json.loads((artifacts / "stats.json").read_text())
    assert 0 < stats["target_encode"]["prior"] < 1
    assert set(stats["normalize"]["columns"]) == {"price"}  # value: an outcome


def test_entity_snapshots_are_point_in_time_correct(job_output):
    examples = _table(job_output.output / "examples")
    users = _table(job_output.output / "entities" / "user")
    items = _table(job_output.output / "entities" / "item")
    assert users["event_timestamp"].dt.hour.eq(0).all()
    for entities, key, prefix in ((users, "user_id", "user"), (items, "item_id", "item")):
        sample = entities.sample(n=min(25, len(entities)), random_state=0)
        for snapshot in sample.itertuples():
            at = snapshot.event_timestamp
            before = examples[(examples[key] == getattr(snapshot, key)) & (examples.ts < at)]
            recent = before[before.ts >= at - timedelta(days=7)]
            assert getattr(snapshot, f"{prefix}_events") == len(before)
            assert getattr(snapshot, f"{prefix}_events_7d") == len(recent)
            assert getattr(snapshot, f"{prefix}_positives") == before["label"].sum()
            assert getattr(snapshot, f"{prefix}_positive_rate") == pytest.approx(
                before["label"].mean())
    # Snapshots: the day after each active day and the 8 days after it, while an event can
    # leave the 7-day window (a day's hop), up to the day after the log's last event.
    end = examples.ts.max().normalize() + timedelta(days=1)
    for entities, key in ((users, "user_id"), (items, "item_id")):
        for value, own in examples.groupby(key):
            after = {day + timedelta(days=1) for day in own.ts.dt.normalize()}
            expected = {day + timedelta(days=k) for day in after for k in range(9)
                        if day + timedelta(days=k) <= end}
            stamps = entities.loc[entities[key] == value, "event_timestamp"]
            assert set(stamps) == expected, value
            if max(after) + timedelta(days=8) <= end:  # idle long enough: decayed to 0
                latest = entities.loc[stamps.idxmax()]
                assert latest[f"{key.split('_')[0]}_events_7d"] == 0, value
    described = job_output.metadata["entities"]["user"]
    assert described["join_key"] == "user_id"
    assert [f["name"] for f in described["features"]] == [
        c for c in users.columns if c not in {"user_id", "event_timestamp"}]
    # The features are the engine's spec, the encoded id beside them.
    group = GroupSpec.model_validate(described["group"])
    assert group == entity_group("user", 7)
    assert [f.output for f in group.outputs()] == [
        "user_events", "user_events_7d", "user_positives", "user_positive_rate"]
    assert [f["name"] for f in described["features"]] == [
        "user_id_cat", *(f.output for f in group.outputs())]


def test_two_runs_give_identical_values(spark, small_log, tmp_path, job_output):
    again = job.run(make_config(tmp_path, small_log), spark, progress=lambda _: None)
    for table in ("examples", "entities/user", "entities/item", "quarantine"):
        first, second = _table(job_output.output / table), _table(again.output / table)
        order = [c for c in first.columns if c != "user_hist_items"]
        first = first.sort_values(order).reset_index(drop=True)
        second = second.sort_values(order).reset_index(drop=True)
        pd.testing.assert_frame_equal(first, second, check_exact=False, rtol=1e-12)
    assert again.metadata["config_hash"] == job_output.metadata["config_hash"]
    # Each examples file in key order, and the same rows in the same file and order each run
    # (the TFRecords are made file by file from them).
    for split in ("train", "valid"):
        files = [sorted((output / "examples" / f"split={split}").rglob("part-*.parquet"))
                 for output in (job_output.output, again.output)]
        assert files[0] and [(f.parent.name, f.name[:10]) for f in files[0]] == [
            (f.parent.name, f.name[:10]) for f in files[1]]
        for first, second in zip(*files, strict=True):
            rows = pq.read_table(first).to_pandas()
            keys = list(zip(rows.user_id, rows.item_id, rows.ts, strict=True))
            assert keys == sorted(keys)
            pd.testing.assert_frame_equal(rows, pq.read_table(second).to_pandas(),
                                          check_exact=False, rtol=1e-12)
    # Features alike; the model-ready statistics to the last bits a sum's order decides.
    features, expected = again.metadata["features"], job_output.metadata["features"]
    assert [{k: v for k, v in f.items() if k != "transform"} for f in features] == [
        {k: v for k, v in f.items() if k != "transform"} for f in expected]
    for got, want in zip(features, expected, strict=True):
        assert (got.get("transform") or {}).keys() == (want.get("transform") or {}).keys()
        for key, value in (want.get("transform") or {}).items():
            assert got["transform"][key] == (pytest.approx(value, rel=1e-12)
                                             if isinstance(value, float) else value)


@pytest.mark.slow
def test_failed_job_leaves_no_partial_output(spark, small_log, tmp_path, monkeypatch):
    config = make_config(tmp_path, small_log)
    first = job.run(config, spark, progress=lambda _: None)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))

    def broken(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(job_writes, "entity_snapshots", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        job.run(config, spark, progress=lambda _: None)
    # The previous output is untouched and no staging folder is left behind.
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    assert json.loads((first.output / "metadata.json").read_text())["rows"]["read"] == 6000


def test_failure_on_fresh_output_leaves_nothing(spark, tmp_path):
    log = tmp_path / "all-bad.jsonl"
    log.write_text('{"user_id": "u1"}\nnot json\n')
    with pytest.raises(NoInputError, match="every row was quarantined"):
        job.run(make_config(tmp_path, log), spark, progress=lambda _: None)
    # No output, no staging folder: only the output's lock file, which stays for the next run.
    assert sorted(p.name for p in tmp_path.iterdir()) == [".out.lock", "all-bad.jsonl"]


def _ratings(path: Path) -> Path:
    """A RecBole-shaped ratings file: tab-separated, ``name:type`` headers, no event type,
    four days of 1997."""
    lines = ["user_id:token\titem_id:token\trating:float\ttimestamp:float\tdevice type"]
    lines += [f"{n % 23}\t{n % 31}\t{1 + n % 5}\t{881_000_000 + n * 1_300}\t{'ab'[n % 2]}"
              for n in range(240)]
    path.write_text("\n".join(lines) + "\n")
    return path


_CLASSES = ["Action Comedy", "Drama", "Action  Drama Noir ", ""]


def _ratings_config(tmp_path: Path, **validation: str) -> EtlConfig:
    config = make_config(tmp_path, _ratings(tmp_path / "ml.inter"), label="value >= 4")
    data = config.model_dump(mode="json")
    data["source"] = {"path": str(tmp_path / "ml.inter"), "format": "csv",
                      "options": {"sep": "\t"}, "categorical": ["device type"],
                      "continuous": [],
                      "columns": {"user_id": "user_id:token", "item_id": "item_id:token",
                                  "ts": "timestamp:float", "value": "rating:float",
                                  "event_type": None}}
    data["validation"] = {"ts_unit": "s", **validation}
    # The films' genres in a file of their own, one film (999) not rated yet; their
    # classes a list (spaces between, one doubled, one film without).
    (tmp_path / "ml.item").write_text("item_id:token\tgenre:token\tclass:token_seq\n" + "".join(
        f"{n}\tg{n % 3}\t{_CLASSES[n % 4]}\n" for n in range(31)) + "999\tnoir\tNoir\n")
    data["attributes"] = [{"name": "movies", "path": str(tmp_path / "ml.item"),
                           "options": {"sep": "\t"}, "key": {"item_id": "item_id:token"},
                           "categorical": ["genre:token"], "lists": {"class:token_seq": " "}}]
    return EtlConfig.model_validate(data)


def test_a_ratings_log_with_no_numeric_context_column(spark, tmp_path):
    """``continuous: []``, no event type, a column named with a space: the whole job runs
    (it crashed in normalize), the column by its safe name in the features."""
    done = job.run(_ratings_config(tmp_path), spark, progress=lambda _: None)
    rows = done.metadata["rows"]
    assert (rows["read"], rows["accepted"]) == (240, 240)
    examples = pq.read_table(Path(done.output) / "examples").to_pandas()
    assert len(examples) == 240
    assert sorted(examples["device_type_cat"].unique()) == [2, 3]  # two values, ids from 2
    features = {f["name"]: f for f in done.metadata["features"]}
    assert features["device_type_cat"]["cardinality"] == 4 and features[
        "device_type_cat"]["short_name"]
    # The film file's genre joins each rating; the online tiles hold the file's value of a
    # film no one rated yet, served as its attribute.
    genres = examples.groupby("item_id")["genre_token_cat"].nunique()
    assert (genres == 1).all() and examples["genre_token_cat"].nunique() == 3
    table = done.metadata["tiles"]["tables"]["inputs_item:attr_genre_token"]
    tiles = pq.read_table(Path(done.output) / table).to_pandas()
    unrated = tiles[tiles["item_id"] == "999"]
    assert len(unrated) == 1 and "noir" in str(unrated.iloc[0].to_dict())
    assert len(tiles) == 32  # every film: the 31 rated and the one not yet
    assert examples["label"].sum() == sum(1 + n % 5 >= 4 for n in range(240))
    assert not any(f["name"].endswith("_norm") for f in done.metadata["features"])
    # The classes: a list of ids per film, in the file's order, as wide as the longest list;
    # a request's list gets the same ids (core.model_inputs).
    classes = features["class_token_seq_cat"]
    assert (classes["kind"], classes["width"], classes["cardinality"]) == ("multi_hot", 3, 6)
    recorded = done.metadata["inputs"]["features"]["class_token_seq_cat"]
    assert {k: v for k, v in recorded.items() if v not in (None, [])} == {
        "kind": "id", "column": "class_token_seq", "separator": " ", "width": 3}
    vocabulary = pq.read_table(Path(done.output) / VOCABULARY_DIR / "class_token_seq").to_pandas()
    ids = dict(zip(vocabulary["value"], vocabulary["id"], strict=True))
    assert sorted(ids) == ["Action", "Comedy", "Drama", "Noir"]
    fitted = Fitted({}, {}, 0.0, lambda _, values: [ids.get(v, OOV_ID) for v in values])
    source = Source(kind="id", column="class_token_seq", separator=" ", width=3)
    for film, rows in examples.groupby("item_id"):
        text = _CLASSES[int(film) % 4]
        expected = [ids[v] for v in text.split()] + [PADDING_ID] * (3 - len(text.split()))
        assert {tuple(row) for row in rows["class_token_seq_cat"]} == {tuple(expected)}
        served = raw_value(source, Candidates(0, {"item_id": [film],
                                                  "class_token_seq": [text or None]}, {}),
                           fitted, None)
        assert served == [expected]
    served = raw_value(source, Candidates(0, {"item_id": ["1"],
                                              "class_token_seq": ["Western Drama"]}, {}),
                       fitted, None)
    assert served == [[OOV_ID, ids["Drama"], PADDING_ID]]


def test_most_rows_quarantined_by_one_reason_stop_the_run_naming_the_setting(spark, tmp_path):
    config = _ratings_config(tmp_path, ts_min="2000-01-01T00:00:00Z")
    with pytest.raises(MostlyQuarantinedError) as info:
        job.run(config, spark, progress=lambda _: None)
    message = str(info.value)
    assert message.startswith("timestamp_out_of_window quarantined 240 of 240 rows")
    assert "etl.validation.ts_min (2000-01-01 00:00:00+00:00)" in message
    assert "dated 1997-12-01 18:13:20 to 1997-12-05 08:31:40" in message
    assert not (tmp_path / "out").exists()


def test_a_log_shorter_than_the_validation_window_is_a_config_error(spark, tmp_path):
    log = tmp_path / "one-day.jsonl"
    log.write_text('{"user_id":"u","item_id":"i","event_type":"view","ts":"2026-01-05T01:00:00Z"}\n')
    with pytest.raises(ConfigError) as info:
        job.run(make_config(tmp_path, log), spark, progress=lambda _: None)
    assert info.value.key == "etl.split.valid_days"


@pytest.mark.parametrize("zone", ["Pacific/Kiritimati", "America/Los_Angeles"])
def test_the_split_boundary_does_not_depend_on_the_machine_time_zone(spark, zone,
                                                                      monkeypatch):
    import time
    from datetime import datetime, timezone

    from pyspark.sql import functions as F

    events = spark.createDataFrame([("2026-01-05T23:30:00Z",), ("2026-01-03T01:00:00Z",)],
                                   ["text"]).select(F.to_timestamp("text").alias("ts"))
    monkeypatch.setenv("TZ", zone)
    time.tzset()
    try:
        boundary = job_inputs.valid_from_day(events, valid_days=1)
    finally:
        monkeypatch.undo()
        time.tzset()
    assert boundary == datetime(2026, 1, 5, tzinfo=timezone.utc)


def test_each_stage_says_what_it_wrote_when_done(job_run):
    result, lines = job_run
    metadata = result.metadata
    rows = metadata["rows"]
    done = dict(line.split(" done in ", 1) for line in lines if " done in " in line)
    assert list(done) == ["ingest", "split", "features", "write_examples", "write_tfrecord",
                          "entities", "artifacts", "profile", "state"]
    summary = {stage: text.partition("s: ")[2] for stage, text in done.items()}
    assert summary["ingest"] == (
        f"{rows['read']:,} rows read, {rows['accepted']:,} events accepted, "
        f"{sum(rows['quarantined'].values()):,} quarantined, "
        f"{rows['duplicates']:,} duplicates removed")
    assert rows["read"] == (rows["accepted"] + rows["duplicates"]
                            + sum(rows["quarantined"].values()))
    split = metadata["split"]["rows"]
    assert summary["split"] == f"train {split['train']:,}, valid {split['valid']:,}"
    assert summary["features"] == f"{len(metadata['features'])} features"
    assert summary["write_examples"] == f"{rows['accepted']:,} examples"
    files = metadata["tfrecord"]["files"]
    assert summary["write_tfrecord"] == f"{rows['accepted']:,} rows in {len(files)} files"
    assert summary["entities"] == (f"{', '.join(metadata['entities'])}; tiles of "
                                   f"{len(metadata['tiles']['tables'])} outputs")
    assert summary["artifacts"] == ""  # none: its tables are listed in metadata.json
    assert summary["state"] == f"{rows['accepted']:,} events"
    # The first run at its path has nothing to be checked against; its profile is written,
    # and the next run's window seeded: the day before its last profiled, the days before
    # that by their totals.
    assert summary["profile"] == "profile written; no reference to check against"
    assert metadata["checks"] == {"passed": True, "reference": None, "breaches": []}
    assert (result.output / "profile.json").is_file()
    seeded = [json.loads(p.read_text()) for p in sorted((result.output / "profiles").glob("*"))]
    every_day = json.loads((result.output / "profile.json").read_text())["events_per_day"]
    assert [day["day"] for day in seeded] == sorted(every_day)[:-1]  # the log's six days
    assert [day["day_events"] for day in seeded] == [every_day[d] for d in sorted(every_day)[:-1]]
    assert [day.get("columns") is not None for day in seeded] == [False] * 4 + [True]
    assert not (result.output / "profile.reference.json").exists()


def test_a_long_stage_reports_its_spark_progress(spark, monkeypatch):
    monkeypatch.setattr(job, "PROGRESS_EVERY_S", 0.2)
    lines: list[str] = []
    timer = job.StageTimer(lines.append, spark)
    with timer("slow"):
        spark.sparkContext.parallelize(range(4), 4).map(
            lambda x: time.sleep(1.5) or x).count()
    progress = [line for line in lines if line.startswith("slow: ")]
    assert progress, lines
    assert re.search(r"slow: \d+s, 1 Spark stage\(s\) running, tasks \d/4$", progress[0])
    assert lines[0] == "slow ..." and lines[-1].startswith("slow done in ")


def test_the_job_runs_the_stages_the_gpu_checks_attribute_work_to(job_output):
    from featureline.etl.stages import JOB_STAGES

    assert [k for k in job_output.metadata["timings_s"] if k != "total"] == list(JOB_STAGES)


def test_metadata_is_read_typed_and_an_unreadable_format_is_refused(job_output, tmp_path):
    import json
    import shutil

    from featureline.core.errors import MetadataFormatError
    from featureline.core.metadata import FORMAT_VERSION, METADATA_FILE, present, read_metadata

    assert job_output.metadata["format_version"] == FORMAT_VERSION
    metadata = read_metadata(job_output.output)
    assert metadata.rows.accepted == job_output.metadata["rows"]["accepted"]
    assert metadata.dataset_version == job_output.metadata["dataset"]["version"]
    assert metadata.folder == job_output.output
    written = json.loads((job_output.output / METADATA_FILE).read_text())
    copy = tmp_path / "output"
    copy.mkdir()

    def read(document):
        (copy / METADATA_FILE).write_text(json.dumps(document))
        return read_metadata(copy)

    # An output written before the format was numbered (format 1) is read as it is.
    older = {k: v for k, v in written.items() if k not in ("format_version", "dataset")}
    assert read(older).format_version == 1
    assert read(older).dataset_version.startswith("unversioned:")
    with pytest.raises(MetadataFormatError, match=r"format_version 99; this Featureline "
                                                  rf"reads 1 to {FORMAT_VERSION}"):
        read({**written, "format_version": 99})
    with pytest.raises(MetadataFormatError, match=r"rows\.accepted"):
        read({**written, "rows": {**written["rows"], "accepted": "many"}})
    # An output holding only what Feast reads is read; a reader needing more says what.
    only_entities = read({"entities": written["entities"]})
    assert only_entities.entities["user"].join_key == "user_id"
    with pytest.raises(MetadataFormatError, match="no 'label' section"):
        present(only_entities.label, only_entities, "label")
    shutil.rmtree(copy)
