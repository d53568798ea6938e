"""The profile of a run, for the validation gate (``core/drift.py``; docs/ARCHITECTURE.md,
"The validation gate"): the newest UTC day of the output's events, per raw column and per
feature — rows, missing share, and a histogram with min / max / mean / std (numbers) or the
most frequent values and the count of distinct ones (text and ids) — with the events per
day, the day's label rate and the run's quarantine reasons.

Plain Spark SQL over the cached events and the examples just written (a union per kind of
column, grouped once), so the RAPIDS Accelerator plans it like the rest of the job.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from featureline.core.drift import BINS_PER_DECADE, TOP_K
from featureline.etl.features.base import LABEL

_NAME, _VALUE = "column", "value"


def histogram_bin(value: Column) -> Column:
    """The profile's histogram bin of a number: sign(x) · floor(log10(1 + |x|) · bins per
    decade), so a value ×100 lands two decades of bins away."""
    return (F.signum(value) * F.floor(F.log10(F.abs(value) + 1) * BINS_PER_DECADE)).cast("long")


def profile(events: DataFrame, examples: DataFrame, *, raw_numeric: Sequence[str],
            raw_categorical: Sequence[str], feature_numeric: Sequence[str],
            feature_categorical: Sequence[str], rows: dict[str, Any]) -> dict[str, Any]:
    """The profile of the newest day of ``events`` (accepted, labelled) and ``examples``
    (their feature rows, with ``ts``); ``rows``: the run's row accounting."""
    per_day = {str(row["day"]): int(row["count"]) for row in
               events.groupBy(F.to_date("ts").alias("day")).count().collect()}
    newest = max(per_day)
    day = F.to_date("ts") == F.lit(newest).cast("date")
    raw, (label_rate,) = _moments(events.where(day), raw_numeric, raw_categorical, "raw",
                                  [F.avg(F.col(LABEL).cast("double"))])
    features, _ = _moments(examples.where(day), feature_numeric, feature_categorical,
                           "feature")
    columns = {**raw, **features}
    parts = [(events.where(day), raw_numeric, raw_categorical),
             (examples.where(day), feature_numeric, feature_categorical)]
    _distributions(columns, parts)
    return {"day": newest, "day_events": per_day[newest],
            "events_per_day": dict(sorted(per_day.items())),
            "label_rate": float(label_rate or 0.0),
            "rows": {"read": rows["read"], "quarantined": dict(rows["quarantined"])},
            "columns": columns}


def _moments(frame: DataFrame, numeric: Sequence[str], categorical: Sequence[str],
             source: str, extra: Sequence[Column] = ()
             ) -> tuple[dict[str, dict[str, Any]], list[Any]]:
    """Each column's entry with its rows, missing share and (numbers) min / max / mean / std,
    from one aggregation, which also gives the ``extra`` aggregates' values."""
    columns = [*numeric, *categorical]
    aggregates = [F.count(F.lit(1)).alias("rows"),
                  *(column.alias(f"extra{i}") for i, column in enumerate(extra))]
    for index, name in enumerate(columns):
        value = F.col(name)
        aggregates.append(F.count(value).alias(f"n{index}"))
        if name in numeric:
            aggregates += [F.min(value).cast("double").alias(f"min{index}"),
                           F.max(value).cast("double").alias(f"max{index}"),
                           F.avg(value).alias(f"mean{index}"),
                           F.stddev_samp(value).alias(f"std{index}")]
    moments = frame.agg(*aggregates).collect()[0]
    rows = int(moments["rows"])
    profiles: dict[str, dict[str, Any]] = {}
    for index, name in enumerate(columns):
        present = int(moments[f"n{index}"])
        entry: dict[str, Any] = {"source": source, "rows": rows,
                                 "missing": 1 - present / rows if rows else 0.0}
        if name in numeric:
            entry.update(kind="numeric", histogram={},
                         **{key: _number(moments[f"{key}{index}"])
                            for key in ("min", "max", "mean", "std")})
        else:
            entry.update(kind="categorical", distinct=0, top=[])
        profiles[name] = entry
    return profiles, [moments[f"extra{i}"] for i in range(len(extra))]


def _distributions(profiles: dict[str, dict[str, Any]],
                   parts: Sequence[tuple[DataFrame, Sequence[str], Sequence[str]]]) -> None:
    """Fill in the histograms of the numbers and the top values of the categories: each
    from one union of every frame's columns, grouped once."""
    numeric = [(frame, name) for frame, names, _ in parts for name in names]
    categorical = [(frame, name) for frame, _, names in parts for name in names]
    if numeric:
        bins = _union(numeric, histogram_bin).groupBy(_NAME, _VALUE).count()
        for row in bins.collect():
            profiles[row[_NAME]]["histogram"][str(row[_VALUE])] = int(row["count"])
        for _, name in numeric:
            profiles[name]["histogram"] = dict(sorted(profiles[name]["histogram"].items(),
                                                      key=lambda item: int(item[0])))
    if categorical:
        counts = _union(categorical, lambda c: c.cast("string")).groupBy(_NAME, _VALUE).count()
        ranked = counts.select(
            "*", F.row_number().over(Window.partitionBy(_NAME).orderBy(
                F.desc("count"), _VALUE)).alias("rank"),
            F.count(F.lit(1)).over(Window.partitionBy(_NAME)).alias("distinct"))
        for row in ranked.where(F.col("rank") <= TOP_K).orderBy(_NAME, "rank").collect():
            profiles[row[_NAME]]["distinct"] = int(row["distinct"])
            profiles[row[_NAME]]["top"].append([row[_VALUE], int(row["count"])])


def _union(columns: Sequence[tuple[DataFrame, str]], value: Any) -> DataFrame:
    """(column name, value(column)) rows of every present value of each (frame, column)."""
    parts = [frame.where(F.col(name).isNotNull())
             .select(F.lit(name).alias(_NAME), value(F.col(name)).alias(_VALUE))
             for frame, name in columns]
    union = parts[0]
    for part in parts[1:]:
        union = union.unionByName(part)
    return union


def _number(value: Any) -> float | None:
    return None if value is None else float(value)
