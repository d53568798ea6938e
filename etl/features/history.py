"""history: the user's last K items strictly before the event, most recent first, 0-padded.

The user's events in (time, item) order; the item ids of the 2K rows before an event are
read, less the rows that share its instant (those are not "before" it). A history is
short of K only where more than K of a user's events share one instant; it never includes
the present or the future.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from featureline.core.metadata import PADDING_ID, encoded_name
from featureline.etl.features.base import TS_MICROS, ColumnRoles, FeatureOp, FeatureSpec, OpSettings

HISTORY = "user_hist_items"


class HistorySettings(OpSettings):
    op: Literal["history"]
    k: int = Field(default=10, ge=1, le=1000)
    needs_encoded = ("item_id",)

    def build(self, roles: ColumnRoles) -> History:
        return History(self.k)


class History(FeatureOp):
    name = "history"

    def __init__(self, k: int) -> None:
        super().__init__()
        self.k = k
        self.item_column = encoded_name("item_id")

    def transform(self, events: DataFrame) -> DataFrame:
        in_order = Window.partitionBy("user_id").orderBy(TS_MICROS, self.item_column)
        by_time = Window.partitionBy("user_id").orderBy(TS_MICROS)
        # The items of the 2K rows before, most recent first, as 2K offset lookups: each costs
        # one step per row, where collecting a sliding frame gathers all 2K rows again for
        # every row (benchmarks/README.md, ETL round 4). Encoded ids are never null, so a
        # null lag is "before the user's first event".
        padding = F.lit(PADDING_ID).cast("long")
        recent = [F.coalesce(F.lag(self.item_column, offset).over(in_order), padding)
                  for offset in range(1, 2 * self.k + 1)]
        # Rows before this one at its own instant are the nearest ones: skip them. K more
        # padding ids keep the slice full when all 2K are skipped.
        same_instant_before = F.row_number().over(in_order) - F.rank().over(by_time)
        start = F.least(same_instant_before, F.lit(2 * self.k)) + 1
        return events.withColumn(HISTORY, F.slice(F.array(*recent, *[padding] * self.k),
                                                  start, self.k))

    def features(self) -> list[FeatureSpec]:
        return [FeatureSpec(HISTORY, "multi_hot", "int64", width=self.k, shares=self.item_column)]
