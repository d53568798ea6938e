"""The validation gate replayed over an output's history (``featureline etl checks-history``;
docs/ARCHITECTURE.md, "The validation gate"): each of its last days profiled as a run ending
on that day profiles its newest day, and checked against its reference window as daily runs
would have kept it — the ``reference_days`` days before it, less the days that breached —
what the thresholds would have said of a user's own data, day by day, before they trust
them.

The run's row accounting stands for every day (the quarantine's reasons are not kept per
day), so the quarantine check compares equal rates here.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from featureline.core.drift import Breach, ChecksConfig, check
from featureline.core.drift_window import pooled, window
from featureline.core.metadata import present, read_metadata
from featureline.etl.config import EtlConfig
from featureline.etl.data_profile import ProfileColumns, profile_columns, profiles
from featureline.etl.incremental import EVENTS_DIR, STATE_DIR
from featureline.etl.outputs import read_as_written


@dataclass(frozen=True)
class CheckedDay:
    """One day of the history, checked against its window."""

    day: str
    events: int
    breaches: list[Breach]

    def to_json(self) -> dict[str, Any]:
        return {"day": self.day, "events": self.events,
                "breaches": [b.to_json() for b in self.breaches]}


@dataclass(frozen=True)
class OutputDays:
    """An output's stored events and examples (cached), its row accounting and the columns
    its runs profile."""

    events: DataFrame
    examples: DataFrame
    rows: dict[str, Any]
    columns: ProfileColumns


@contextmanager
def output_days(spark: SparkSession, output: str | Path, config: EtlConfig
                ) -> Iterator[OutputDays]:
    """The output's days in memory while the block runs."""
    metadata = read_metadata(output)
    events = spark.read.parquet(str(Path(output) / STATE_DIR / EVENTS_DIR)).cache()
    examples = read_as_written(spark, Path(output) / "examples").cache()
    try:
        yield OutputDays(events, examples, present(metadata.rows, metadata, "rows").model_dump(),
                         profile_columns(config, [f.model_dump() for f in metadata.features]))
    finally:
        events.unpersist()
        examples.unpersist()


def replay(spark: SparkSession, output: str | Path, config: EtlConfig,
           checks: ChecksConfig, days: int) -> list[CheckedDay]:
    """The last ``days`` days of ``output``, each checked against the days before it."""
    with output_days(spark, output, config) as kept:
        every = profiles(kept.events, kept.examples, days + checks.reference_days,
                         rows=kept.rows, **kept.columns)
    admitted, replayed = every[:-days], []
    for ours in every[-days:]:
        earlier = window(admitted, checks.reference_days)
        breaches = check(ours, pooled(earlier), checks) if earlier else []
        replayed.append(CheckedDay(ours["day"], ours["day_events"], breaches))
        if not breaches:
            admitted.append(ours)
    return replayed
