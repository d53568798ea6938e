"""hashed_cross: ids for combinations of two or more columns, xxhash64 mod ``buckets``.

Ids start at 2 like categorify's, so 0 stays padding for every categorical feature.
"""

from __future__ import annotations

import logging
from typing import Literal

from pydantic import Field
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from featureline.core.metadata import FIRST_ID
from featureline.core.model_inputs import Served, Source
from featureline.etl.features.base import ColumnRoles, FeatureOp, FeatureSpec, OpSettings

logger = logging.getLogger("featureline.etl")


def cross_name(columns: list[str]) -> str:
    return "_x_".join(columns)


class HashedCrossSettings(OpSettings):
    """Crosses of categorical columns hashed into buckets: <a>_x_<b>."""

    op: Literal["hashed_cross"]
    # Each cross's columns; a cross with fewer than two columns is skipped.
    crosses: list[list[str]] = Field(min_length=1)
    # xxhash64 of the values modulo this (+2: ids 0 and 1 stay reserved).
    buckets: int = Field(default=100_000, ge=2)

    def inputs(self, roles: ColumnRoles) -> list[str]:
        return [column for cross in self.crosses for column in roles.expand(cross)]

    def build(self, roles: ColumnRoles) -> HashedCross:
        """The crosses with selectors expanded; one left with fewer than two columns is
        skipped."""
        crosses = []
        for cross in self.crosses:
            columns = roles.expand(cross)
            if len(columns) < 2:
                logger.warning("hashed_cross %s skipped: it expands to %s", cross, columns)
            else:
                crosses.append(columns)
        return HashedCross(crosses, self.buckets)


class HashedCross(FeatureOp):
    name = "hashed_cross"

    def __init__(self, crosses: list[list[str]], buckets: int) -> None:
        super().__init__()
        self.crosses = crosses
        self.buckets = buckets

    def transform(self, events: DataFrame) -> DataFrame:
        return events.withColumns({
            cross_name(columns): F.pmod(F.xxhash64(*columns), F.lit(self.buckets)) + FIRST_ID
            for columns in self.crosses
        })

    def served(self) -> Served:
        return Served({cross_name(c): Source(kind="cross", columns=c, buckets=self.buckets)
                       for c in self.crosses})

    def features(self) -> list[FeatureSpec]:
        return [FeatureSpec(cross_name(c), "categorical", "int64", self.buckets + FIRST_ID)
                for c in self.crosses]
