"""Each feature op against a small hand-computed example: values, not shapes."""

from __future__ import annotations

import hashlib
import math
from datetime import datetime, timedelta

import numpy as np
import pytest
import xxhash
from pyspark.sql import functions as F

from featureline.core.errors import ConfigError
from featureline.core.model_inputs import list_values as python_list_values
from featureline.core.transforms import apply as apply_transform
from featureline.etl.config import EtlConfig
from featureline.etl.features.base import MICROS, TS_MICROS, FeatureSpec, epoch_micros
from featureline.etl.features.categorify import Categorify, list_values, summaries, summarize
from featureline.etl.features.count_encode import CountEncode
from featureline.etl.features.cyclic_time import CyclicTime
from featureline.etl.features.hashed_cross import HashedCross
from featureline.etl.features.history import History
from featureline.etl.features.lag_features import LagFeatures
from featureline.etl.features.model_ready import ModelReady, ModelReadyConfig
from featureline.etl.features.normalize import Normalize
from featureline.etl.features.pipeline import FeaturePipeline
from featureline.etl.features.target_encode import FOLD, TargetEncode, fold_of_event

T0 = datetime(2026, 1, 5, 0, 0, 0)  # a Monday, UTC
SCHEMA = ("user_id string, item_id string, event_type string, ts timestamp, value double, "
          "category string, label long, split string")


def frame(spark, rows):
    """rows: (user, item, seconds after T0, label, split[, value, category])."""
    data = []
    for row in rows:
        user, item, seconds, label, split = row[:5]
        value = row[5] if len(row) > 5 else None
        category = row[6] if len(row) > 6 else "c"
        data.append((user, item, "view", T0 + timedelta(seconds=seconds), value, category,
                     label, split))
    return spark.createDataFrame(data, SCHEMA).withColumn(TS_MICROS, F.unix_micros("ts"))


def fit_transform(op, events):
    op.fit(events.where(F.col("split") == "train"))
    return op.transform(events)


def test_categorify_ids_by_frequency_threshold_and_train_only(spark):
    rows = [("u", i, n, 0, "train") for n, i in enumerate("aaabbccd")]
    rows += [("u", "e", 100, 0, "valid")] + [("u", "z", 101 + n, 0, "valid") for n in range(9)]
    rows += [("u", None, 200, 0, "train")]
    op = Categorify(["item_id"], freq_threshold=2)
    out = fit_transform(op, frame(spark, rows))
    ids = {r["item_id"]: r["item_id_cat"] for r in out.select("item_id", "item_id_cat")
           .distinct().collect()}
    # a is most frequent; b and c tie and are ordered by value; d is below the threshold.
    assert ids == {"a": 2, "b": 3, "c": 4, "d": 1, "e": 1, "z": 1, None: 1}
    assert op.cardinality("item_id") == 5
    vocabulary = [tuple(r) for r in op.vocabularies["item_id"].orderBy("id").collect()]
    assert vocabulary == [("a", 2, 3), ("b", 3, 2), ("c", 4, 2)]


def _as_written(spark, op, folder):
    """``op``'s vocabularies as a run's output holds them (``load_previous``: Parquet read
    back, every column nullable): each column's (value, id) and (value, count)."""
    tables = {}
    for column, vocabulary in op.vocabularies.items():
        vocabulary.write.parquet(str(folder / column))
        tables[column] = spark.read.parquet(str(folder / column))
    return ({c: t.select("value", "id") for c, t in tables.items()},
            {c: t.select("value", "count") for c, t in tables.items()})


def test_categorify_counting_from_its_vocabulary_gives_the_counts_of_every_row(spark,
                                                                                tmp_path):
    """An extension told the extended vocabulary's counts and the rows they leave out
    numbers and counts as one fitted over every training row; not with a threshold."""
    first = frame(spark, [("u", i, n, 0, "train") for n, i in enumerate("aabc")])
    later = frame(spark, [("u", i, 10 + n, 0, "train") for n, i in enumerate("cdddbe")])
    base = Categorify(["item_id"])
    base.fit(first)
    previous, counts = _as_written(spark, base, tmp_path)
    whole, counted = Categorify(["item_id"]), Categorify(["item_id"])
    whole.extend(previous)
    whole.fit(first.unionByName(later))
    counted.extend(previous)
    assert counted.count_from(counts, later)
    counted.fit(first.limit(0))  # every row it counts is in the counts or the rows given
    vocabulary = lambda op: sorted(map(tuple, op.vocabularies["item_id"].collect()))  # noqa: E731
    assert vocabulary(counted) == vocabulary(whole) == [
        ("a", 2, 2), ("b", 3, 2), ("c", 4, 2), ("d", 5, 3), ("e", 6, 1)]
    assert counted.vocabularies["item_id"].schema == whole.vocabularies["item_id"].schema
    assert not Categorify(["item_id"], freq_threshold=2).count_from(counts, later)
    assert not Categorify(["item_id", "category"]).count_from(counts, later)


