"""The validation gate's tests' days: the profile a run ending on one of an output's days
writes, with a fault applied to that day (the output's days from
``etl.checks_history.output_days``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from featureline.etl.checks_history import OutputDays
from featureline.etl.data_profile import profile

Fault = Callable[[DataFrame], DataFrame]


def days_of(kept: OutputDays) -> list[str]:
    """The output's days, oldest first."""
    return sorted(str(row[0]) for row in kept.events.select(F.to_date("ts")).distinct().collect())


def day_profile(kept: OutputDays, day: str, fault: Fault | None = None,
                rows: dict[str, Any] | None = None) -> dict[str, Any]:
    """The profile a run ending on ``day`` writes, with ``fault`` applied to that day's events
    (and their examples, where it drops rows)."""
    events, examples = kept.events, kept.examples
    if fault is not None:
        on_day = F.to_date("ts") == F.lit(day).cast("date")
        changed = fault(events.where(on_day))
        events = events.where(~on_day).unionByName(changed)
        examples = examples.join(changed.select("user_id", "item_id", "ts").distinct(),
                                 ["user_id", "item_id", "ts"], "left_semi") \
            .unionByName(examples.where(~on_day))
    until = F.to_date("ts") <= F.lit(day).cast("date")
    return profile(events.where(until), examples.where(until), rows=rows or kept.rows,
                   **kept.columns)
