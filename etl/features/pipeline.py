"""The feature pipeline: the configured ops, run in the order the configuration lists them."""

from __future__ import annotations

import dataclasses
import functools
import operator
from datetime import datetime

from pyspark import StorageLevel
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from featureline.core.model_inputs import ModelInputs, Served, attribute_sources, combined
from featureline.etl.config import EtlConfig, derive_inputs, encoded_columns
from featureline.etl.features.aggregate import Aggregations
from featureline.etl.features.base import (
    SPLIT,
    TRAIN,
    TS_MICROS,
    FeatureOp,
    FeatureSpec,
    Lookback,
    with_time_key,
)
from featureline.etl.features.categorify import Categorify
from featureline.etl.features.derived import Derived
from featureline.etl.features.model_ready import ModelReady
from featureline.etl.features.target_encode import TargetEncode
from featureline.etl.fit import Fit
from featureline.etl.short_names import assign_short_names

LABEL_SHORT_NAME = "y"


class FeaturePipeline:
    """The configured ops; ``fit`` on the training split (or take a given fit's statistics),
    then ``transform`` every split."""

    def __init__(self, config: EtlConfig, frozen: Fit | None = None) -> None:
        self.config = config
        # A fit to transform with instead of fitting (docs/ARCHITECTURE.md, "Fits").
        self.frozen = frozen
        roles = config.column_roles()
        self.ops = [op.build(roles) for op in config.features]
        # The ids the ops without fitted statistics read (their transforms' inputs).
        self._kept_ids = sorted({column for settings, op in zip(config.features, self.ops,
                                                                 strict=True)
                                 if not op.fitted for column in settings.needs_encoded})
        if config.aggregations:
            self.ops.append(Aggregations(config.aggregations, config.event_contract().numeric,
                                         encoded_columns(config)))
        if config.derive:
            self.ops.append(Derived(config.derive, derive_inputs(config)))
        self._overrides = {name: short for op in config.features
                           for name, short in op.short_names.items()}
        # Checks etl.model_ready against the ops' feature names before any data is read.
        self.model_ready = ModelReady(self._op_features(), config.model_ready)
        self._featured: DataFrame | None = None

    def fit(self, events: DataFrame, trained_until: datetime | None = None) -> DataFrame:
        """Fit every op on the training rows of ``events`` (those before ``trained_until``,
        where the validation split starts); ``events`` come back with the time key the
        windows order by. Statistics come from the raw columns only. With a kept fit,
        categorify numbers the values of every row, the validation split's too: a value gets
        its id in the run that first sees it, so a row's ids never change when the split
        moves past it (docs/ARCHITECTURE.md, "Fits")."""
        events = with_time_key(events)
        train = events.where(F.col(SPLIT) == TRAIN)
        for op in self.ops:
            if self.frozen is None:
                if isinstance(op, TargetEncode):
                    op.trained_until = trained_until
                op.fit(train)
            else:
                op.restore(self.frozen, events if isinstance(op, Categorify) else train)
        return events

    def fit_transform(self, events: DataFrame, trained_until: datetime | None = None
                      ) -> DataFrame:
        """Fit every op on the training rows of ``events``, then transform all rows.

        Ops that use an earlier op's output (history and lag_features use the item ids
        categorify assigns) are not fitted, so transforms chain in the configured order.
        Then the model-ready step fits on the derived features of the training rows, so those
        are computed once and cached for the writes after it.
        """
        events = self.fit(events, trained_until)
        source = events
        for op in self.ops:
            if isinstance(op, Aggregations):
                events = op.transform(events, self._with_ids(source) if op.reads_ids else source)
            else:
                events = op.transform(events)
        return self._model_ready(events)

    def _with_ids(self, events: DataFrame, columns: list[str] | None = None) -> DataFrame:
        """``events`` with categorify's ids (none without categorify): of ``columns``, or
        of every column it encodes."""
        categorify = self.op(Categorify)
        if not isinstance(categorify, Categorify):
            return events
        return categorify.transform(events, columns)

    def kept_features(self) -> list[str]:
        """The outputs of the ops without fitted statistics: an event's values never move
        once computed (docs/ARCHITECTURE.md, "Incremental runs")."""
        return [spec.name for op in self.ops if not op.fitted for spec in op.features()]

    def lookback(self) -> Lookback:
        """The earlier events of a user the kept features read."""
        return functools.reduce(operator.or_, (op.lookback() for op in self.ops), Lookback())

    def transform_kept(self, rows: DataFrame) -> DataFrame:
        """``rows`` (with the time key) and the kept features: the categorify ids the window
        ops read are added, then dropped again (a join per id: only those read)."""
        given = rows.columns
        rows = self._with_ids(rows, self._kept_ids)
        for op in self.ops:
            if not op.fitted:
                rows = op.transform(rows)
        return rows.select(*given, *self.kept_features())

    def transform_fitted(self, rows: DataFrame) -> DataFrame:
        """The fitted ops' outputs for ``rows`` that hold the kept features, then the
        model-ready step: what ``fit_transform`` gives for the same events."""
        for op in self.ops:
            if op.fitted:
                rows = op.transform(rows)
        return self._model_ready(rows)

    def _model_ready(self, events: DataFrame) -> DataFrame:
        featured = events.drop(TS_MICROS).persist(StorageLevel.MEMORY_AND_DISK)
        self._featured = featured
        if self.frozen is None:
            self.model_ready.fit(featured.where(F.col(SPLIT) == TRAIN))
        else:
            self.model_ready.restore(self.frozen.op_stats("model_ready"))
        return self.model_ready.transform(featured)

    def featured(self) -> DataFrame:
        """The rows the last transform cached: every op's raw output, before the model-ready
        step."""
        assert self._featured is not None, "transform first"
        return self._featured

    def _op_features(self) -> list[FeatureSpec]:
        return [spec for op in self.ops for spec in op.features()]

    def features(self) -> list[FeatureSpec]:
        """Every output feature with its short name; shared ids take the owner's cardinality."""
        specs = self.model_ready.features(self._op_features())
        cardinality = {s.name: s.cardinality for s in specs}
        shorts = assign_short_names([s.name for s in specs], self._overrides,
                                    reserved={LABEL_SHORT_NAME})
        return [dataclasses.replace(
                    s, short_name=shorts[s.name],
                    cardinality=cardinality.get(s.shares) if s.shares else s.cardinality)
                for s in specs]

    def inputs(self) -> ModelInputs:
        """How each feature is computed at a request time: the ops' sources, the input
        groups they and the user and item attributes read (``core.model_inputs``), and the
        features no source computes."""
        served: list[Served] = []
        unserved: list[str] = []
        for op in self.ops:
            # A derived feature is unserved where it reads an unserved one.
            one = op.served(unserved) if isinstance(op, Derived) else op.served()
            if one is not None:
                served.append(one)
            unserved += [spec.name for spec in op.features()
                         if one is None or spec.name not in one.features]
        served.append(attribute_sources(self.config.source.declared_roles()))
        return combined(served, unserved)

    def release(self) -> None:
        """Free the statistics the ops cached for their transforms, and the featured rows."""
        for op in self.ops:
            op.release()
        if self._featured is not None:
            self._featured.unpersist()
            self._featured = None

    def op(self, kind: type[FeatureOp]) -> FeatureOp | None:
        return next((op for op in self.ops if isinstance(op, kind)), None)