def test_categorify_counting_several_columns_at_once_numbers_as_each_column_alone(
        spark, tmp_path):
    """The counted fit numbers every column from one table: per column the ids, counts,
    sizes and versions of a fit over every row; ties by the column's own type (9 before
    10 for a long, "10" before "9" for a string); nulls uncounted."""
    schema = "item long, tag string"
    first = spark.createDataFrame([(1, "a"), (1, "a"), (2, None)], schema)
    later = spark.createDataFrame([(10, "10"), (9, "9"), (None, "a"), (2, "9"), (2, "10")],
                                  schema)
    base = Categorify(["item", "tag"])
    base.fit(first)
    previous, counts = _as_written(spark, base, tmp_path)
    whole, counted = Categorify(["item", "tag"]), Categorify(["item", "tag"])
    whole.extend(previous)
    whole.fit(first.unionByName(later))
    counted.extend(previous)
    assert counted.count_from(counts, later)
    counted.fit(first.limit(0))
    vocabulary = lambda op, c: sorted(map(tuple, op.vocabularies[c].collect()))  # noqa: E731
    assert vocabulary(counted, "item") == vocabulary(whole, "item") == [
        ("1", 2, 2), ("10", 5, 1), ("2", 3, 3), ("9", 4, 1)]
    assert vocabulary(counted, "tag") == vocabulary(whole, "tag") == [
        ("10", 3, 2), ("9", 4, 2), ("a", 2, 3)]
    assert counted.sizes == whole.sizes == {"item": 4, "tag": 3}
    assert counted.versions == whole.versions
    assert all(counted.vocabularies[c].schema == whole.vocabularies[c].schema
               for c in ("item", "tag"))
    assert not Categorify(["item", "tag"]).count_from(counts, later)  # nothing extended


@pytest.mark.parametrize("separator", [" ", "|", ", ", ".", "\\", "[x]", "a"])
def test_a_list_splits_alike_in_spark_and_at_a_request(spark, separator):
    """A separator is text, not a pattern; values are trimmed of spaces, empty ones left out:
    Spark's split for the events and Python's for a request agree."""
    texts = [separator.join(["Sci-Fi", " Film-Noir ", "", "Children's"]),
             f"{separator}a.b{separator}{separator}", "", " ", "one", "x|y.z\\w"]
    rows = spark.createDataFrame([(t,) for t in texts], "text string").select(
        list_values(F.col("text"), separator).alias("values")).collect()
    assert [row["values"] for row in rows] == [python_list_values(t, separator) for t in texts]
    if separator != "a":
        assert python_list_values(texts[0], separator) == ["Sci-Fi", "Film-Noir", "Children's"]


def test_a_list_column_numbers_its_values_counted_or_not(spark, tmp_path):
    """A list column's vocabulary numbers the values in its lists by their count; a kept
    width lets an extension count from the vocabulary and equal a fit over every row, and
    the stored lists holding a value numbered anew are found by their text."""
    schema = "item string, genres string"
    first = spark.createDataFrame([("1", "b|a"), ("2", "a"), ("3", None)], schema)
    later = spark.createDataFrame([("4", "c|a|c"), ("5", "b")], schema)
    base = Categorify(["item", "genres"], separators={"genres": "|"})
    base.fit(first)
    assert base.widths == {"genres": 2}
    assert sorted(map(tuple, base.vocabularies["genres"].collect())) == [
        ("a", 2, 2), ("b", 3, 1)]
    ids = {r["item"]: list(r["genres_cat"]) for r in base.transform(first).collect()}
    assert ids == {"1": [3, 2], "2": [2, 0], "3": [0, 0]}
    previous, counts = _as_written(spark, base, tmp_path)
    refused = Categorify(["item", "genres"], separators={"genres": "|"})
    refused.extend(previous)
    assert not refused.count_from(counts, later)  # its width needs every training row
    whole, counted = (Categorify(["item", "genres"], separators={"genres": "|"})
                      for _ in range(2))
    for op in (whole, counted):
        op.extend(previous)
        op.kept_widths = {"genres": 2}
    whole.fit(first.unionByName(later))
    assert counted.count_from(counts, later)
    counted.fit(first.limit(0))
    vocabulary = lambda op: sorted(map(tuple, op.vocabularies["genres"].collect()))  # noqa: E731
    assert vocabulary(counted) == vocabulary(whole) == [("a", 2, 3), ("b", 3, 2), ("c", 4, 2)]
    assert counted.widths == {"genres": 2}  # kept: a longer list is cut
    later_ids = {r["item"]: list(r["genres_cat"]) for r in counted.transform(later).collect()}
    assert later_ids == {"4": [4, 2], "5": [3, 0]}
    added = counted.added_lists("genres", first.unionByName(later))
    assert sorted(r["value"] for r in added.collect()) == ["c|a|c"]


def test_vocabularies_summarized_in_one_query_each_get_their_own_size_and_version(spark):
    """Several vocabularies' sizes and versions from one query are each one's own: the same
    pairs in another order, the same version; other pairs, another; none, size 0."""
    schema = "value string, id long, count long"
    tables = {"a": spark.createDataFrame([("x", 2, 5), ("y", 3, 1)], schema),
              "b": spark.createDataFrame([("y", 3, 1), ("x", 2, 9)], schema),
              "c": spark.createDataFrame([("x", 3, 5), ("y", 2, 1)], schema)}
    tables["empty"] = tables["a"].limit(0)
    together = summaries(tables)
    digest = tables["a"].agg(F.bit_xor(F.xxhash64("value", "id"))).collect()[0][0]
    assert together["a"] == together["b"] == (
        2, hashlib.sha256(f"2:{digest}".encode()).hexdigest()[:16])
    assert together["c"][0] == 2 and together["c"][1] != together["a"][1]
    assert together["empty"] == (0, hashlib.sha256(b"0:0").hexdigest()[:16])
    assert together == {name: summarize(table) for name, table in tables.items()}


