"""The profile of a run, for the validation gate (``core/drift.py``; docs/ARCHITECTURE.md,
"The validation gate"): the newest UTC day of the output's events, per raw column and per
feature — rows, missing share, and a histogram with min / max / mean / std and quantiles
read off it (numbers) or the most frequent values and the count of distinct ones (text and
ids) — with the events per day, the day's label rate and the run's quarantine reasons.

Plain Spark SQL over the cached events and the examples just written (a union per kind of
column, grouped once), so the RAPIDS Accelerator plans it like the rest of the job. The
replay of the gate over an output's days (``etl/checks_history.py``) profiles its days with
the same queries grouped by day.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

from pyspark.sql import Column, DataFrame, GroupedData, Row, Window
from pyspark.sql import functions as F

from featureline.core.aggregations import ENTITIES
from featureline.core.drift import BINS_PER_DECADE, TOP_K, histogram_index, quantiles
from featureline.core.metadata import encoded_name
from featureline.etl.config import EtlConfig, categorical_columns
from featureline.etl.features.base import LABEL
from featureline.etl.features.cyclic_time import SAME_ALL_DAY

_DAY, _NAME, _VALUE = "day", "column", "value"


def histogram_bin(value: Column) -> Column:
    """The profile's histogram bin of a number: sign(x) · floor(log10(1 + |x|) · bins per
    decade), so a value ×100 lands two decades of bins away."""
    return (F.signum(value) * F.floor(F.log10(F.abs(value) + 1) * BINS_PER_DECADE)).cast("long")


class ProfileColumns(TypedDict):
    """``profile_columns``: ``profile``'s and ``profiles``' keyword arguments by name."""

    raw_numeric: list[str]
    raw_categorical: list[str]
    feature_numeric: list[str]
    feature_categorical: list[str]
    keys: list[str]
    entities: dict[str, str]


def profile_columns(config: EtlConfig, features: Sequence[Mapping[str, Any]]
                    ) -> ProfileColumns:
    """Which columns a run profiles, and how (``profile``'s keyword arguments): the raw
    log's, and the features of ``features`` (metadata.json's entries) but the day-of-week
    ones (one value all day); the ids of users and items, and the features that encode them,
    as keys."""
    value = ["value"] if config.source.columns.value else []
    ids = set(ENTITIES.values())
    encoded = {encoded_name(key) for key in ids}
    attributes = {column: role for column, role in config.source.declared_roles().items()
                  if role in ("user", "item")}
    return {
        "raw_numeric": [*value, *config.source.continuous],
        "raw_categorical": categorical_columns(config),
        "feature_numeric": [f["name"] for f in features
                            if f["kind"] == "continuous" and f["name"] not in SAME_ALL_DAY],
        "feature_categorical": [f["name"] for f in features if f["kind"] == "categorical"],
        "keys": sorted(ids | {f["name"] for f in features
                              if f["name"] in encoded or f.get("shares") in encoded}),
        "entities": {**attributes, **{encoded_name(column): role
                                      for column, role in attributes.items()}},
    }


def profile(events: DataFrame, examples: DataFrame, *, raw_numeric: Sequence[str],
            raw_categorical: Sequence[str], feature_numeric: Sequence[str],
            feature_categorical: Sequence[str], rows: dict[str, Any],
            keys: Sequence[str] = (), entities: Mapping[str, str] | None = None,
            day_counts: Mapping[str, int] | None = None) -> dict[str, Any]:
    """The profile of the newest day of ``events`` (accepted, labelled) and ``examples``
    (their feature rows, with ``ts``); ``rows``: the run's row accounting; ``keys``: the
    columns that hold the ids of users and items (marked ``key``); ``entities``: the columns
    that are attributes of a user or an item, and their role (marked ``entity``);
    ``day_counts``: every day's count of events where known (``events`` may then hold the
    newest days only)."""
    [newest] = profiles(events, examples, 1, raw_numeric=raw_numeric,
                        raw_categorical=raw_categorical, feature_numeric=feature_numeric,
                        feature_categorical=feature_categorical, rows=rows, keys=keys,
                        entities=entities, day_counts=day_counts)
    return newest


def profiles(events: DataFrame, examples: DataFrame, last: int, *,
             raw_numeric: Sequence[str], raw_categorical: Sequence[str],
             feature_numeric: Sequence[str], feature_categorical: Sequence[str],
             rows: dict[str, Any], keys: Sequence[str] = (),
             entities: Mapping[str, str] | None = None,
             day_counts: Mapping[str, int] | None = None) -> list[dict[str, Any]]:
    """The profiles of the ``last`` days of ``events`` that have events, oldest first: each
    the one a run whose newest events are of its day writes (:func:`profile`), all of them
    from one aggregation per kind of frame, grouped by day, after a count of every day
    (``day_counts`` where given)."""
    # Every day's count (the time column alone is read), then the chosen days' moments in
    # one aggregation (the earlier days' files are skipped by their time range).
    counts = dict(day_counts) if day_counts is not None else {
        str(row[_DAY]): row["count"]
        for row in events.groupBy(F.to_date("ts").alias(_DAY)).count().collect()}
    every = sorted(counts)
    chosen = every[-last:]
    if not chosen:
        return []
    on_chosen = ((F.col("ts") >= F.lit(chosen[0]).cast("timestamp"))
                 & F.to_date("ts").isin([F.lit(day).cast("date") for day in chosen]))
    by_day = {str(row[_DAY]): row for row in _aggregated(
        events.where(on_chosen).groupBy(F.to_date("ts").alias(_DAY)), raw_numeric,
        raw_categorical, [F.avg(F.col(LABEL).cast("double")).alias("label")])}
    feature_moments = {str(row[_DAY]): row for row in _aggregated(
        examples.where(on_chosen).groupBy(F.to_date("ts").alias(_DAY)),
        feature_numeric, feature_categorical)}
    columns = {}
    for day in chosen:
        columns[day] = {
            **_entries(by_day[day], raw_numeric, raw_categorical, "raw"),
            **_entries(feature_moments.get(day), feature_numeric, feature_categorical,
                       "feature")}
        for name in set(keys) & set(columns[day]):
            columns[day][name]["key"] = True
        for name, role in (entities or {}).items():
            if name in columns[day]:
                columns[day][name]["entity"] = role
    _distributions(columns, [(events.where(on_chosen), raw_numeric, raw_categorical),
                             (examples.where(on_chosen), feature_numeric, feature_categorical)])
    _entity_histograms(columns, events.where(on_chosen), {
        name: ENTITIES[role] for name, role in (entities or {}).items()
        if name in raw_numeric and role in ENTITIES})
    return [{"day": day, "day_events": int(by_day[day]["rows"]),
             "events_per_day": {d: int(counts[d]) for d in every if d <= day},
             "label_rate": float(by_day[day]["label"] or 0.0),
             "rows": {"read": rows["read"], "quarantined": dict(rows["quarantined"])},
             "columns": columns[day]} for day in chosen]


def day_totals(events: DataFrame) -> dict[str, tuple[int, float]]:
    """Every day's events and label rate: one aggregation, grouped by day."""
    return {str(row[_DAY]): (int(row["count"]), float(row["label"] or 0.0))
            for row in events.groupBy(F.to_date("ts").alias(_DAY)).agg(
                F.count(F.lit(1)).alias("count"),
                F.avg(F.col(LABEL).cast("double")).alias("label")).collect()}


