"""target_encode: smoothed mean label per value, out-of-fold on the training split.

A row whose label the fit learned from (an event before the fit's training split ended)
has its encoding from the other k-1 folds only (its fold is a hash of the event), prior
included, so it never sees its own label:

    encoding = (sum_oof + prior_oof * smoothing) / (count_oof + smoothing)

Every later row (the validation split, the days a frozen fit transforms, serving) uses the
whole training split; unseen values get the prior. So a row's encoding does not depend on
the split of the run that writes it: a day keeps its values when it leaves the validation
split (docs/ARCHITECTURE.md, "Fits").
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Literal

from pydantic import Field
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from featureline.core.model_inputs import Served, Source
from featureline.etl.features.base import (
    LABEL,
    SPLIT,
    TRAIN,
    TS_MICROS,
    Artifacts,
    ColumnRoles,
    FeatureOp,
    FeatureSpec,
    OpSettings,
)

if TYPE_CHECKING:
    from featureline.etl.fit import Fit

FOLD = "_fold"
# The artifact tables of the per-(value, fold) sums, one per column.
FOLDS_TABLE = "target_encode_folds"
# The columns that identify an event (exact duplicates are removed before features).
EVENT_KEY = ("user_id", "item_id", "event_type", TS_MICROS)


def encoded_name(column: str) -> str:
    return f"{column}_te"


def fold_of_event(folds: int) -> Column:
    """The fold of an event: a stable hash of its identity, so reruns agree."""
    return F.pmod(F.xxhash64(*EVENT_KEY), F.lit(folds)).cast("int")


def _smoothed(total: Column, count: Column, prior: Column, smoothing: float) -> Column:
    denominator = count + F.lit(smoothing)
    return F.when(denominator > 0, (total + prior * smoothing) / denominator).otherwise(prior)


class TargetEncodeSettings(OpSettings):
    """The smoothed out-of-fold mean of the label per value: <col>_te."""

    op: Literal["target_encode"]
    # The columns to encode.
    columns: list[str] = Field(min_length=1)
    # Training rows are encoded from the other folds' labels (a row never sees its own).
    folds: int = Field(default=5, ge=2)
    # Weight of the prior (the label's mean) in each value's mean, in rows.
    smoothing: float = Field(default=20.0, ge=0)

    def build(self, roles: ColumnRoles) -> TargetEncode:
        return TargetEncode(self.inputs(roles), self.folds, self.smoothing)


class TargetEncode(FeatureOp):
    name = "target_encode"
    fitted = True

    def __init__(self, columns: list[str], folds: int = 5, smoothing: float = 20.0) -> None:
        super().__init__()
        self.columns = columns
        self.folds = folds
        self.smoothing = smoothing
        self.prior = 0.0
        self.fold_priors: dict[int, float] = {}
        # Where the fit's training split ended: the rows before it are encoded out of fold.
        # None: the run's own training split (a fit recorded without it).
        self.trained_until: datetime | None = None
        self.by_value: dict[str, DataFrame] = {}
        self.by_value_fold: dict[str, DataFrame] = {}

    def fit(self, train: DataFrame) -> None:
        """One pass over the training rows per column: label sum and count by (value, fold).
        The per-value statistics and the fold priors are sums of those (exact: the label is
        0 or 1), not further passes (benchmarks/README.md, ETL round 5)."""
        train = train.withColumn(FOLD, fold_of_event(self.folds))
        stats = [F.sum(LABEL).cast("double").alias("s"), F.count(F.lit(1)).alias("n")]
        totals = [F.sum("s").alias("s"), F.sum("n").alias("n")]
        by_fold = {c: self.keep(train.groupBy(c, FOLD).agg(*stats)) for c in self.columns}
        # Every training row is in each column's table (a row without a value under null), so
        # any one gives the fold priors; only rows with a value give encodings.
        per_fold = {row[FOLD]: (row["s"], row["n"]) for row in
                    by_fold[self.columns[0]].groupBy(FOLD).agg(*totals).collect()}
        for column, table in by_fold.items():
            known = table.where(F.col(column).isNotNull())
            self.by_value_fold[column] = known
            self.by_value[column] = self.keep(known.groupBy(column).agg(*totals))
        total = sum(s for s, _ in per_fold.values())
        count = sum(n for _, n in per_fold.values())
        self.prior = total / count if count else 0.0
        for fold in range(self.folds):
            s, n = per_fold.get(fold, (0, 0))
            self.fold_priors[fold] = (total - s) / (count - n) if count > n else self.prior

    def restore(self, fit: Fit, train: DataFrame) -> None:
        """The per-value and per-(value, fold) sums the fit wrote, its prior and fold
        priors: a training row of this run is encoded from the fit's other folds."""
        stats = fit.op_stats(self.name)
        self.trained_until = (datetime.fromisoformat(fit.trained_until)
                              if fit.trained_until is not None else None)
        self.prior = float(stats["prior"])
        self.fold_priors = {int(fold): float(p) for fold, p in stats["fold_priors"].items()}
        for column in self.columns:
            whole = fit.table(f"target_encode/{column}")
            self.by_value[column] = self.keep(whole.select(
                F.col("value").alias(column), F.col("label_sum").alias("s"),
                F.col("count").alias("n")))
            folds = fit.table(f"{FOLDS_TABLE}/{column}")
            self.by_value_fold[column] = self.keep(folds.select(
                F.col("value").alias(column), F.col("fold").alias(FOLD),
                F.col("label_sum").alias("s"), F.col("count").alias("n")))

    def transform(self, events: DataFrame) -> DataFrame:
        events = events.withColumn(FOLD, fold_of_event(self.folds))
        fold_prior = F.create_map(*[F.lit(x) for f, p in self.fold_priors.items() for x in (f, p)])
        is_train = (F.col("ts") < F.lit(self.trained_until) if self.trained_until is not None
                    else F.col(SPLIT) == TRAIN)
        for column in self.columns:
            full = self.by_value[column].select(column, F.col("s").alias("_s"),
                                                F.col("n").alias("_n"))
            in_fold = self.by_value_fold[column].select(column, FOLD, F.col("s").alias("_sf"),
                                                        F.col("n").alias("_nf"))
            joined = (events.join(full, on=column, how="left")
                      .join(in_fold, on=[column, FOLD], how="left")
                      .fillna({"_s": 0.0, "_n": 0, "_sf": 0.0, "_nf": 0}))
            out_of_fold = _smoothed(F.col("_s") - F.col("_sf"), F.col("_n") - F.col("_nf"),
                                    fold_prior[F.col(FOLD)], self.smoothing)
            whole = _smoothed(F.col("_s"), F.col("_n"), F.lit(self.prior), self.smoothing)
            events = (joined.withColumn(encoded_name(column),
                                        F.when(is_train, out_of_fold).otherwise(whole))
                      .drop("_s", "_n", "_sf", "_nf"))
        return events.drop(FOLD)

    def features(self) -> list[FeatureSpec]:
        return [FeatureSpec(encoded_name(c), "continuous", "float32") for c in self.columns]

    def served(self) -> Served:
        # At a request time every row is after the fit's training split: the whole split's
        # encoding (the artifact's ``encoding`` column).
        return Served({encoded_name(c): Source(kind="target", column=c) for c in self.columns})

    def artifacts(self) -> Artifacts:
        prior = F.lit(self.prior)
        tables = {
            f"target_encode/{c}": t.select(
                F.col(c).alias("value"), F.col("s").alias("label_sum"),
                F.col("n").alias("count"),
                _smoothed(F.col("s"), F.col("n"), prior, self.smoothing).alias("encoding"),
            ).orderBy("value")
            for c, t in self.by_value.items()
        }
        # Per (value, fold): what a frozen fit encodes a later run's training rows from.
        tables.update({
            f"{FOLDS_TABLE}/{c}": t.select(
                F.col(c).alias("value"), F.col(FOLD).alias("fold"),
                F.col("s").alias("label_sum"), F.col("n").alias("count"),
            ).orderBy("value", "fold")
            for c, t in self.by_value_fold.items()
        })
        stats = {"prior": self.prior, "smoothing": self.smoothing, "folds": self.folds,
                 "fold_priors": {str(f): p for f, p in sorted(self.fold_priors.items())}}
        return Artifacts(tables=tables, stats=stats)
