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
# Per (user, item, time): its impressions, its positives (the impressions among them too),
# its positives that are not impressions, and of those the ones this run counts.
IMPRESSIONS = "_impressions"
POSITIVES_AT = "_positives_at"
POSITIVES = "_positives"
COUNTED_POSITIVES = "_counted_positives"
TARGET = "_target"
HELD = "_held"
MATCHED = "_matched"
# Beside each event: whether this run counts it (an incremental run: its new events).
COUNTED = "_counted"


def within_micros(join: LabelJoin) -> int:
    return duration_seconds(join.within) * MICROS


def matches(rule: LabelRule, categorical: frozenset[str]) -> Column:
    """Whether an event matches ``rule`` (``categorical``: the columns holding text)."""
    spec = LabelSpec(column=rule.column, op=rule.op, value=rule.value)
    return rule_column(spec, rule.column in categorical)


def flagged(events: DataFrame, join: LabelJoin, categorical: frozenset[str],
            latest: int) -> DataFrame:
    """One row per user, item and time of ``events`` with its counts (``IMPRESSIONS``,
    ``POSITIVES``...) and flags: ``TARGET`` (its impressions are labelled), ``HELD`` (their
    window reaches ``latest``, µs, unlabelled) and ``MATCHED`` (an impression at most
    ``within`` before it, for its positives). ``events``: every event of each pair from a time
    on; the flags are exact for the times from then on (``MATCHED``: ``within`` after it);
    ``COUNTED`` where ``events`` has it marks the positives counted.

    The neighbouring times come from running frames and lead/lag over one row per time (a
    frame bounded ahead of or behind the current row is not one the RAPIDS Accelerator
    plans on the GPU)."""
    within = within_micros(join)
    impression = matches(join.of, categorical)
    positive = matches(join.positive, categorical)
    only_positive = positive & ~impression
    counted = F.col(COUNTED) if COUNTED in events.columns else F.lit(True)
    t = F.col(TS_MICROS)
    points = with_time_key(events).groupBy("user_id", "item_id", "ts", TS_MICROS).agg(
        F.count_if(impression).alias(IMPRESSIONS), F.count_if(positive).alias(POSITIVES_AT),
        F.count_if(only_positive).alias(POSITIVES),
        F.count_if(only_positive & counted).alias(COUNTED_POSITIVES))
    pair = Window.partitionBy("user_id", "item_id")
    up_to = pair.orderBy(t.asc()).rowsBetween(Window.unboundedPreceding, Window.currentRow)
    from_here = pair.orderBy(t.desc()).rowsBetween(Window.unboundedPreceding,
                                                   Window.currentRow)
    shown, positives = F.col(IMPRESSIONS) > 0, F.col(POSITIVES_AT) > 0
    # Latest first, then earliest first: the running frame and lead/lag share that order.
    points = points.select(
        "*", F.min(F.when(positives, t)).over(from_here).alias("_positive_from"),
        F.min(F.when(shown, t)).over(from_here).alias("_shown_from"))
    points = points.select("*", F.max(F.when(shown, t)).over(up_to).alias("_shown_up_to"))
    ordered = pair.orderBy(t.asc())
    last_shown = F.lag("_shown_up_to", 1).over(ordered)
    next_positive = F.lead("_positive_from", 1).over(ordered)
    next_shown = F.lead("_shown_from", 1).over(ordered)
    points = points.select(
        *KEYS, TS_MICROS, IMPRESSIONS, POSITIVES, COUNTED_POSITIVES,
        (shown & next_positive.isNotNull() & (next_positive <= t + F.lit(within))
         & (next_shown.isNull() | (next_positive <= next_shown))).alias(TARGET),
        (last_shown.isNotNull() & (t - last_shown <= F.lit(within))).alias(MATCHED))
    return points.withColumn(HELD, (F.col(IMPRESSIONS) > 0) & ~F.col(TARGET)
                             & (t + F.lit(within) >= F.lit(latest)))


def examples(flags: DataFrame) -> DataFrame:
    """The examples' keys and labels: the times of impressions but the held ones (the
    impressions among the events at such a time are the examples: ``matches(join.of, ...)``;
    they share their label)."""
    return (flags.where((F.col(IMPRESSIONS) > 0) & ~F.col(HELD))
            .select(*KEYS, F.col(TARGET).cast("long").alias(TARGET)))


def counts(flags: DataFrame) -> dict[str, int]:
    """The impressions held open, and the positives that are not impressions (those
    ``COUNTED`` where the events had it) with those no impression came within ``within``
    before."""
    row = flags.agg(
        F.sum(F.when(F.col(HELD), F.col(IMPRESSIONS))).alias("held_open"),
        F.sum(COUNTED_POSITIVES).alias("positives"),
        F.sum(F.when(~F.col(MATCHED), F.col(COUNTED_POSITIVES))).alias("without")).collect()[0]
    return {"held_open": int(row["held_open"] or 0), "positives": int(row["positives"] or 0),
            "positives_without_impression": int(row["without"] or 0)}


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
