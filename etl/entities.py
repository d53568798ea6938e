"""Entity tables for Feast: daily, point-in-time correct snapshots per user and per item.

A snapshot stamped ``event_timestamp = D 00:00 UTC`` aggregates the events strictly before
D. An entity gets a snapshot the day after each day it was active; in between, its latest
snapshot stands (a point-in-time join picks it up).
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from featureline.core.metadata import EVENT_TIMESTAMP, OOV_ID, encoded_name
from featureline.etl.features.base import LABEL

ENTITIES = {"user": "user_id", "item": "item_id"}


@dataclass(frozen=True)
class EntityTable:
    name: str
    join_key: str
    frame: DataFrame

    @property
    def feature_columns(self) -> list[str]:
        return [c for c in self.frame.columns if c not in {self.join_key, EVENT_TIMESTAMP}]


def entity_snapshots(events: DataFrame, entity: str, recent_days: int,
                     vocabulary: DataFrame | None) -> EntityTable:
    """Daily snapshots of one entity from the accepted events (all splits)."""
    key = ENTITIES[entity]
    day = F.to_date("ts")
    daily = events.groupBy(key, day.alias("day")).agg(
        F.count(F.lit(1)).alias("n"), F.sum(LABEL).alias("positives"))
    day_number = F.datediff(F.col("day"), F.lit("1970-01-01").cast("date"))
    history = Window.partitionBy(key).orderBy("day").rowsBetween(Window.unboundedPreceding, 0)
    recent = Window.partitionBy(key).orderBy(day_number).rangeBetween(-(recent_days - 1), 0)
    events_total = F.sum("n").over(history)
    positives_total = F.sum("positives").over(history)
    snapshots = daily.select(
        F.col(key),
        F.to_timestamp(F.date_add("day", 1)).alias(EVENT_TIMESTAMP),
        events_total.cast("long").alias(f"{entity}_events"),
        F.sum("n").over(recent).cast("long").alias(f"{entity}_events_{recent_days}d"),
        positives_total.cast("long").alias(f"{entity}_positives"),
        (positives_total / events_total).cast("double").alias(f"{entity}_positive_rate"),
    )
    if vocabulary is not None:
        ids = vocabulary.select(F.col("value").alias(key), F.col("id").alias(encoded_name(key)))
        snapshots = snapshots.join(ids, on=key, how="left").fillna({encoded_name(key): OOV_ID})
        first = [key, EVENT_TIMESTAMP, encoded_name(key)]
        snapshots = snapshots.select(*first, *(c for c in snapshots.columns if c not in first))
    return EntityTable(entity, key, snapshots)
