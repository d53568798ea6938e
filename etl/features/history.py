"""history: the user's last K items strictly before the event, most recent first, 0-padded.

The user's events in (time, item) order; the item ids of the 2K rows before an event are
collected, less the rows that share its instant (those are not "before" it). A history is
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
        # Plain id lists and positions: far cheaper than collecting (time, item) structs.
        recent = F.collect_list(self.item_column).over(in_order.rowsBetween(-2 * self.k, -1))
        same_instant_before = F.row_number().over(in_order) - F.rank().over(by_time)
        earlier = F.slice(recent, 1, F.greatest(F.size(recent) - same_instant_before, F.lit(0)))
        items = F.slice(F.reverse(earlier), 1, self.k)
        padding = F.array_repeat(F.lit(PADDING_ID).cast("long"), F.lit(self.k) - F.size(items))
        return events.withColumn(HISTORY, F.concat(items, padding))

    def features(self) -> list[FeatureSpec]:
        return [FeatureSpec(HISTORY, "multi_hot", "int64", width=self.k, shares=self.item_column)]