def test_count_encode_uses_training_counts(spark):
    rows = [("u", "a", 1, 0, "train"), ("u", "a", 2, 0, "train"), ("u", "b", 3, 0, "train"),
            ("u", "a", 4, 0, "valid"), ("u", "q", 5, 0, "valid")]
    out = fit_transform(CountEncode(["item_id"]), frame(spark, rows))
    assert sorted((r["item_id"], r["item_id_count"]) for r in out.collect()) == [
        ("a", 2.0), ("a", 2.0), ("a", 2.0), ("b", 1.0), ("q", 0.0)]


def test_count_encode_shares_the_counts_categorify_cached(spark):
    rows = [("u", "a", 1, 0, "train"), ("u", "a", 2, 0, "train"), ("u", "b", 3, 0, "train"),
            ("u", None, 4, 0, "train"), ("u", "q", 5, 0, "valid")]
    events = frame(spark, rows)
    train = events.where(F.col("split") == "train")
    categorify, count_encode = Categorify(["item_id"]), CountEncode(["item_id"])
    categorify.fit(train)
    count_encode.fit(train)
    # One cached aggregate for both: count_encode kept nothing of its own.
    assert count_encode._kept == []
    assert len(categorify._kept) == 2  # the counts and the vocabulary
    counts = lambda: sorted((r["item_id"] or "", r["item_id_count"])  # noqa: E731
                            for r in count_encode.transform(events).collect())
    expected = [("", 0.0), ("a", 2.0), ("a", 2.0), ("b", 1.0), ("q", 0.0)]
    assert counts() == expected
    categorify.release()
    assert counts() == expected  # computed again once the owner freed it


def _expected_target_encoding(rows, folds, smoothing):
    """Plain-Python out-of-fold smoothed means, from the fold each row was assigned."""
    train = [r for r in rows if r["split"] == "train"]
    expected = {}
    for row in rows:
        # A training row sees the other folds; a validation row sees the whole split.
        others = [r for r in train if r[FOLD] != row[FOLD]] if row["split"] == "train" else train
        prior = sum(r["label"] for r in others) / len(others)
        same = [r for r in others if r["item_id"] == row["item_id"]]
        expected[row["_ts_us"]] = ((sum(r["label"] for r in same) + prior * smoothing)
                                   / (len(same) + smoothing))
    return expected


def test_target_encode_is_out_of_fold_and_smoothed(spark):
    labels = [1, 0, 1, 1, 0, 1, 0, 0, 1, 1, 0, 1]
    rows = [("u", "ab"[n % 2], n, y, "train") for n, y in enumerate(labels)]
    rows += [("u", "a", 50, 1, "valid"), ("u", "zz", 51, 0, "valid")]
    events = frame(spark, rows)
    op = TargetEncode(["item_id"], folds=3, smoothing=2.0)
    out = fit_transform(op, events)
    with_folds = events.withColumn(FOLD, fold_of_event(3)).collect()
    assert len({r[FOLD] for r in with_folds}) == 3
    expected = _expected_target_encoding(with_folds, 3, 2.0)
    got = {r["_ts_us"]: r["item_id_te"] for r in out.collect()}
    assert got == pytest.approx(expected)
    assert op.prior == pytest.approx(sum(labels) / len(labels))


def test_target_encode_priors_count_rows_without_a_value(spark):
    labels = [1, 0, 1, 1, 0, 1, 0, 0]
    rows = [("u", "a", n, y, "train") for n, y in enumerate(labels)]
    rows += [("u", None, 20, 1, "train"), ("u", None, 21, 1, "train"),
             ("u", None, 50, 0, "valid")]
    events = frame(spark, rows)
    op = TargetEncode(["item_id"], folds=2, smoothing=1.0)
    out = {r["_ts_us"]: r for r in fit_transform(op, events).collect()}
    assert op.prior == pytest.approx(6 / 10)
    train = [r for r in events.withColumn(FOLD, fold_of_event(2)).collect()
             if r["split"] == "train"]
    for row in train:
        others = [r for r in train if r[FOLD] != row[FOLD]]
        prior = sum(r["label"] for r in others) / len(others)
        assert op.fold_priors[row[FOLD]] == pytest.approx(prior)
        if row["item_id"] is None:  # no value: the fold's prior, nothing learned
            assert out[row["_ts_us"]]["item_id_te"] == pytest.approx(prior)
    valid = next(r for r in out.values() if r["split"] == "valid")
    assert valid["item_id_te"] == pytest.approx(op.prior)  # no value: the whole split's prior
    by_value = {r["item_id"]: (r["s"], r["n"]) for r in op.by_value["item_id"].collect()}
    assert by_value == {"a": (4.0, 8)}