def seeded_totals(totals: Mapping[str, tuple[int, float]], before: str,
                  rows: dict[str, Any]) -> list[dict[str, Any]]:
    """The days before ``before`` known by their totals only (``day_totals``'), with the
    run's row accounting: the start of a reference window (``core/drift_window.py``)."""
    return [{"day": day, "day_events": events, "label_rate": rate,
             "rows": {"read": rows["read"], "quarantined": dict(rows["quarantined"])}}
            for day, (events, rate) in sorted(totals.items()) if day < before]


def _aggregated(frame: DataFrame | GroupedData, numeric: Sequence[str],
                categorical: Sequence[str], extra: Sequence[Column] = ()) -> list[Row]:
    """Rows, and per column its present values and (numbers) min / max / mean / std, with the
    ``extra`` aggregates: one aggregation (per group of a grouped frame)."""
    aggregates = [F.count(F.lit(1)).alias("rows"), *extra]
    for index, name in enumerate([*numeric, *categorical]):
        value = F.col(name)
        aggregates.append(F.count(value).alias(f"n{index}"))
        if name in numeric:
            aggregates += [F.min(value).cast("double").alias(f"min{index}"),
                           F.max(value).cast("double").alias(f"max{index}"),
                           F.avg(value).alias(f"mean{index}"),
                           F.stddev_samp(value).alias(f"std{index}")]
    return frame.agg(*aggregates).collect()


def _entries(moments: Row | None, numeric: Sequence[str], categorical: Sequence[str],
             source: str) -> dict[str, dict[str, Any]]:
    """Each column's entry from its aggregates (``None``: a day without rows); the
    distributions are filled in later."""
    rows = int(moments["rows"]) if moments else 0
    entries: dict[str, dict[str, Any]] = {}
    for index, name in enumerate([*numeric, *categorical]):
        present = int(moments[f"n{index}"]) if moments else 0
        entry: dict[str, Any] = {"source": source, "rows": rows,
                                 "missing": 1 - present / rows if rows else 0.0}
        if name in numeric:
            entry.update(kind="numeric", histogram={},
                         **{key: _number(moments[f"{key}{index}"] if moments else None)
                            for key in ("min", "max", "mean", "std")})
        else:
            entry.update(kind="categorical", distinct=0, top=[])
        entries[name] = entry
    return entries


