"""history: the user's last K items strictly before the event, most recent first, 0-padded.

The window looks at the 2K preceding rows of the user, so a history is short of K only
where more than K of the user's events share one instant: never does it leak the present.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from etl.features.base import TS_MICROS, FeatureOp, FeatureSpec
from etl.features.categorify import PADDING_ID

HISTORY = "user_hist_items"


class History(FeatureOp):
    name = "history"

    def __init__(self, k: int, item_column: str = "item_id_cat") -> None:
        self.k = k
        self.item_column = item_column

    def transform(self, events: DataFrame) -> DataFrame:
        rows = (Window.partitionBy("user_id").orderBy(TS_MICROS, self.item_column)
                .rowsBetween(-2 * self.k, -1))
        recent = F.collect_list(F.struct(F.col(TS_MICROS).alias("t"),
                                         F.col(self.item_column).alias("i"))).over(rows)
        earlier = F.filter(recent, lambda e: e["t"] < F.col(TS_MICROS))
        latest_first = F.slice(F.sort_array(earlier, asc=False), 1, self.k)
        items = F.transform(latest_first, lambda e: e["i"])
        padding = F.array_repeat(F.lit(PADDING_ID).cast("long"), F.lit(self.k) - F.size(items))
        return events.withColumn(HISTORY, F.concat(items, padding))

    def features(self) -> list[FeatureSpec]:
        return [FeatureSpec(HISTORY, "multi_hot", "int64", width=self.k, shares=self.item_column)]
