"""derive: the ``derive:`` list's features, each an expression over other features
(``core.derive``) computed as Spark columns after the aggregations (docs/ARCHITECTURE.md,
"Features as definitions").

Not an entry of ``etl.features``: the pipeline adds it last when the top-level list has
entries. It reads the other ops' continuous outputs, the aggregations' numbers and the numeric
event columns (``etl.config.derive_inputs``) before the model-ready step, and each value is a
continuous feature that may be missing. At a request time the same tree is evaluated over the
candidates (``core.model_inputs``), from the same inputs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from featureline.core.derive import DeriveSpec, SparkBackend, evaluate, references
from featureline.core.model_inputs import Served, Source
from featureline.core.transforms import STANDARDIZE
from featureline.etl.features.base import TS_MICROS, FeatureOp, FeatureSpec


class Derived(FeatureOp):
    name = "derive"
    # Read after the aggregations, whose values an incremental run computes with the fitted
    # ops' outputs: so are these.
    fitted = True

    def __init__(self, specs: Sequence[DeriveSpec], columns: Mapping[str, str]) -> None:
        """``columns``: each name an expression may read → the example column holding it."""
        super().__init__()
        self.specs = list(specs)
        self.columns = dict(columns)

    def transform(self, events: DataFrame) -> DataFrame:
        # One column after the other: an entry may read the entries before it.
        backend = SparkBackend({name: F.col(column) for name, column in self.columns.items()},
                               now_us=F.col(TS_MICROS))
        for spec in self.specs:
            events = events.withColumn(spec.name, evaluate(spec.tree, backend))
            backend.columns[spec.name] = F.col(spec.name)
        return events

    def features(self) -> list[FeatureSpec]:
        return [FeatureSpec(spec.name, "continuous", "float32", transform_hint=STANDARDIZE,
                            missing=True, derived=spec.expr) for spec in self.specs]

    def served(self, unserved: Sequence[str] = ()) -> Served:
        """Each entry from its expression, but one that reads a feature no request can
        compute (``unserved``), or an entry that does."""
        lost = set(unserved)
        served = {}
        for spec in self.specs:
            if references(spec.tree) & lost:
                lost.add(spec.name)
            else:
                served[spec.name] = Source(kind="derive", expr=spec.expr)
        return Served(served)
