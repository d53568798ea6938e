"""categorify: contiguous int64 ids by descending training-split frequency.

The id convention of metadata.json (docs/ARCHITECTURE.md): 0 is padding, 1 is
out-of-vocabulary (unseen, null, or rarer than ``freq_threshold``); known values get 2, 3, …
in order of descending count, ties by value.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from core.metadata import FIRST_ID, OOV_ID, PADDING_ID, encoded_name
from etl.features.base import Artifacts, ColumnRoles, FeatureOp, FeatureSpec, OpSettings


class CategorifySettings(OpSettings):
    op: Literal["categorify"]
    columns: list[str] = Field(min_length=1)
    # Values seen fewer times than this in the training split map to the OOV id 1.
    freq_threshold: int = Field(default=1, ge=1)

    def encodes(self, roles: ColumnRoles) -> list[str]:
        return self.inputs(roles)

    def build(self, roles: ColumnRoles) -> Categorify:
        return Categorify(self.inputs(roles), self.freq_threshold)


class Categorify(FeatureOp):
    name = "categorify"

    def __init__(self, columns: list[str], freq_threshold: int = 1) -> None:
        super().__init__()
        self.columns = columns
        self.freq_threshold = freq_threshold
        self.vocabularies: dict[str, DataFrame] = {}
        self.sizes: dict[str, int] = {}

    def fit(self, train: DataFrame) -> None:
        for column in self.columns:
            counts = (train.where(F.col(column).isNotNull()).groupBy(column).count()
                      .where(F.col("count") >= self.freq_threshold))
            order = Window.orderBy(F.desc("count"), F.asc(column))
            vocabulary = self.keep(counts.select(
                F.col(column).alias("value"),
                (F.row_number().over(order) + (FIRST_ID - 1)).cast("long").alias("id"),
                F.col("count").cast("long").alias("count"),
            ))
            self.sizes[column] = vocabulary.count()
            self.vocabularies[column] = vocabulary

    def transform(self, events: DataFrame) -> DataFrame:
        for column in self.columns:
            vocabulary = self.vocabularies[column].select(
                F.col("value").alias(column), F.col("id").alias(encoded_name(column)))
            events = (events.join(vocabulary, on=column, how="left")
                      .fillna({encoded_name(column): OOV_ID}))
        return events

    def cardinality(self, column: str) -> int:
        """Rows the embedding table of ``column`` needs: the vocabulary plus padding and OOV."""
        return self.sizes[column] + FIRST_ID

    def features(self) -> list[FeatureSpec]:
        return [FeatureSpec(encoded_name(c), "categorical", "int64", self.cardinality(c))
                for c in self.columns]

    def artifacts(self) -> Artifacts:
        return Artifacts(
            tables={f"categorify/{c}": v.orderBy("id") for c, v in self.vocabularies.items()},
            stats={c: {"vocabulary_size": self.sizes[c], "cardinality": self.cardinality(c),
                       "freq_threshold": self.freq_threshold, "padding_id": PADDING_ID,
                       "oov_id": OOV_ID} for c in self.columns},
        )
