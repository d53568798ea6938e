"""history: the user's last K items strictly before the event, most recent first, 0-padded.

The user's events in (time, item) order (the item as text, as the engine's ``last_k`` orders
a tie in time); the item ids of the 2K rows before an event are
read, less the rows that share its instant (those are not "before" it). A history is
short of K only where more than K of a user's events share one instant; it never includes
the present or the future.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from featureline.core.aggregations import FeatureSpec as AggregateSpec
from featureline.core.metadata import PADDING_ID, encoded_name
from featureline.core.model_inputs import USER_INPUTS, Served, Source
from featureline.etl.features.base import (
    TS_MICROS,
    ColumnRoles,
    FeatureOp,
    FeatureSpec,
    Lookback,
    OpSettings,
)

HISTORY = "user_hist_items"
# Up to this K the earlier items are read by 2K offset lookups (lag), cheaper than a sliding
# frame, which gathers its 2K rows again for every row; above it the lookups cost more
# (at 10M events, K=10: the feature plan 57 s vs 67 s; K=32: 1.5x the frame's time, K=1000:
# 20x; benchmarks/README.md, ETL round 4).
OFFSET_LOOKUPS_UP_TO_K = 16


class HistorySettings(OpSettings):
    """The user's last items strictly before the event, latest first: user_hist_items."""

    op: Literal["history"]
    # How many items.
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
        in_order = Window.partitionBy("user_id").orderBy(TS_MICROS, "item_id")
        by_time = Window.partitionBy("user_id").orderBy(TS_MICROS)
        # Rows before this one at its own instant are the nearest ones: they are skipped.
        same_instant_before = F.row_number().over(in_order) - F.rank().over(by_time)
        padding = F.lit(PADDING_ID).cast("long")
        if self.k <= OFFSET_LOOKUPS_UP_TO_K:
            # The 2K earlier items, most recent first, one offset lookup (lag) each; encoded
            # ids are never null, so a null is "before the user's first event". K more
            # padding ids keep the slice full when all 2K are skipped.
            recent = [F.coalesce(F.lag(self.item_column, offset).over(in_order), padding)
                      for offset in range(1, 2 * self.k + 1)]
            start = F.least(same_instant_before, F.lit(2 * self.k)) + 1
            items = F.slice(F.array(*recent, *[padding] * self.k), start, self.k)
        else:
            # Plain id lists and positions: far cheaper than collecting (time, item) structs.
            frame = F.collect_list(self.item_column).over(in_order.rowsBetween(-2 * self.k, -1))
            earlier = F.slice(frame, 1, F.greatest(F.size(frame) - same_instant_before,
                                                   F.lit(0)))
            items = F.slice(F.reverse(earlier), 1, self.k)
            items = F.concat(items, F.array_repeat(padding, F.lit(self.k) - F.size(items)))
        return events.withColumn(HISTORY, items)

    def served(self) -> Served:
        """The engine's last K items of the user, as ids."""
        return Served({HISTORY: Source(kind="ids", group=USER_INPUTS, output=HISTORY,
                                       column="item_id", width=self.k)},
                      {USER_INPUTS: [AggregateSpec.model_validate(
                          {"op": "last_k", "column": "item_id", "k": self.k,
                           "name": HISTORY})]})

    def lookback(self) -> Lookback:
        # The 2K rows before the event's, whichever formulation reads them: their items.
        return Lookback(rows=2 * self.k, columns=frozenset({"item_id"}))

    def features(self) -> list[FeatureSpec]:
        return [FeatureSpec(HISTORY, "multi_hot", "int64", width=self.k, shares=self.item_column)]
