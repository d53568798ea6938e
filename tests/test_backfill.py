"""The Spark backfill (etl/aggregations.py) against the brute-force reference: every
operation × window of the reference spec, at every event's own time and at times between,
on seeded random logs of several keys with ties exactly at hop and window boundaries and
events at one instant; a group keyed by two columns."""

from __future__ import annotations

import random

import pytest
from pyspark.sql import functions as F
from pyspark.sql import types as T

from featureline.core.aggregations import GroupSpec
from featureline.etl.aggregations import (
    DAY,
    backfill,
    day_partials,
    group_values,
    on_days,
)
from featureline.etl.features.base import TS_MICROS
from tests.aggregation_reference import LABEL, MICROS, ORIGIN, OUTPUTS, SPEC, reference, same_value

EVENT_SCHEMA = T.StructType([
    T.StructField("user_id", T.StringType()), T.StructField("item_id", T.StringType()),
    T.StructField("event_type", T.StringType()), T.StructField(TS_MICROS, T.LongType()),
    T.StructField("value", T.DoubleType()), T.StructField("price", T.DoubleType()),
    T.StructField("category", T.StringType()), T.StructField("label", T.LongType())])
NUMERIC = ["value", "price"]


def _log(seed: int, events: int = 160) -> list[dict]:
    """Events of 3 users over 9 days: a third on 5-minute boundaries (and 1 µs either side),
    some repeated at one instant."""
    rng = random.Random(seed)
    log = []
    for _ in range(events):
        if rng.random() < 0.35:
            ts = ORIGIN + rng.randrange(9 * 288) * 300 * MICROS + rng.choice([-1, 0, 1])
        else:
            ts = ORIGIN + rng.randrange(9 * 86_400 * MICROS)
        event = {"user_id": rng.choice(["u1", "u2", "u3"]),
                 "item_id": f"i{rng.randrange(8)}",
                 "event_type": rng.choice(["view", "view", "click", "purchase"]),
                 TS_MICROS: ts, "value": rng.choice([None, 0.5, 1.0, 2.0, -3.0]),
                 "price": rng.choice([None, 1.25, 9.5, 100.0]),
                 "category": rng.choice([None, "c1", "c2", "c3"])}
        log.append(event)
        if rng.random() < 0.1:
            log.append(dict(event, item_id=f"i{rng.randrange(8)}"))  # the same instant
    return [dict(e, label=int(LABEL(e))) for e in log]


def _as_reference(event: dict) -> dict:
    return {**event, "ts": event[TS_MICROS]}


def _check(rows, log, group, outputs=None):
    """Every output of ``group`` (keyed by user_id; ``outputs``: those only) in ``rows``
    equals the brute-force reference at the row's time."""
    by_user: dict[str, list[dict]] = {}
    for event in log:
        by_user.setdefault(event["user_id"], []).append(_as_reference(event))
    differ = []
    for row in rows:
        own = by_user.get(row["user_id"], [])
        for feature in group.outputs() if outputs is None else outputs:
            expected = reference(feature, own, row[TS_MICROS])
            got = row[feature.column_name]
            if not same_value(feature, got, expected):
                differ.append((feature.output, row["user_id"], row[TS_MICROS] - ORIGIN, got,
                               expected))
    assert differ == [], differ[:10]


def test_backfill_equals_the_definition_at_every_time(spark):
    seed = 1
    log = _log(seed, events=400)
    rng = random.Random(seed)
    queries = [{"user_id": e["user_id"], TS_MICROS: e[TS_MICROS]} for e in log]
    # Between events, on boundaries, long after the last event (decayed), before the first.
    queries += [{"user_id": u, TS_MICROS: ORIGIN + rng.randrange(-86_400, 12 * 86_400) * MICROS}
                for u in ("u1", "u2", "u3", "u4") for _ in range(8)]
    events = spark.createDataFrame(log, EVENT_SCHEMA)
    frame = spark.createDataFrame(queries, "user_id string, _ts_us long")
    rows = backfill(events, frame, [SPEC], NUMERIC).collect()
    assert len(rows) == len(queries)
    _check(rows, log, SPEC)