def _distributions(profiles: dict[str, dict[str, dict[str, Any]]],
                   parts: Sequence[tuple[DataFrame, Sequence[str], Sequence[str]]]) -> None:
    """Fill in, for each day of ``profiles`` (day → its columns' entries), the histograms of
    the numbers (every bin) and the most frequent values of the categories, with their
    distinct counts: every frame's columns as (day, column, value) rows (a number as its
    bin), one scan of each frame, grouped and ranked once."""
    frames = []
    for frame, numeric, categorical in parts:
        pairs = [F.struct(F.lit(name).alias(_NAME), histogram_bin(F.col(name)).cast("string")
                          .alias(_VALUE), F.lit(True).alias("numeric")) for name in numeric]
        pairs += [F.struct(F.lit(name).alias(_NAME), F.col(name).cast("string").alias(_VALUE),
                           F.lit(False).alias("numeric")) for name in categorical]
        if pairs:  # one scan of the frame: every column's value as a row of its own
            frames.append(frame.select(F.to_date("ts").cast("string").alias(_DAY),
                                       F.explode(F.array(*pairs)).alias("pair"))
                          .select(_DAY, "pair.*").where(F.col(_VALUE).isNotNull()))
    if not frames:
        return
    union = functools.reduce(DataFrame.unionByName, frames)
    within = Window.partitionBy(_DAY, _NAME)
    ranked = union.groupBy(_DAY, _NAME, _VALUE, "numeric").count().select(
        "*", F.row_number().over(within.orderBy(F.desc("count"), _VALUE)).alias("rank"),
        F.count(F.lit(1)).over(within).alias("distinct"))
    kept = ranked.where(F.col("numeric") | (F.col("rank") <= TOP_K))
    # Ordered here, not by Spark: an orderBy is a sampling job and a shuffle more.
    for row in sorted(kept.collect(), key=lambda row: (row[_DAY], row[_NAME], row["rank"])):
        entry = profiles[row[_DAY]][row[_NAME]]
        if row["numeric"]:
            entry["histogram"][row[_VALUE]] = int(row["count"])
        else:
            entry["distinct"] = int(row["distinct"])
            entry["top"].append([row[_VALUE], int(row["count"])])
    for columns in profiles.values():
        for entry in columns.values():
            if entry["kind"] == "numeric":
                entry["histogram"] = dict(sorted(entry["histogram"].items(),
                                                 key=lambda item: int(item[0])))
                entry["quantiles"] = quantiles(entry)


def _entity_histograms(profiles: dict[str, dict[str, dict[str, Any]]], events: DataFrame,
                       keys: Mapping[str, str]) -> None:
    """For each numeric attribute of a user or an item (column → the id column keying it),
    each day's count of the users (items) holding each value: ``entity_values`` where the day
    has at most TOP_K values, and per histogram bin (``entity_histogram``) — what the check
    of values beyond the window's range counts (``core.drift.beyond_range``), where the rows
    of one user are not independent values."""
    if not keys:
        return
    triples = [F.struct(F.lit(name).alias(_NAME), F.col(name).cast("double").alias(_VALUE),
                        F.col(key).alias("_key")) for name, key in keys.items()]
    per_value = (events.select(F.to_date("ts").cast("string").alias(_DAY),
                               F.explode(F.array(*triples)).alias("triple"))
                 .select(_DAY, "triple.*").where(F.col(_VALUE).isNotNull()).distinct()
                 .groupBy(_DAY, _NAME, _VALUE).count()
                 .withColumn("values", F.count(F.lit(1)).over(Window.partitionBy(_DAY, _NAME))))
    for columns in profiles.values():
        for name in keys:
            if name in columns:
                columns[name]["entity_histogram"] = {}
    for row in per_value.collect():
        entry = profiles[row[_DAY]][row[_NAME]]
        value, count = float(row[_VALUE]), int(row["count"])
        index = str(histogram_index(value))
        entry["entity_histogram"][index] = entry["entity_histogram"].get(index, 0) + count
        if row["values"] <= TOP_K:
            entry.setdefault("entity_values", {})[repr(value)] = count
    for columns in profiles.values():
        for name in keys:
            for field in ("entity_histogram", "entity_values"):
                if field in columns.get(name, {}):
                    columns[name][field] = dict(sorted(columns[name][field].items(),
                                                       key=lambda item: float(item[0])))


def _number(value: Any) -> float | None:
    return None if value is None else float(value)
