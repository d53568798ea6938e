"""hashed_cross: ids for combinations of two or more columns, xxhash64 mod ``buckets``.

Ids start at 2 like categorify's, so 0 stays padding for every categorical feature.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from etl.features.base import FeatureOp, FeatureSpec
from etl.features.categorify import FIRST_ID


def cross_name(columns: list[str]) -> str:
    return "_x_".join(columns)


class HashedCross(FeatureOp):
    name = "hashed_cross"

    def __init__(self, crosses: list[list[str]], buckets: int) -> None:
        self.crosses = crosses
        self.buckets = buckets

    def transform(self, events: DataFrame) -> DataFrame:
        return events.withColumns({
            cross_name(columns): F.pmod(F.xxhash64(*columns), F.lit(self.buckets)) + FIRST_ID
            for columns in self.crosses
        })

    def features(self) -> list[FeatureSpec]:
        return [FeatureSpec(cross_name(c), "categorical", "int64", self.buckets + FIRST_ID)
                for c in self.crosses]