def test_a_group_keyed_by_two_columns(spark):
    group = GroupSpec.model_validate({
        "name": "user_category", "keys": ["user_id", "category"],
        "features": [{"op": "count", "windows": ["1d"]}, {"op": "sum", "column": "value"}]})
    log = [e for e in _log(3) if e["category"] is not None]
    events = spark.createDataFrame(log, EVENT_SCHEMA)
    queries = spark.createDataFrame(
        [{"user_id": e["user_id"], "category": e["category"], TS_MICROS: e[TS_MICROS]}
         for e in log], "user_id string, category string, _ts_us long")
    rows = backfill(events, queries, [group], NUMERIC).collect()
    for row in rows:
        own = [_as_reference(e) for e in log
               if (e["user_id"], e["category"]) == (row["user_id"], row["category"])]
        for feature in group.outputs():
            expected = reference(feature, own, row[TS_MICROS])
            assert same_value(feature, row[feature.column_name], expected), (feature.output, row)


# Windows whole days long, or hops an hour divides (a 30-day window hops a day, one of
# 1 day 4 hours): at aligned anchors, folded or tiled.
ALIGNED = GroupSpec.model_validate({"name": "user_activity", "keys": ["user_id"], "features": [
    {"op": "count", "windows": ["1d", "7d", "30d", "all"]},
    {"op": "count", "name": "purchases", "filter": "event_type in (purchase)", "windows": ["2d"]},
    {"op": "sum", "column": "value", "windows": ["7d", "all"]},
    {"op": "mean", "column": "price", "windows": ["30d"]},
    {"op": "min", "column": "price", "windows": ["1d"]},
    {"op": "max", "column": "value", "windows": ["1d"], "hop": "4h"},
    {"op": "last", "column": "category"},
]})
HOUR = 3_600 * MICROS


