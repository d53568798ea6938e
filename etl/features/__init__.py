"""Feature ops and the pipeline that runs them in the order the configuration lists them."""

from __future__ import annotations

import logging
from collections.abc import Callable

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from etl.config import (
    CategorifyOp,
    CountEncodeOp,
    CyclicTimeOp,
    EtlConfig,
    HashedCrossOp,
    HistoryOp,
    LagFeaturesOp,
    NormalizeOp,
    TargetEncodeOp,
    expand_columns,
)
from etl.features.base import LABEL, SPLIT, TRAIN, TS_MICROS, FeatureOp, FeatureSpec
from etl.features.categorify import Categorify
from etl.features.count_encode import CountEncode
from etl.features.cyclic_time import CyclicTime
from etl.features.hashed_cross import HashedCross
from etl.features.history import History
from etl.features.lag_features import LagFeatures
from etl.features.normalize import Normalize
from etl.features.target_encode import TargetEncode
from etl.short_names import assign_short_names

LABEL_SHORT_NAME = "y"

logger = logging.getLogger("featureline.etl")


def _crosses(config: EtlConfig, op: HashedCrossOp) -> list[list[str]]:
    """The crosses with selectors expanded; one left with fewer than two columns is skipped."""
    crosses = []
    for cross in op.crosses:
        columns = expand_columns(config, cross)
        if len(columns) < 2:
            logger.warning("hashed_cross %s skipped: it expands to %s", cross, columns)
        else:
            crosses.append(columns)
    return crosses


# One line per op: its config type → how to build it (selectors expanded).
OPS: dict[type, Callable[[EtlConfig, object], FeatureOp]] = {
    CategorifyOp: lambda c, op: Categorify(expand_columns(c, op.columns), op.freq_threshold),
    CountEncodeOp: lambda c, op: CountEncode(expand_columns(c, op.columns)),
    TargetEncodeOp: lambda c, op: TargetEncode(expand_columns(c, op.columns), op.folds,
                                               op.smoothing),
    LagFeaturesOp: lambda c, op: LagFeatures(op.windows),
    CyclicTimeOp: lambda c, op: CyclicTime(),
    HashedCrossOp: lambda c, op: HashedCross(_crosses(c, op), op.buckets),
    NormalizeOp: lambda c, op: Normalize(expand_columns(c, op.columns), op.fill, op.log1p),
    HistoryOp: lambda c, op: History(op.k),
}


class FeaturePipeline:
    """The configured ops; ``fit`` on the training split, then ``transform`` every split."""

    def __init__(self, config: EtlConfig) -> None:
        self.config = config
        self.ops = [OPS[type(op)](config, op) for op in config.features]
        self._overrides = {name: short for op in config.features
                           for name, short in op.short_names.items()}

    def fit_transform(self, events: DataFrame) -> DataFrame:
        """Fit every op on the training rows of ``events``, then transform all rows.

        Statistics come from the raw columns only; ops that use an earlier op's output (history
        and lag_features use the item ids categorify assigns) are stateless, so transforms
        chain in the configured order.
        """
        events = events.withColumn(TS_MICROS, F.unix_micros("ts"))
        train = events.where(F.col(SPLIT) == TRAIN)
        for op in self.ops:
            op.fit(train)
        for op in self.ops:
            events = op.transform(events)
        return events.drop(TS_MICROS)

    def features(self) -> list[FeatureSpec]:
        """Every output feature with its short name; shared ids take the owner's cardinality."""
        specs = [spec for op in self.ops for spec in op.features()]
        cardinality = {s.name: s.cardinality for s in specs}
        shorts = assign_short_names([s.name for s in specs], self._overrides,
                                    reserved={LABEL_SHORT_NAME})
        return [FeatureSpec(s.name, s.kind, s.dtype,
                            cardinality.get(s.shares) if s.shares else s.cardinality,
                            s.shares, s.width, shorts[s.name]) for s in specs]

    def release(self) -> None:
        """Free the statistics the ops cached for their transforms."""
        for op in self.ops:
            op.release()

    def op(self, kind: type[FeatureOp]) -> FeatureOp | None:
        return next((op for op in self.ops if isinstance(op, kind)), None)


__all__ = ["LABEL", "SPLIT", "FeatureOp", "FeaturePipeline", "FeatureSpec"]