def test_target_encode_never_sees_its_own_label(spark):
    labels = [1, 0, 1, 1, 0, 1, 0, 0, 1, 1]
    rows = [("u", "a", n, y, "train") for n, y in enumerate(labels)]
    flipped = list(rows)
    flipped[4] = ("u", "a", 4, 1, "train")
    encode = lambda rs: {r["_ts_us"]: r["item_id_te"] for r in fit_transform(  # noqa: E731
        TargetEncode(["item_id"], folds=4, smoothing=1.0), frame(spark, rs)).collect()}
    before, after = encode(rows), encode(flipped)
    row_4 = frame(spark, rows[4:5]).first()["_ts_us"]
    assert before[row_4] == after[row_4]
    assert any(before[k] != after[k] for k in before if k != row_4)


@pytest.fixture(params=["cpu frames", "gpu frames"])
def lag_frames(request, monkeypatch):
    """Each of lag_features' two formulations: the CPU's, and the one the RAPIDS Accelerator
    plans on the GPU (chosen here without the plugin, which cannot run on this machine)."""
    from featureline.etl.features import lag_features

    monkeypatch.setattr(lag_features, "plans_for_gpu", lambda spark: request.param == "gpu frames")


def test_lag_features_strictly_before(spark, lag_frames):
    # u1: items 5 and 7 at the same instant; (t, item) in seconds.
    rows = [("u1", "5", 0, 0, "train"), ("u1", "5", 10, 0, "train"), ("u1", "7", 10, 0, "train"),
            ("u1", "5", 3500, 0, "train"), ("u1", "9", 90000, 0, "train"),
            ("u2", "5", 10, 0, "train")]
    events = frame(spark, rows).withColumn("item_id_cat", F.col("item_id").cast("long"))
    out = LagFeatures(["1h", "24h", "7d"]).transform(events)
    got = sorted(((r["user_id"], r["_ts_us"] // 1_000_000, r["item_id"], r["user_secs_since_prev"],
                  r["user_events_1h"], r["user_events_24h"], r["user_events_7d"],
                  r["user_prev_item"], r["ui_secs_since_prev"], r["ui_events_1h"])
                  for r in out.collect()), key=lambda g: g[:3])
    base = min(g[1] for g in got)
    got = [(g[0], g[1] - base, *g[2:]) for g in got]
    assert got == [
        ("u1", 0, "5", None, 0.0, 0.0, 0.0, 0, None, 0.0),
        ("u1", 10, "5", 10.0, 1.0, 1.0, 1.0, 5, 10.0, 1.0),
        ("u1", 10, "7", 10.0, 1.0, 1.0, 1.0, 5, None, 0.0),
        ("u1", 3500, "5", 3490.0, 3.0, 3.0, 3.0, 7, 3490.0, 2.0),
        ("u1", 90000, "9", 86500.0, 0.0, 0.0, 4.0, 5, None, 0.0),
        ("u2", 10, "5", None, 0.0, 0.0, 0.0, 0, None, 0.0),
    ]


def test_a_tie_in_time_orders_items_as_text_like_the_engine(spark, lag_frames, history_path):
    """Items "10" and "9" at one instant: the previous item and the history's order are the
    engine's ``last`` / ``last_k`` order (the greater value as text: "9"), not the ids'."""
    rows = [("u", "10", 0, 0, "train"), ("u", "9", 0, 0, "train"), ("u", "4", 5, 0, "train")]
    events = frame(spark, rows).withColumn("item_id_cat", F.col("item_id").cast("long"))
    later = [r for r in LagFeatures(["1h"]).transform(events).collect() if r["item_id"] == "4"]
    assert later[0]["user_prev_item"] == 9
    history = {r["item_id"]: r["user_hist_items"] for r in History(k=3).transform(events).collect()}
    assert history["4"] == [9, 10, 0]


def test_lag_activity_is_the_aggregations_count_at_each_event(spark, lag_frames):
    """``<scope>_events_<w>`` is the aggregations' count over ``w`` at the event's time, by
    their rule of time (written from its definition in tests/aggregation_reference.py): the
    window's start rounds down to its hop, so an event 62 minutes back counts in ``1h`` until
    the next 5-minute boundary."""
    from tests.aggregation_reference import reference

    rng = np.random.default_rng(8)
    # Seconds after T0 (a Monday 00:00 UTC): on and a second around 5-minute, hour and day
    # boundaries, and in between; several events per instant.
    edges = [n * 300 + d for n in range(0, 12 * 24 * 8, 7) for d in (-1, 0, 1)]
    instants = [s for s in rng.choice(edges, 120, replace=False) if s >= 0]
    rows = [(f"u{rng.integers(3)}", str(rng.integers(1, 4)), int(rng.choice(instants)), 0,
             "train") for _ in range(300)]
    # 62 minutes and 58 minutes back from an hour plus 2 minutes.
    rows += [("w", "1", 0, 0, "train"), ("w", "1", 240, 0, "train"),
             ("w", "1", 3720, 0, "train")]
    events = frame(spark, rows).withColumn("item_id_cat", F.col("item_id").cast("long"))
    op = LagFeatures(["30m", "1h", "24h", "7d"])
    out = op.transform(events).collect()
    raw = [{"user_id": r["user_id"], "item_id": r["item_id"], "ts": r["_ts_us"]}
           for r in out]
    checked = 0
    for scope, keys in (("user", ("user_id",)), ("ui", ("user_id", "item_id"))):
        for output in op.activity_group(scope).outputs():
            for row in out:
                same_key = [e for e in raw if all(e[k] == row[k] for k in keys)]
                assert row[output.output] == reference(output, same_key, row["_ts_us"]), (
                    scope, output.output, row)
                checked += 1
    assert checked == len(out) * 8
    last = next(r for r in out if r["user_id"] == "w" and r["_ts_us"] == max(
        e["_ts_us"] for e in out if e["user_id"] == "w"))
    assert (last["user_events_30m"], last["user_events_1h"]) == (0.0, 2.0)