def test_events_folded_per_aligned_span_give_the_definition_at_aligned_anchors(spark):
    log = _log(5, events=300)
    events = spark.createDataFrame(log, EVENT_SCHEMA)
    # No anchors: the midnight after each day a user had events (the entity tables').
    rows = group_values(events, None, ALIGNED, NUMERIC, aligned=DAY).collect()
    assert sorted((r["user_id"], r[TS_MICROS]) for r in rows) == sorted(
        {(e["user_id"], (e[TS_MICROS] // DAY + 1) * DAY) for e in log})
    _check(rows, log, ALIGNED)
    # Anchors on hours, some long after the last event: a day's hop is tiled from the
    # folded hours, a 4 hours' too.
    rng = random.Random(5)
    anchors = spark.createDataFrame(
        [{"user_id": u, TS_MICROS: ORIGIN + rng.randrange(-24, 40 * 24) * HOUR}
         for u in ("u1", "u2", "u3", "u4") for _ in range(25)],
        "user_id string, _ts_us long").distinct()
    rows = group_values(events, anchors, ALIGNED, NUMERIC, aligned=HOUR).collect()
    assert len(rows) == anchors.count()
    _check(rows, log, ALIGNED)
    # A 30-minute window's start falls inside an aligned hour: refused, naming it.
    with pytest.raises(ValueError, match="user_activity:count_30m: anchors aligned"):
        group_values(events, anchors, SPEC, NUMERIC, aligned=HOUR)


def test_approx_distinct_registers_and_estimate_equal_the_engines(spark):
    """10,000 distinct values: Spark's registers give the engine's estimate to the unit, and
    it is within 2 % of the truth."""
    from featureline.core.aggregations import fold
    from featureline.core.operations import ApproxDistinct

    group = GroupSpec.model_validate({"name": "g", "keys": ["user_id"], "features": [
        {"op": "approx_distinct", "column": "item_id"}]})
    values = [f"item-{n}" for n in range(10_000)]
    # Every value twice, one microsecond apart, all before the query.
    events = spark.range(20_000).select(
        F.lit("u1").alias("user_id"), F.format_string("item-%d", F.col("id") % 10_000)
        .alias("item_id"), F.lit("view").alias("event_type"),
        (F.lit(ORIGIN) + F.col("id")).alias(TS_MICROS), F.lit(None).cast("double").alias("value"),
        F.lit(None).cast("double").alias("price"), F.lit(None).cast("string").alias("category"),
        F.lit(0).cast("long").alias("label"))
    queries = spark.createDataFrame([("u1", ORIGIN + 20_000)], "user_id string, _ts_us long")
    (row,) = backfill(events, queries, [group], NUMERIC).collect()
    operation = ApproxDistinct()
    engine = operation.finish(fold(operation, ((ORIGIN, v) for v in values)))
    assert row["g__item_id_approx_distinct"] == engine
    assert abs(engine - 10_000) / 10_000 <= 0.02


def test_tiles_at_the_cut_give_the_definition_at_any_later_time(spark):
    """The batch's tiles as of its last event (what the online store starts from), merged at
    request times from the cut to weeks after it: the reference's values, an idle key's
    decay included; a key without events reads each operation's value of no events."""
    from featureline.etl.aggregations import output_tiles
    from featureline.feature_store.tiles import OutputTiles, key_tiles

    log = _log(2, events=300)
    cut = max(e[TS_MICROS] for e in log) + 1
    events = spark.createDataFrame(log, EVENT_SCHEMA)
    served = OutputTiles(cut)
    for feature, frame in output_tiles(events, SPEC, NUMERIC, cut):
        served.features[feature.qualified] = feature
        served.by_output[feature.qualified] = key_tiles(
            feature, [row.asDict() for row in frame.collect()])
    assert set(served.features) == {f.qualified for f in OUTPUTS}
    # The horizon: no tile older than a window can reach at the cut.
    count_1h = served.by_output["user_activity:count_1h"]
    assert min(t for tiles in count_1h.values() for t in tiles) >= cut - 3900 * MICROS
    rng = random.Random(2)
    hour = 3600 * MICROS
    later = [0, 1, 299 * MICROS, hour - 1, hour, hour + 300 * MICROS, 86_400 * MICROS,
             3 * 86_400 * MICROS, 8 * 86_400 * MICROS, 40 * 86_400 * MICROS]
    later += [rng.randrange(10 * 86_400 * MICROS) for _ in range(6)]
    by_user: dict[str, list[dict]] = {}
    for event in log:
        by_user.setdefault(event["user_id"], []).append(_as_reference(event))
    differ = []
    for user in ("u1", "u2", "u3", "u4"):
        for offset in later:
            values = served.values_at("user_activity", [user], cut + offset)
            for feature in OUTPUTS:
                expected = reference(feature, by_user.get(user, []), cut + offset)
                if not same_value(feature, values[feature.output], expected):
                    differ.append((feature.output, user, offset, values[feature.output],
                                   expected))
    assert differ == [], differ[:10]
    # Decayed: an hour and a hop after the last event, the 1h count of every user reads 0.
    decayed = served.values_at("user_activity", ["u1"], cut + hour + 300 * MICROS)
    assert decayed["count_1h"] == 0 and decayed["positives_all"] > 0
    with pytest.raises(ValueError, match="before the tiles' cut"):
        served.values_at("user_activity", ["u1"], cut - 1)


def test_the_job_joins_every_groups_values_onto_its_events(spark):
    """The job's op (``etl/features/aggregate.py``) puts each group's values beside every
    event — several events at one (user, item, instant) included — from one join on the
    user, the item and every group's keys: a user group's values on every event, a
    [user_id, category] group's where the event has a category and none (missing) where
    it has not, while the user group's values of those events stay."""
    from featureline.etl.features.aggregate import Aggregations

    user = GroupSpec.model_validate({
        "name": "user_activity", "keys": ["user_id"],
        "features": [{"op": "count", "windows": ["1d"]}, {"op": "sum", "column": "value"}]})
    pair = GroupSpec.model_validate({
        "name": "user_category", "keys": ["user_id", "category"],
        "features": [{"op": "count", "windows": ["1d"]}]})
    log = _log(4)
    log += [dict(e, value=7.0) for e in log[::40]]  # another event at one (user, item, ts)
    assert any(e["category"] is None for e in log)
    assert len({(e["user_id"], e["item_id"], e[TS_MICROS]) for e in log}) < len(log)
    op = Aggregations([user, pair], NUMERIC, [])
    rows = op.transform(spark.createDataFrame(log, EVENT_SCHEMA)).collect()
    op.release()
    assert sorted((r["user_id"], r["item_id"], r[TS_MICROS]) for r in rows) == sorted(
        (e["user_id"], e["item_id"], e[TS_MICROS]) for e in log)
    differ = []
    for row in rows:
        for group in (user, pair):
            key = tuple(row[k] for k in group.keys)
            own = [_as_reference(e) for e in log if tuple(e[k] for k in group.keys) == key]
            for feature in group.outputs():
                expected = None if None in key else reference(feature, own, row[TS_MICROS])
                got = row[feature.column_name]
                if not (got is None if expected is None else same_value(feature, got, expected)):
                    differ.append((feature.qualified, key, row[TS_MICROS] - ORIGIN, got,
                                   expected))
    assert differ == [], differ[:10]


def test_rows_standing_for_equal_events_give_the_events_values(spark):
    """A row with ``WEIGHT`` n stands for n equal events (the entity tables read a day's
    events so): every operation but last_k gives the events' values from it — at events'
    times, at aligned anchors, in the tiles and the lifetime partials; last_k refuses it."""
    from featureline.etl.aggregations import WEIGHT, lifetime, output_tiles

    rng = random.Random(11)
    log = [event for event in _log(11, events=200) for _ in range(rng.choice([1, 1, 2, 3]))]
    events = spark.createDataFrame(log, EVENT_SCHEMA)
    weighted = events.groupBy(*events.columns).agg(F.count(F.lit(1)).alias(WEIGHT))
    assert weighted.count() < len(log)
    group = SPEC.model_copy(update={"features": [f for f in SPEC.features if f.op != "last_k"]})
    anchors = spark.createDataFrame(
        sorted({(e["user_id"], e[TS_MICROS] + d) for e in log[::3] for d in (0, 1, DAY)}),
        "user_id string, _ts_us long")
    _check(group_values(weighted, anchors, group, NUMERIC).collect(), log, group)
    _check(group_values(weighted, None, ALIGNED, NUMERIC, aligned=DAY).collect(), log, ALIGNED)
    cut = max(e[TS_MICROS] for e in log) + 1
    for (feature, tiles), (_, expected) in zip(output_tiles(weighted, group, NUMERIC, cut),
                                               output_tiles(events, group, NUMERIC, cut),
                                               strict=True):
        assert sorted(map(str, tiles.collect())) == sorted(map(str, expected.collect())), \
            feature.output
    additive = GroupSpec.model_validate({"name": "g", "keys": ["user_id"], "features": [
        {"op": "count"}, {"op": "sum", "column": "value"}, {"op": "mean", "column": "price"},
        {"op": "max", "column": "value"}]})
    before = ORIGIN + 5 * DAY
    assert sorted(map(str, lifetime(weighted, additive, NUMERIC, before).frame.collect())) == \
        sorted(map(str, lifetime(events, additive, NUMERIC, before).frame.collect()))
    with pytest.raises(ValueError, match="last_k reads every event"):
        group_values(weighted, anchors, SPEC, NUMERIC)
    with pytest.raises(ValueError, match="last_k reads every event"):
        output_tiles(weighted, SPEC, NUMERIC, cut)


# Windows that start at midnights (a hop of whole days, the lifetime) and one that does not.
ON_DAYS = GroupSpec.model_validate({"name": "user_days", "keys": ["user_id"], "features": [
    {"op": "count", "windows": ["30d", "all"]},
    {"op": "count", "name": "purchases", "filter": "event_type in (purchase)",
     "windows": ["30d"]},
    {"op": "sum", "column": "value", "windows": ["all"]},
    {"op": "mean", "column": "price", "windows": ["30d"]},
    {"op": "max", "column": "value", "windows": ["14d"], "hop": "2d"},
    {"op": "count", "windows": ["1d"]},
]})


def test_the_days_partials_and_the_later_events_give_the_definition_after_them(spark):
    """A day's run's plan for the outputs on days: the partials of the days before a
    midnight (one row per key and day) and the events from it on give each output's value
    at times from it on — exits, the lifetime's frame, whole hops (of 2 days: one starting
    the day before) — as the events alone do."""
    log = _log(7, events=300)
    events = spark.createDataFrame(log, EVENT_SCHEMA)
    since = ORIGIN + 5 * DAY
    on = [feature for feature in ON_DAYS.outputs() if on_days(feature)]
    assert [f.output for f in ON_DAYS.outputs() if f not in on] == ["count_1d"]
    days = day_partials(events.where(F.col(TS_MICROS) < since), ON_DAYS, NUMERIC)
    assert days is not None
    assert days.count() == len({(e["user_id"], e[TS_MICROS] // DAY) for e in log
                                if e[TS_MICROS] < since})
    rng = random.Random(7)
    anchors = spark.createDataFrame(sorted(
        {(e["user_id"], e[TS_MICROS]) for e in log if e[TS_MICROS] >= since}
        | {(u, since + rng.randrange(0, 40 * 24) * 3_600 * MICROS + rng.choice([0, 1]))
           for u in ("u1", "u2", "u3", "u4") for _ in range(20)}),
        "user_id string, _ts_us long")
    later = events.where(F.col(TS_MICROS) >= since)
    rows = group_values(later, anchors, ON_DAYS, NUMERIC, outputs=on, days=days).collect()
    assert len(rows) == anchors.count()
    _check(rows, log, ON_DAYS, on)
    with pytest.raises(ValueError, match="outputs on days only"):
        group_values(later, anchors, ON_DAYS, NUMERIC, days=days)
    # The online tiles after the last event: from every day's partials as from the events.
    from featureline.etl.aggregations import output_tiles

    cut = max(e[TS_MICROS] for e in log) + 1
    every_day = day_partials(events, ON_DAYS, NUMERIC)
    for (feature, tiles), (_, expected) in zip(
            output_tiles(events, ON_DAYS, NUMERIC, cut, days=every_day),
            output_tiles(events, ON_DAYS, NUMERIC, cut), strict=True):
        assert sorted(map(str, tiles.collect())) == sorted(map(str, expected.collect())), \
            feature.output


# Variance of values far from 0: a double column (frames of tiles and the anchor's hop, the
# lifetime's frame) and a whole-number one (the running sums less exits), on days too.
FAR = GroupSpec.model_validate({"name": "far", "keys": ["user_id"], "features": [
    {"op": "variance", "column": "value", "windows": ["1d", "all"]},
    {"op": "variance", "column": "value", "name": "value_week", "windows": ["7d"], "hop": "1d"},
    {"op": "variance", "column": "price", "windows": ["1h", "all"]},
    {"op": "variance", "column": "clicks", "windows": ["1d"]}]})


def test_a_variance_of_values_far_from_zero_is_numpys_in_every_plan(spark):
    """2,000 values 1e9 + N(0, 1) over four days: a partial's sums are measured from one
    of its key's values, so every plan — tiles with the anchor's hop, the lifetime's frame,
    exits over whole numbers, folded days, stored day partials, a prior's lifetime partials,
    the online tiles merged in Python — gives NumPy's variance of the window to 1e-6
    (plain sums of squares gave 384 for the double column's 1-day variance of 1.05)."""
    import numpy as np

    from featureline.etl.aggregations import lifetime, output_tiles
    from featureline.feature_store.tiles import OutputTiles, key_tiles

    rng = np.random.default_rng(3)
    size = 2_000
    times = ORIGIN + np.sort(rng.integers(0, 4 * DAY, size))
    noise = rng.normal(size=size)
    log = [{"user_id": "u1", TS_MICROS: int(t), "value": 1e9 + float(x),
            "price": -5e8 + float(x), "clicks": 10**9 + int(np.rint(3 * x))}
           for t, x in zip(times, noise, strict=True)]
    events = spark.createDataFrame(log, "user_id string, _ts_us long, value double, "
                                        "price double, clicks long")

    def expected(feature, t):
        values = [e[feature.spec.column] for e in log
                  if feature.window.covers(e[TS_MICROS], t)]
        return float(np.var(np.array(values, dtype=np.float64))) if values else None

    def check(rows, outputs, plan):
        checked = 0
        for row in rows:
            for feature in outputs:
                want = expected(feature, row[TS_MICROS])
                got = row[feature.column_name]
                assert (got is None) == (want is None), (plan, feature.output, row)
                if want is not None:
                    assert got == pytest.approx(want, rel=1e-6), (plan, feature.output, got,
                                                                  want)
                    checked += want > 0.5
        assert checked > 0

    numeric = ["value", "price", "clicks"]
    end = int(times[-1]) + 1
    anchors = spark.createDataFrame(
        [("u1", t) for t in (int(times[500]), int(times[1500]), end, end + 2 * DAY)],
        "user_id string, _ts_us long")
    check(group_values(events, anchors, FAR, numeric).collect(), FAR.outputs(), "events")
    daily = [f for f in FAR.outputs() if f.output != "price_variance_1h"]
    midnights = group_values(events, None, FAR, numeric, aligned=DAY, outputs=daily).collect()
    assert len(midnights) == 4
    check(midnights, daily, "folded days")
    # A day's run: the days before ``since`` as their partials, the later events as events.
    since = ORIGIN + 2 * DAY
    on = [f for f in FAR.outputs() if on_days(f)]
    assert [f.output for f in on] == ["value_variance_all", "value_week_7d",
                                      "price_variance_all"]
    days = day_partials(events.where(F.col(TS_MICROS) < since), FAR, numeric)
    later = events.where(F.col(TS_MICROS) >= since)
    from_since = anchors.where(F.col(TS_MICROS) >= since)
    assert from_since.count() == 3
    check(group_values(later, from_since, FAR, numeric, outputs=on, days=days).collect(), on,
          "day partials")
    # A prior: the lifetime outputs' partials of the first two days, folded in as their span.
    lifetimes = FAR.model_copy(update={"features": [
        f.model_copy(update={"windows": ["all"]}) for f in FAR.features]})
    prior = lifetime(events, lifetimes, numeric, since)
    at_midnights = spark.createDataFrame([("u1", since + d * DAY) for d in (1, 2, 3)],
                                         "user_id string, _ts_us long")
    check(group_values(later, at_midnights, lifetimes, numeric, aligned=DAY,
                       prior=prior).collect(), lifetimes.outputs(), "prior")
    # The online tiles as of the last event, merged in Python at and after it.
    served = OutputTiles(end)
    for feature, frame in output_tiles(events, FAR, numeric, end):
        served.features[feature.qualified] = feature
        served.by_output[feature.qualified] = key_tiles(
            feature, [row.asDict() for row in frame.collect()])
    for t in (end, end + 3 * HOUR):
        values = served.values_at("far", ["u1"], t)
        check([{TS_MICROS: t, **{f.column_name: values[f.output] for f in FAR.outputs()}}],
              FAR.outputs(), "tiles")
