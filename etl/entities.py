"""Entity tables for Feast: daily, point-in-time correct snapshots per user and per item.

Their features are a group of the aggregations engine (``core.aggregations.entity_group``),
computed by the same backfill as the ``aggregations:`` spec's (docs/ARCHITECTURE.md,
"Features as definitions"). A snapshot stamped ``event_timestamp = D 00:00 UTC`` aggregates
the events strictly before D. An entity gets a snapshot the day after each day it was
active and each following day while an event can still leave its N-day window (the API's
values at the request time decay the same way), up to the day after the log's last event;
in between, its latest snapshot stands (a point-in-time join picks it up).
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from featureline.core.aggregations import ENTITIES, LABEL, GroupSpec, entity_group
from featureline.core.metadata import EVENT_TIMESTAMP, OOV_ID, encoded_name
from featureline.etl.aggregations import DAY, group_values, snapshot_anchors, snapshot_rows
from featureline.etl.features.base import with_time_key


@dataclass(frozen=True)
class EntityTable:
    name: str
    join_key: str
    frame: DataFrame
    group: GroupSpec

    @property
    def feature_columns(self) -> list[str]:
        return [c for c in self.frame.columns if c not in {self.join_key, EVENT_TIMESTAMP}]


def entity_snapshots(events: DataFrame, entity: str, recent_days: int,
                     vocabulary: DataFrame | None, cut: int) -> EntityTable:
    """Daily snapshots of one entity from the accepted events (all splits; ``cut``: µs, just
    after the latest), with its encoded id where the run has a ``vocabulary`` of its key."""
    group = entity_group(entity, recent_days)
    key = ENTITIES[entity]
    rows = with_time_key(events.select(key, "ts", LABEL))
    values = group_values(rows, snapshot_anchors(rows, group, cut), group, numeric=(),
                          aligned=DAY)
    snapshots = snapshot_rows(values, group)
    if vocabulary is not None:
        ids = vocabulary.select(F.col("value").alias(key), F.col("id").alias(encoded_name(key)))
        snapshots = snapshots.join(ids, on=key, how="left").fillna({encoded_name(key): OOV_ID})
        first = [key, EVENT_TIMESTAMP, encoded_name(key)]
        snapshots = snapshots.select(*first, *(c for c in snapshots.columns if c not in first))
    return EntityTable(entity, key, snapshots, group)