def test_lag_features_carry_the_users_label_history(spark, lag_frames):
    """Positives among the user's earlier events and their share; events at the same
    instant do not see each other's labels; the first event's share is missing."""
    from featureline.etl.features.lag_features import PRIOR_POSITIVE_RATE, PRIOR_POSITIVES

    # (user, item, t seconds, label, split); u1's two events at t=10 share an instant.
    rows = [("u1", "5", 0, 1, "train"), ("u1", "5", 10, 0, "train"), ("u1", "7", 10, 1, "train"),
            ("u1", "8", 50, 0, "train"), ("u1", "9", 90, 1, "valid"), ("u2", "5", 10, 1, "train")]
    events = frame(spark, rows).withColumn("item_id_cat", F.col("item_id").cast("long"))
    out = LagFeatures(["1h"]).transform(events)
    got = sorted((r["user_id"], r["_ts_us"] // 1_000_000, r["item_id"], r[PRIOR_POSITIVES],
                  r[PRIOR_POSITIVE_RATE]) for r in out.collect())
    base = min(g[1] for g in got)
    assert [(g[0], g[1] - base, *g[2:]) for g in got] == [
        ("u1", 0, "5", 0.0, None),
        ("u1", 10, "5", 1.0, 1.0),
        ("u1", 10, "7", 1.0, 1.0),
        ("u1", 50, "8", 2.0, 2 / 3),
        ("u1", 90, "9", 2.0, 0.5),
        ("u2", 10, "5", 0.0, None),
    ]


def test_lag_features_cpu_and_gpu_frames_agree_on_every_row(spark, monkeypatch):
    from featureline.etl.features import lag_features

    rng = np.random.default_rng(5)
    # Few instants, so that many events share one; gaps across every window's edge.
    instants = rng.choice(np.arange(0, 9 * 86400, 1800), size=40, replace=False)
    rows = [(f"u{rng.integers(4)}", str(rng.integers(1, 9)), int(rng.choice(instants)), 0,
             "train") for _ in range(400)]
    events = frame(spark, rows).withColumn("item_id_cat", F.col("item_id").cast("long"))
    op = LagFeatures(["1h", "24h", "7d"])
    results = {}
    for gpu in (False, True):
        monkeypatch.setattr(lag_features, "plans_for_gpu", lambda spark, gpu=gpu: gpu)
        results[gpu] = op.transform(events).cache()
    assert results[False].columns == results[True].columns
    assert results[False].exceptAll(results[True]).count() == 0
    assert results[True].exceptAll(results[False]).count() == 0
    assert results[True].where(F.col("user_events_7d") > 0).count() > 100


