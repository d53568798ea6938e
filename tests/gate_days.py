"""The validation gate's tests' days: an output's events and examples in memory, and the
profile a run ending on one of its days writes, with a fault applied to that day."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from featureline.core.metadata import present, read_metadata
from featureline.etl.config import EtlConfig
from featureline.etl.data_profile import ProfileColumns, profile, profile_columns
from featureline.etl.outputs import read_as_written

Fault = Callable[[DataFrame], DataFrame]


@dataclass(frozen=True)
class OutputDays:
    """An output's stored events and examples (cached), its row accounting and the columns
    its runs profile."""

    events: DataFrame
    examples: DataFrame
    rows: dict[str, Any]
    columns: ProfileColumns

    def days(self) -> list[str]:
        return sorted(str(row[0]) for row in
                      self.events.select(F.to_date("ts")).distinct().collect())

    def day_profile(self, day: str, fault: Fault | None = None,
                    rows: dict[str, Any] | None = None) -> dict[str, Any]:
        """The profile a run ending on ``day`` writes, with ``fault`` applied to that day's
        events (and their examples, where it drops rows)."""
        events, examples = self.events, self.examples
        if fault is not None:
            on_day = F.to_date("ts") == F.lit(day).cast("date")
            changed = fault(events.where(on_day))
            events = events.where(~on_day).unionByName(changed)
            examples = examples.join(changed.select("user_id", "item_id", "ts").distinct(),
                                     ["user_id", "item_id", "ts"], "left_semi") \
                .unionByName(examples.where(~on_day))
        until = F.to_date("ts") <= F.lit(day).cast("date")
        return profile(events.where(until), examples.where(until), rows=rows or self.rows,
                       **self.columns)


@contextmanager
def output_days(spark: SparkSession, output: Path, config: EtlConfig) -> Iterator[OutputDays]:
    """The output's days in memory while the block runs."""
    metadata = read_metadata(output)
    events = spark.read.parquet(str(output / "state" / "events")).cache()
    examples = read_as_written(spark, output / "examples").cache()
    try:
        yield OutputDays(events, examples, present(metadata.rows, metadata, "rows").model_dump(),
                         profile_columns(config, [f.model_dump() for f in metadata.features]))
    finally:
        events.unpersist()
        examples.unpersist()
