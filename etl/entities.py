"""Entity tables for Feast: daily, point-in-time correct snapshots per user and per item.

Their features are a group of the aggregations engine (``core.aggregations.entity_group``),
computed by the same backfill as the ``aggregations:`` spec's (docs/ARCHITECTURE.md,
"Features as definitions"). A snapshot stamped ``event_timestamp = D 00:00 UTC`` aggregates
the events strictly before D. An entity gets a snapshot the day after each day it was
active and each following day while an event can still leave its N-day window (the API's
values at the request time decay the same way), up to the day after the log's last event;
in between, its latest snapshot stands (a point-in-time join picks it up).

A table is written a file per day; an incremental run keeping its fit computes only the days
after the ones it keeps (``Resume``), from the recent events and the lifetime partials the
previous run left (docs/ARCHITECTURE.md, "Incremental runs"). Every window of the group
starts and ends on a midnight at a snapshot and in a tile: the table reads its events as a
row per key, day and label (``entity_rows``).
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from featureline.core.aggregations import ENTITIES, LABEL, MICROS, GroupSpec, entity_group
from featureline.core.metadata import EVENT_TIMESTAMP, OOV_ID, encoded_name
from featureline.core.time_rule import floor_to
from featureline.etl.aggregations import (
    DAY,
    WEIGHT,
    Lifetime,
    decay_days,
    group_values,
    last_snapshot,
    lifetime,
    snapshot_anchors,
    snapshot_rows,
)
from featureline.etl.features.base import TS_MICROS, with_time_key


@dataclass(frozen=True)
class EntityTable:
    name: str
    join_key: str
    frame: DataFrame
    group: GroupSpec
    # The lifetime partials a later run resumes from (``Resume``).
    lifetime: Lifetime

    @property
    def feature_columns(self) -> list[str]:
        return [c for c in self.frame.columns if c not in {self.join_key, EVENT_TIMESTAMP}]


@dataclass(frozen=True)
class Resume:
    """Where an incremental run takes up an entity table: the snapshots stamped after
    ``after`` (µs, a midnight) are computed — from the events since ``lifetime.before`` and
    the lifetime partials of those before — and the earlier ones are the previous output's
    (docs/ARCHITECTURE.md, "Incremental runs")."""

    after: int
    lifetime: Lifetime


def lifetime_before(group: GroupSpec, cut: int) -> int:
    """Where a run's lifetime partials end (µs, a midnight): the day after the last event
    (``cut``: µs, just after it), less the days its snapshots still change on and one more —
    before every window's start at ``cut`` and every event the next day's snapshots read."""
    return last_snapshot(cut) - (decay_days(group) + 1) * DAY


def resume_from(group: GroupSpec, after: int, cut: int) -> int:
    """The events a run resuming after ``after`` reads from (µs): those of the snapshots
    after it and of its own ``lifetime_before``."""
    return min(after - decay_days(group) * DAY, lifetime_before(group, cut))


def entity_rows(events: DataFrame, entity: str, recent_days: int) -> DataFrame:
    """What the entity's table reads of ``events``: its key, the time key and the label —
    folded into a row per key, UTC day and label at the day's start, with ``WEIGHT`` (the
    events it stands for), where every window of its group moves by whole days: a day's
    events then count the same at each snapshot and in each tile."""
    key = ENTITIES[entity]
    rows = with_time_key(events.select(key, "ts", LABEL))
    windows = [f.window for f in entity_group(entity, recent_days).outputs()
               if f.window.seconds is not None]
    if any(w.hop is None or w.hop * MICROS % DAY for w in windows):
        return rows.select(key, TS_MICROS, LABEL)
    day = floor_to(F.col(TS_MICROS), DAY)
    return rows.groupBy(key, day.alias(TS_MICROS), LABEL).agg(F.count(F.lit(1)).alias(WEIGHT))


def entity_snapshots(rows: DataFrame, entity: str, recent_days: int,
                     vocabulary: DataFrame | None, cut: int,
                     resume: Resume | None = None) -> EntityTable:
    """Daily snapshots of one entity from ``entity_rows`` of the accepted events (all splits;
    ``cut``: µs, just after the latest), with its encoded id where the run has a
    ``vocabulary`` of its key. With ``resume``: only the snapshots after ``resume.after``,
    ``rows`` those from ``resume.lifetime.before`` on (ValueError where that is after
    ``resume_from``)."""
    group = entity_group(entity, recent_days)
    key = ENTITIES[entity]
    before = lifetime_before(group, cut)
    if resume is None:
        values = group_values(rows, snapshot_anchors(rows, group, cut), group, numeric=(),
                              aligned=DAY)
        carried = lifetime(rows, group, (), before)
    else:
        start = resume_from(group, resume.after, cut)
        if start < resume.lifetime.before:
            raise ValueError(f"{entity}: its lifetime partials end at "
                             f"{resume.lifetime.before} µs, after the events it needs from "
                             f"{start} µs")
        prior = lifetime(rows, group, (), start, resume.lifetime)
        recent = rows.where(F.col(TS_MICROS) >= start)
        anchors = snapshot_anchors(recent, group, cut).where(F.col(TS_MICROS) > resume.after)
        values = group_values(recent, anchors, group, numeric=(), aligned=DAY, prior=prior)
        carried = lifetime(rows, group, (), before, prior)
    snapshots = snapshot_rows(values, group)
    if vocabulary is not None:
        ids = vocabulary.select(F.col("value").alias(key), F.col("id").alias(encoded_name(key)))
        snapshots = snapshots.join(ids, on=key, how="left").fillna({encoded_name(key): OOV_ID})
        first = [key, EVENT_TIMESTAMP, encoded_name(key)]
        snapshots = snapshots.select(*first, *(c for c in snapshots.columns if c not in first))
    return EntityTable(entity, key, snapshots, group, carried)