def test_an_incremental_window_gives_the_values_of_every_row(spark, lag_frames):
    """An incremental run hands lag_features and history the stored rows its events read —
    of each user's, its recent days (as far as the state's user rows say its windows and
    rows reach) and its kept pairs' earlier events; the older ones folded into counts per
    user (and per item of the run's pairs), a row per set of events no window of a kept row
    tells apart — and the kept rows get the values a run over every event gives them, in
    both formulations of the frames."""
    from featureline.etl.entities import entity_rows
    from featureline.etl.features.base import EVENTS, LABEL
    from featureline.etl.features.lag_features import PRIOR_POSITIVE_RATE, PRIOR_POSITIVES
    from featureline.etl.incremental import (
        CUT,
        KEEP,
        READ_FROM,
        ROWS_FROM,
        START,
        cuts,
        reach,
        users_events,
        window_context,
        window_rows,
        with_row_day,
    )

    rng = np.random.default_rng(11)
    # Three users over twelve days, several events an hour, few items (pairs come back), and
    # instants several events share; u2 has a handful only, a day apart (its rows reach
    # back past its windows: to its second one).
    instants = rng.choice(np.arange(0, 12 * 86400, 60), size=900, replace=False)
    rows = [(f"u{rng.integers(2)}", str(rng.integers(1, 26)), int(rng.choice(instants)),
             int(rng.integers(2)), "train") for _ in range(2000)]
    rows += [("u2", str(i % 2 + 1), 86400 * i + 7, i % 2, "train") for i in range(1, 9)]
    rows += [("u2", "1", 86400 * 11 + 3600 * i, 1, "train") for i in (1, 2)]
    events = frame(spark, rows).select("user_id", "item_id", "ts", LABEL, TS_MICROS)
    # Where each user's kept rows start: day 11 at these hours (µs since the epoch, UTC).
    epoch = datetime(1970, 1, 1)
    starts = spark.createDataFrame(
        [(user, (T0 + timedelta(days=11, hours=hours) - epoch) // timedelta(microseconds=1))
         for user, hours in (("u0", 3.5), ("u1", 9.25), ("u2", 0))],
        f"user_id string, {START} long")
    ops = [LagFeatures(["1h", "24h", "7d"]), History(3)]
    lookback = ops[0].lookback() | ops[1].lookback()

    def featured(rows):
        rows = rows.withColumn("item_id_cat", F.coalesce(F.col("item_id").cast("long"), F.lit(1)))
        for op in ops:
            rows = op.transform(rows)
        return rows

    outputs = ["user_secs_since_prev", "user_events_1h", "user_events_24h", "user_events_7d",
               "user_prev_item", "ui_secs_since_prev", "ui_events_1h", "ui_events_24h",
               "ui_events_7d", PRIOR_POSITIVES, PRIOR_POSITIVE_RATE, "user_hist_items"]
    marked = events.join(starts, "user_id")
    kept = marked.where(F.col(TS_MICROS) >= F.col(START)).drop(START)
    earlier = marked.where(F.col(TS_MICROS) < F.col(START)).drop(START)
    stored = earlier.select("user_id", TS_MICROS, "item_id", LABEL)
    bounds = reach(with_row_day(entity_rows(earlier, "user", 7)), starts, lookback).cache()
    pairs = kept.select("user_id", "item_id").distinct()
    theirs = users_events(stored, bounds, pairs, broadcast=True).cache()
    # The reach leaves events out — of every user's days before its windows, those of the
    # pairs its kept rows do not hold (u2's first: its rows reach its second) — and keeps
    # the kept pairs' earlier ones.
    assert theirs.count() < stored.count()
    left_out = stored.exceptAll(theirs).join(bounds, "user_id")
    assert left_out.where(F.col(TS_MICROS) >= F.col(READ_FROM)).count() == 0
    assert {row["user_id"] for row in left_out.collect()} == {"u0", "u1", "u2"}
    # Before the reach, of each kept pair only the events of its latest instant there.
    def before_reach(rows):
        return (rows.join(bounds, "user_id").where(F.col(TS_MICROS) < F.col(READ_FROM))
                .select("user_id", "item_id", TS_MICROS, LABEL))

    pairs_before = before_reach(stored).join(pairs, ["user_id", "item_id"], "left_semi")
    latest = (pairs_before.groupBy("user_id", "item_id")
              .agg(F.max(TS_MICROS).alias(TS_MICROS)))
    want_before = pairs_before.join(latest, ["user_id", "item_id", TS_MICROS], "left_semi")
    assert before_reach(theirs).exceptAll(want_before).count() == 0
    assert want_before.exceptAll(before_reach(theirs)).count() == 0
    assert 0 < latest.count() < pairs_before.count()
    cut = cuts(theirs, bounds, lookback).cache()
    context = window_context(theirs, kept, cut, lookback, broadcast=True).cache()
    got = featured(window_rows(context, kept, cut, lookback)).where(F.col(KEEP))
    want = featured(events).join(kept.select("user_id", TS_MICROS, "item_id"),
                                 ["user_id", TS_MICROS, "item_id"], "left_semi")
    columns = ["user_id", TS_MICROS, "item_id", LABEL, *outputs]
    assert got.count() == want.count() == kept.count() > 100
    assert got.select(*columns).exceptAll(want.select(*columns)).count() == 0
    assert want.select(*columns).exceptAll(got.select(*columns)).count() == 0
    # The older stored events were folded: fewer rows than events, some standing for several.
    handed = context.agg(F.count(F.lit(1)), F.sum(EVENTS), F.max(EVENTS)).first()
    read = stored.join(cut, "user_id").where(F.col(TS_MICROS) >= F.col(CUT)).count()
    assert handed[0] < 0.8 * read and handed[1] >= read and handed[2] >= 3
    # Fewer rows than hours: the events every kept row's windows hold or leave alike (the
    # 7 d window's days before the day's 24 h windows start) are one row per user and pair.
    hourly = (stored.join(cut, "user_id").where(F.col(TS_MICROS) >= F.col(CUT))
              .join(pairs.withColumn("_pair", F.lit(True)), ["user_id", "item_id"], "left")
              .select("user_id", F.when(F.col("_pair"), F.col("item_id")).alias("_item"),
                      F.when(F.col(TS_MICROS) < F.col(ROWS_FROM), F.floor(
                          F.col(TS_MICROS) / (3600 * MICROS))).alias("_hour"),
                      F.when(F.col(TS_MICROS) >= F.col(ROWS_FROM), F.col(TS_MICROS)))
              .distinct().count())
    assert handed[0] < 0.7 * hourly


@pytest.fixture(params=["offset lookups", "sliding frame"])
def history_path(request, monkeypatch):
    """Each of history's two ways to read the earlier items (by K)."""
    from featureline.etl.features import history

    monkeypatch.setattr(history, "OFFSET_LOOKUPS_UP_TO_K",
                        1000 if request.param == "offset lookups" else 0)


def test_history_last_k_items_before_the_event(spark, history_path):
    rows = [("u", "2", 0, 0, "train"), ("u", "3", 1, 0, "train"), ("u", "4", 1, 0, "train"),
            ("u", "5", 2, 0, "train"), ("u", "6", 3, 0, "train"), ("v", "9", 0, 0, "train")]
    events = frame(spark, rows).withColumn("item_id_cat", F.col("item_id").cast("long"))
    out = History(k=3).transform(events)
    got = {(r["user_id"], r["item_id"]): r["user_hist_items"] for r in out.collect()}
    assert got == {("u", "2"): [0, 0, 0], ("u", "3"): [2, 0, 0], ("u", "4"): [2, 0, 0],
                   ("u", "5"): [4, 3, 2], ("u", "6"): [5, 4, 3], ("v", "9"): [0, 0, 0]}



def test_history_when_more_than_2k_events_share_an_instant(spark, history_path):
    # k=3 reads the 6 rows before an event: the 7th to 9th rows at one instant skip all 6
    # and still get a full row of padding; the next instant sees the latest 3 in item order.
    rows = [("w", str(item), 0, 0, "train") for item in range(1, 10)]
    rows.append(("w", "12", 1, 0, "train"))
    events = frame(spark, rows).withColumn("item_id_cat", F.col("item_id").cast("long"))
    got = {r["item_id"]: r["user_hist_items"] for r in History(k=3).transform(events).collect()}
    assert got == {**{str(item): [0, 0, 0] for item in range(1, 10)}, "12": [9, 8, 7]}

def test_cyclic_time(spark):
    rows = [("u", "a", 6 * 3600, 0, "train"), ("u", "b", 5 * 86400 + 18 * 3600, 0, "train")]
    out = {r["item_id"]: r for r in CyclicTime().transform(frame(spark, rows)).collect()}
    assert out["a"]["hour_sin"] == pytest.approx(1.0)
    assert out["a"]["hour_cos"] == pytest.approx(0.0, abs=1e-12)
    assert (out["a"]["dow_sin"], out["a"]["dow_cos"]) == pytest.approx((0.0, 1.0))
    assert out["b"]["hour_sin"] == pytest.approx(-1.0)  # 18:00
    assert out["b"]["dow_sin"] == pytest.approx(math.sin(2 * math.pi * 5 / 7))  # Saturday


def _spark_xxhash64(*values: str) -> int:
    seed = 42
    for value in values:
        seed = xxhash.xxh64_intdigest(value.encode(), seed=seed)
    return seed - (1 << 64) if seed >= 1 << 63 else seed


def test_hashed_cross_matches_an_independent_xxhash64(spark):
    rows = [("u1", "a", 0, 0, "train", None, "c1"), ("u2", "b", 1, 0, "train", None, "c2")]
    out = HashedCross([["user_id", "category"]], buckets=1000).transform(frame(spark, rows))
    got = {r["user_id"]: r["user_id_x_category"] for r in out.collect()}
    assert got == {u: _spark_xxhash64(u, c) % 1000 + 2 for u, c in (("u1", "c1"), ("u2", "c2"))}


def test_normalize_fill_log1p_and_standardise(spark):
    rows = [("u", "a", 0, 0, "train", 1.0), ("u", "b", 1, 0, "train", 3.0),
            ("u", "c", 2, 0, "train", None), ("u", "d", 3, 0, "valid", 7.0)]
    plain = {r["item_id"]: r["value_norm"] for r in
             fit_transform(Normalize(["value"], "mean", log1p=False), frame(spark, rows))
             .collect()}
    std = math.sqrt(2 / 3)  # of 1, 3 and the filled 2
    assert plain == pytest.approx({"a": -1 / std, "b": 1 / std, "c": 0.0, "d": 5 / std})
    logged = {r["item_id"]: r["value_norm"] for r in
              fit_transform(Normalize(["value"], "zero", log1p=True), frame(spark, rows))
              .collect()}
    xs = [math.log1p(1.0), math.log1p(3.0), 0.0]
    mean = sum(xs) / 3
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / 3)
    assert logged["d"] == pytest.approx((math.log1p(7.0) - mean) / sd)


