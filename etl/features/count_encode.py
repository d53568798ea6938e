"""count_encode: how often a value occurs in the training split (0 when unseen)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from featureline.core.model_inputs import Served, Source
from featureline.core.transforms import LOG1P_STANDARDIZE
from featureline.etl.features.base import (
    Artifacts,
    ColumnRoles,
    FeatureOp,
    FeatureSpec,
    OpSettings,
    value_counts,
)

if TYPE_CHECKING:
    from featureline.etl.fit import Fit


def encoded_name(column: str) -> str:
    return f"{column}_count"


class CountEncodeSettings(OpSettings):
    """Each value's count in the training split (0 when unseen): <col>_count."""

    op: Literal["count_encode"]
    # The columns to count.
    columns: list[str] = Field(min_length=1)

    def build(self, roles: ColumnRoles) -> CountEncode:
        return CountEncode(self.inputs(roles))


class CountEncode(FeatureOp):
    name = "count_encode"
    fitted = True

    def __init__(self, columns: list[str]) -> None:
        super().__init__()
        self.columns = columns
        self.counts: dict[str, DataFrame] = {}

    def fit(self, train: DataFrame) -> None:
        for column in self.columns:
            counts = self.keep(value_counts(train, column))
            as_double = F.col("count").cast("double").alias("count")
            self.counts[column] = counts.select(column, as_double)

    def restore(self, fit: Fit, train: DataFrame) -> None:
        for column in self.columns:
            table = fit.table(f"count_encode/{column}")
            self.counts[column] = self.keep(table.select(
                F.col("value").alias(column), F.col("count").cast("double").alias("count")))

    def transform(self, events: DataFrame) -> DataFrame:
        for column in self.columns:
            counts = self.counts[column].withColumnRenamed("count", encoded_name(column))
            events = events.join(counts, on=column, how="left").fillna({encoded_name(column): 0.0})
        return events

    def features(self) -> list[FeatureSpec]:
        return [FeatureSpec(encoded_name(c), "continuous", "float32",
                            transform_hint=LOG1P_STANDARDIZE) for c in self.columns]

    def served(self) -> Served:
        return Served({encoded_name(c): Source(kind="count", column=c) for c in self.columns})

    def artifacts(self) -> Artifacts:
        return Artifacts(tables={
            f"count_encode/{c}": t.withColumnRenamed(c, "value").orderBy("value")
            for c, t in self.counts.items()})
