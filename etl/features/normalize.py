"""normalize: fill missing values, optionally log1p, standardise with training statistics."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from featureline.core.model_inputs import Served, Source
from featureline.core.transforms import NONE
from featureline.etl.features.base import (
    Artifacts,
    ColumnRoles,
    FeatureOp,
    FeatureSpec,
    OpSettings,
    population_std,
)

if TYPE_CHECKING:
    from featureline.etl.fit import Fit


def encoded_name(column: str) -> str:
    return f"{column}_norm"


class NormalizeSettings(OpSettings):
    """Continuous columns filled, optionally log1p-ed, and standardised: <col>_norm."""

    op: Literal["normalize"]
    # The columns to normalise (raw columns, @continuous).
    columns: list[str] = Field(min_length=1)
    # What a missing value becomes, from the training split.
    fill: Literal["mean", "median", "zero"] = "mean"
    # log1p before standardising (negative values are clipped to 0 first).
    log1p: bool = True
    input_kind = "continuous"

    def build(self, roles: ColumnRoles) -> Normalize:
        return Normalize(self.inputs(roles), self.fill, self.log1p)


class Normalize(FeatureOp):
    name = "normalize"
    fitted = True

    def __init__(self, columns: list[str], fill: str = "mean", log1p: bool = True) -> None:
        super().__init__()
        self.columns = columns
        self.fill = fill
        self.log1p = log1p
        self.stats: dict[str, dict[str, float]] = {}

    def _shaped(self, column: Column, fill: float) -> Column:
        filled = F.coalesce(column.cast("double"), F.lit(fill))
        # log1p of a negative number below -1 is undefined; such values count as 0.
        return F.log1p(F.greatest(filled, F.lit(0.0))) if self.log1p else filled

    def fit(self, train: DataFrame) -> None:
        if not self.columns:  # a log without numeric columns: nothing to normalise
            return
        fills = {"mean": F.mean, "median": F.median}
        if self.fill in fills:
            row = train.agg(*[fills[self.fill](c).alias(c) for c in self.columns]).collect()[0]
            fill_values = {c: float(row[c]) if row[c] is not None else 0.0 for c in self.columns}
        else:
            fill_values = dict.fromkeys(self.columns, 0.0)
        shaped = [self._shaped(F.col(c), fill_values[c]) for c in self.columns]
        row = train.agg(*[x for c, s in zip(self.columns, shaped, strict=True)
                          for x in (F.mean(s).alias(f"{c}_mean"),
                                    population_std(s).alias(f"{c}_std"))]).collect()[0]
        for column in self.columns:
            mean = row[f"{column}_mean"] or 0.0
            std = row[f"{column}_std"] or 0.0
            self.stats[column] = {"fill": fill_values[column], "mean": mean,
                                  "std": std if std > 0 else 1.0}

    def restore(self, fit: Fit, train: DataFrame) -> None:
        fitted = fit.op_stats(self.name)["columns"]
        self.stats = {column: dict(fitted[column]) for column in self.columns}

    def transform(self, events: DataFrame) -> DataFrame:
        return events.withColumns({
            encoded_name(c): (self._shaped(F.col(c), s["fill"]) - s["mean"]) / s["std"]
            for c, s in self.stats.items()
        })

    def features(self) -> list[FeatureSpec]:
        # Already model-ready: the op's own transform, described like the others.
        return [FeatureSpec(encoded_name(c), "continuous", "float32", transform_hint=NONE,
                            transform={"name": "normalize", "source": c, "log1p": self.log1p,
                                       **self.stats.get(c, {})})
                for c in self.columns]

    def served(self) -> Served:
        return Served({encoded_name(c): Source(kind="normalize", column=c)
                       for c in self.columns})

    def artifacts(self) -> Artifacts:
        return Artifacts(stats={"log1p": self.log1p, "fill_strategy": self.fill,
                                "columns": self.stats})