MODEL_READY_SPECS = [
    FeatureSpec("n", "continuous", "float32", transform_hint="log1p_standardize"),
    FeatureSpec("r", "continuous", "float32"),  # standardize, the default
    FeatureSpec("s", "continuous", "float32", transform_hint="none"),
    FeatureSpec("gap", "continuous", "float32", transform_hint="log1p_standardize",
                missing=True),
]


def _model_ready(spark, rows, config=None):
    """rows: (split, n, r, s, gap); the frame transformed, by row, and the fitted step."""
    frame_ = spark.createDataFrame(
        [(i, *row) for i, row in enumerate(rows)],
        "id int, split string, n double, r double, s double, gap double")
    step = ModelReady(MODEL_READY_SPECS, config or ModelReadyConfig())
    step.fit(frame_.where(F.col("split") == "train"))
    return {r["id"]: r for r in step.transform(frame_).collect()}, step


def test_model_ready_transforms_with_training_statistics_only(spark):
    train = [("train", 0.0, 0.2, 5.0, None), ("train", 3.0, 0.4, -2.0, 10.0),
             ("train", 99.0, 0.9, 7.0, 1000.0)]
    out, step = _model_ready(spark, [*train, ("valid", 1e6, 0.5, 1.0, None)])
    # Hand-computed, over the three training rows only (population standard deviation).
    logs = [math.log1p(0.0), math.log1p(3.0), math.log1p(99.0)]
    mean = sum(logs) / 3
    std = math.sqrt(sum((x - mean) ** 2 for x in logs) / 3)
    assert out[1]["n"] == pytest.approx((math.log1p(3.0) - mean) / std)
    assert out[3]["n"] == pytest.approx((math.log1p(1e6) - mean) / std)  # valid: train stats
    r_mean, r_std = 0.5, math.sqrt(((0.3 ** 2) + (0.1 ** 2) + (0.4 ** 2)) / 3)
    assert out[0]["r"] == pytest.approx((0.2 - r_mean) / r_std)
    assert [out[i]["s"] for i in range(4)] == [5.0, -2.0, 7.0, 1.0]  # none: as it was
    # A missing value: the training mean (0 once standardised), and the indicator says so.
    gap_logs = [math.log1p(10.0), math.log1p(1000.0)]
    gap_mean = sum(gap_logs) / 2
    gap_std = abs(gap_logs[1] - gap_logs[0]) / 2
    assert [out[i]["gap"] for i in range(4)] == pytest.approx(
        [0.0, (gap_logs[0] - gap_mean) / gap_std, (gap_logs[1] - gap_mean) / gap_std, 0.0])
    assert [out[i]["gap_missing"] for i in range(4)] == [1.0, 0.0, 0.0, 1.0]
    assert step.stats["gap"]["missing_in_train"] == 1
    # No leakage: the validation row's value moves no statistic.
    _, other = _model_ready(spark, [*train, ("valid", 5.0, -40.0, 1.0, 3.0)])
    assert other.stats == step.stats
    # Serving's NumPy transform gives the same numbers from the raw values and metadata.
    raw = np.array([0.0, 3.0, 99.0, 1e6])
    np.testing.assert_allclose(apply_transform(raw, step.stats["n"]),
                               [out[i]["n"] for i in range(4)], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(apply_transform([np.nan, 10.0, 1000.0, None], step.stats["gap"]),
                               [out[i]["gap"] for i in range(4)], rtol=1e-6, atol=1e-6)


def test_model_ready_is_configurable_per_feature(spark):
    rows = [("train", 1.0, 0.0, 0.0, None), ("train", 3.0, 2.0, 0.0, 4.0)]
    out, step = _model_ready(spark, rows, ModelReadyConfig(transforms={"n": "none",
                                                                       "s": "standardize"}))
    assert (out[0]["n"], out[1]["n"]) == (1.0, 3.0)
    assert step.stats["s"] == {"name": "standardize", "mean": 0.0, "std": 1.0,
                               "missing_in_train": 0}  # constant: std 1, not a division by 0
    specs = step.features(MODEL_READY_SPECS)
    assert [s.name for s in specs] == ["n", "r", "s", "gap", "gap_missing"]
    assert specs[4].transform == {"name": "missing_indicator", "of": "gap"}
    # Switched off: raw values, missing ones 0, the indicator still there.
    out, _ = _model_ready(spark, rows, ModelReadyConfig(enabled=False))
    assert (out[0]["n"], out[1]["r"], out[0]["gap"], out[0]["gap_missing"]) == (1.0, 2.0, 0.0, 1.0)
    with pytest.raises(ConfigError, match=r"etl\.model_ready\.transforms\.nope"):
        ModelReady(MODEL_READY_SPECS, ModelReadyConfig(transforms={"nope": "none"}))


def _plan(frame_) -> str:
    return frame_._jdf.queryExecution().executedPlan().toString()


def test_feature_plans_have_no_row_at_a_time_python(spark):
    rows = [("u", i, n, n % 2, "train" if n < 8 else "valid", float(n), "c") for n, i in
            enumerate("abcabcabcab")]
    events = frame(spark, rows).drop(TS_MICROS).withColumn("price", F.lit(1.0)).withColumn(
        "device", F.lit("d"))
    featured = FeaturePipeline(EtlConfig()).fit_transform(events)
    featured.collect()
    plan = _plan(featured)
    assert "Window" in plan
    for python_node in ("BatchEvalPython", "ArrowEvalPython", "PythonUDF"):
        assert python_node not in plan
    # The check can fail: a Python UDF does show up as BatchEvalPython.
    with_udf = events.withColumn("x", F.udf(lambda s: s, "string")("user_id"))
    assert "BatchEvalPython" in _plan(with_udf)


def test_epoch_micros_equals_unix_micros(spark):
    """The GPU-friendly microsecond key agrees with Spark's unix_micros to the microsecond."""
    rng = np.random.default_rng(3)
    micros = np.concatenate([
        rng.integers(946_684_800_000_000, 4_102_444_799_999_999, 5000),  # 2000..2100
        [946_684_800_000_000, 1_767_607_200_000_001, 1_767_607_200_999_999,
         4_102_444_799_999_999]])
    frame = spark.createDataFrame([(int(m),) for m in micros], "us long").select(
        F.timestamp_micros("us").alias("ts"))
    rows = frame.select(F.unix_micros("ts").alias("spark"),
                        epoch_micros(F.col("ts")).alias("ours")).collect()
    assert [r["ours"] for r in rows] == [r["spark"] for r in rows] == [int(m) for m in micros]
