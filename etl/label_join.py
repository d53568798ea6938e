"""Examples that are impressions, labelled by what followed them (docs/ARCHITECTURE.md,
"Label joins").

An impression (an event matching the join's ``of``) is an example; its label is 1 when a
positive (an event matching ``positive``) of the same user and item follows it strictly
after it and at most ``within`` later, with no other impression of the pair between them
(at the positive's own time does not count as between). A positive so labels the latest
impression before it — every one of them where several share that time — and nothing else.
An impression whose window still reaches the latest event is held open: not an example yet,
unless a positive has labelled it already (no later event can undo that). Every event stays
an event: positives and held impressions count in the features of later examples.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from featureline.core import time_rule
from featureline.core.events import LabelSpec
from featureline.core.settings import duration_seconds
from featureline.etl.aggregations import rule_column
from featureline.etl.config import LabelJoin, LabelRule
from featureline.etl.features.base import MICROS, TS_MICROS, with_time_key

KEYS = ("user_id", "item_id", "ts")
IMPRESSION = "_impression"
POSITIVE = "_positive"
TARGET = "_target"
HELD = "_held"
MATCHED = "_matched"
# Beside each event: whether this run counts it (an incremental run: its new events).
COUNTED = "_counted"
# metadata.json's rows["label_join"]: every accepted event is one of these four.
PARTS = ("examples", "positives", "held_open", "other")


def within_micros(join: LabelJoin) -> int:
    return duration_seconds(join.within) * MICROS


def matches(rule: LabelRule, categorical: frozenset[str]) -> Column:
    """Whether an event matches ``rule`` (``categorical``: the columns holding text)."""
    spec = LabelSpec(column=rule.column, op=rule.op, value=rule.value)
    return rule_column(spec, rule.column in categorical)


def flagged(events: DataFrame, join: LabelJoin, categorical: frozenset[str],
            latest: int) -> DataFrame:
    """Each event's keys with ``IMPRESSION``, ``POSITIVE``, ``TARGET`` (an impression a
    positive labels), ``HELD`` (an impression whose window reaches ``latest``, µs, unlabelled)
    and ``MATCHED`` (an impression at most ``within`` before it), and ``COUNTED`` where
    ``events`` has it. ``events``: every event of each pair from a time on; the values are
    exact for the impressions of that time on, and for the positives ``within`` after it."""
    within = within_micros(join)
    t = F.col(TS_MICROS)
    pair = Window.partitionBy("user_id", "item_id").orderBy(TS_MICROS)
    after = pair.rangeBetween(1, Window.unboundedFollowing)
    before = pair.rangeBetween(Window.unboundedPreceding, -1)
    counted = [COUNTED] if COUNTED in events.columns else []
    flags = with_time_key(events).select(
        *KEYS, TS_MICROS, *counted, matches(join.of, categorical).alias(IMPRESSION),
        matches(join.positive, categorical).alias(POSITIVE))
    next_positive = F.min(F.when(F.col(POSITIVE), t)).over(after)
    next_impression = F.min(F.when(F.col(IMPRESSION), t)).over(after)
    last_impression = F.max(F.when(F.col(IMPRESSION), t)).over(before)
    labelled = (F.col(IMPRESSION) & next_positive.isNotNull()
                & (next_positive <= t + F.lit(within))
                & (next_impression.isNull() | (next_positive <= next_impression)))
    return (flags.withColumn(TARGET, labelled)
            .withColumn(HELD, F.col(IMPRESSION) & ~F.col(TARGET)
                        & (t + F.lit(within) >= F.lit(latest)))
            .withColumn(MATCHED, last_impression.isNotNull()
                        & (t - last_impression <= F.lit(within))))


def examples(flags: DataFrame) -> DataFrame:
    """The examples' keys and labels: every impression but the held ones (impressions
    sharing their keys share their label: one row for them; the impressions among the
    events sharing them are the examples: ``matches(join.of, ...)``)."""
    return (flags.where(F.col(IMPRESSION) & ~F.col(HELD))
            .select(*KEYS, F.col(TARGET).cast("long").alias(TARGET)).distinct())


def counts(flags: DataFrame) -> dict[str, int]:
    """The impressions held open, and the positives that are not impressions (of the events
    ``COUNTED`` where the flags have it) with those no impression came within ``within``
    before."""
    positive = F.col(POSITIVE) & ~F.col(IMPRESSION)
    if COUNTED in flags.columns:
        positive = positive & F.col(COUNTED)
    row = flags.agg(F.count_if(F.col(HELD)).alias("held_open"),
                    F.count_if(positive).alias("positives"),
                    F.count_if(positive & ~F.col(MATCHED)).alias("without")).collect()[0]
    return {"held_open": int(row["held_open"]), "positives": int(row["positives"]),
            "positives_without_impression": int(row["without"])}


def accounting(accepted: int, examples_written: int, counted: dict[str, int],
               previous: dict[str, Any] | None = None) -> dict[str, int]:
    """metadata.json's ``rows["label_join"]``: the accepted events as examples, positives,
    impressions held open and other events (they add up to ``accepted``), and the positives
    without an impression before them. ``previous``: the output's, where this run counted
    only its new positives."""
    positives = counted["positives"] + (previous["positives"] if previous else 0)
    without = counted["positives_without_impression"] + (
        previous["positives_without_impression"] if previous else 0)
    held = counted["held_open"]
    return {"examples": examples_written, "positives": positives, "held_open": held,
            "other": accepted - examples_written - positives - held,
            "positives_without_impression": without}


def rewritten_from(latest: datetime, earliest_new: int, join: LabelJoin) -> datetime:
    """The midnight from which an incremental run writes its examples again: the day of
    the earliest impression it may label (held open by the output, or before a late event)."""
    first = min(int(latest.timestamp() * MICROS), earliest_new) - within_micros(join)
    day = time_rule.floor_to(first, time_rule.DAY)
    return datetime.fromtimestamp(day // MICROS, timezone.utc)
