"""aggregations: the ``aggregations:`` spec's values at each example's own time, strictly
before it (docs/ARCHITECTURE.md, "Features as definitions"), as example columns named
``<group>__<feature>``.

Not an entry of ``etl.features``: the pipeline adds it after the configured ops when the
top-level spec has groups, so it reads the ids categorify assigned. Numbers are continuous
features (an operation that counts with a log1p transform; one with no value without events,
``Operation.may_be_missing``, can be missing); ``last`` of a text column is that column's
id, ``last_k`` its ids, newest first and padded, sharing the column's embedding table. The
same backfill computes each group's values at its daily snapshots' times
(``etl.aggregations.snapshot_anchors``), which the job writes for Feast: one pass of the
frames serves both.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from featureline.core.aggregations import ENTITIES, AggregateFeature, GroupSpec
from featureline.core.metadata import PADDING_ID, encoded_name
from featureline.core.model_inputs import Served, Source
from featureline.core.transforms import LOG1P_STANDARDIZE, STANDARDIZE
from featureline.etl.aggregations import (
    day_partials,
    events_cut,
    group_snapshots,
    group_values,
    on_days,
    reach,
    snapshot_anchors,
)
from featureline.etl.features.base import (
    LABEL,
    TS_MICROS,
    FeatureOp,
    FeatureSpec,
    plans_for_gpu,
)


class Aggregations(FeatureOp):
    name = "aggregations"
    # Not kept per user by an incremental run: a group's value at an event reads other
    # users' events (an item's, a category's), so a run computes it as it does the fitted
    # ops' outputs — from a day on (:attr:`since`) where it keeps its fit.
    fitted = True

    def __init__(self, groups: Sequence[GroupSpec], numeric: Sequence[str],
                 encoded: Sequence[str], computed: Collection[str] | None = None) -> None:
        """``computed``: the outputs (``group:output``) a transform computes (every one
        without): a spec change's run computes only those that changed."""
        super().__init__()
        self.groups = list(groups)
        self.numeric = list(numeric)
        self.encoded = list(encoded)
        self.outputs = [feature for group in self.groups for feature in group.outputs()]
        self.computed = [feature for feature in self.outputs
                         if computed is None or feature.qualified in computed]
        # What the last transform computed: the events' cut (µs, after the latest), per
        # group its values at every anchor and its snapshot days.
        self.cut = 0
        self.values: dict[str, tuple[DataFrame, DataFrame]] = {}
        # The events it read (cached): what the job's tiles of its groups read too.
        self.rows: DataFrame | None = None
        # Set by an incremental run keeping its fit (µs, a midnight): the values before it
        # are the output's, so only the examples and snapshots from it on are computed; per
        # group, the day partials of the days before it (the output's).
        self.since: int | None = None
        self.days_before: dict[str, DataFrame] = {}
        # What the last transform computed per group: the day partials from :attr:`since`
        # on (every day's without it), which the job keeps in the state.
        self.day_partials: dict[str, DataFrame] = {}

    def _as_ids(self, feature: AggregateFeature) -> bool:
        return feature.operation().ordered and feature.spec.column in self.encoded

    @property
    def reads_ids(self) -> bool:
        """Whether an output reads categorify's ids (last or last_k of an encoded column)."""
        return any(self._as_ids(feature) for feature in self.outputs)

    def transform(self, events: DataFrame, source: DataFrame | None = None) -> DataFrame:
        """``events`` with every output (those from :attr:`since` on, where set: the rows a
        day's run writes); the groups read ``source`` where given: the same
        events before the other ops (with categorify's ids where :attr:`reads_ids`) — the
        columns they read of ``events`` would compute its whole plan again, its windows and
        joins included, for the cached copy below."""
        # The columns the groups read, computed once: every output's plan starts from them.
        reads = {column: F.struct(F.col(column).alias("raw"),
                                  F.col(encoded_name(column)).alias("id"))
                 for column in self.encoded}
        groups = self.computed_groups()
        needed = {TS_MICROS, LABEL, *(encoded_name(c) for c in self.encoded),
                  *(key for group in groups for key in group.keys),
                  *(column for group in groups for feature in group.features
                    for column in feature.columns())}
        # Cached: each hop's tiles, the frames and the anchors read these rows.
        rows = events if source is None else source
        narrow = self.rows = self.keep(rows.select(*sorted(needed & set(rows.columns))))
        self.cut = events_cut(narrow)
        # Every group's values go onto the events' distinct keys and times first, and onto
        # the events themselves in one join (docs/ARCHITECTURE.md, "The backfill, the
        # tiles, serving").
        keys = list(dict.fromkeys([ENTITIES["user"],
                                   *(key for group in groups for key in group.keys)]))
        since = self.since
        queried = narrow if since is None else narrow.where(F.col(TS_MICROS) >= since)
        values = queried.select(*keys, TS_MICROS).distinct()
        for group in groups:
            days = snapshot_anchors(narrow, group, self.cut, since)
            at = self._cut(self._group_values(narrow, queried, days, group, reads))
            self.values[group.name] = (at, days)
            values = values.join(at, on=[*group.keys, TS_MICROS], how="left")
            partials = day_partials(queried, group, self.numeric, reads)
            if partials is not None:
                self.day_partials[group.name] = partials
        if since is not None:  # the earlier rows' values are the output's
            events = events.where(F.col(TS_MICROS) >= since)
        return _joined(events, values, keys).withColumns(
            {f.column_name: self._column(f) for f in self.computed})

    def computed_groups(self) -> list[GroupSpec]:
        """The groups with an output a transform computes."""
        return [group for group in self.groups
                if any(feature.group == group.name for feature in self.computed)]

    def computed_of(self, group: GroupSpec) -> list[AggregateFeature]:
        return [feature for feature in self.computed if feature.group == group.name]

    def _group_values(self, narrow: DataFrame, queried: DataFrame, days: DataFrame,
                      group: GroupSpec, reads: Mapping[str, Column]) -> DataFrame:
        """The group's values at the ``queried`` events' times and at its snapshot ``days``.
        From :attr:`since` on: its outputs on days (``etl.aggregations.on_days``) from the
        events from then on and the day partials before (:attr:`days_before`), the others
        from the events from where their longest window starts then
        (``etl.aggregations.reach``)."""
        anchors = queried.select(*group.keys, TS_MICROS).unionByName(days).distinct()
        if self.since is None:
            return group_values(narrow, anchors, group, self.numeric, reads,
                                outputs=self.computed_of(group))
        before = self.days_before.get(group.name)
        on = [f for f in group.outputs() if before is not None and on_days(f)]
        rest = [f for f in group.outputs() if f not in on]
        parts = []
        if on:
            parts.append(group_values(queried, anchors, group, self.numeric, reads,
                                      outputs=on, days=before))
        if rest:
            start = reach(rest, self.since)
            read = narrow if start is None else narrow.where(F.col(TS_MICROS) >= start)
            parts.append(group_values(read, anchors, group, self.numeric, reads,
                                      outputs=rest))
        at = parts[0]
        for part in parts[1:]:
            at = at.join(part, on=[*group.keys, TS_MICROS], how="left")
        return at

    def snapshots(self, group: GroupSpec) -> DataFrame:
        """The group's daily snapshots as of the last transform's events, for Feast
        (``etl.aggregations.group_snapshots``); after :attr:`since` only, where set."""
        values, days = self.values[group.name]
        return group_snapshots(values, days, group, self.computed_of(group))

    def _cut(self, values: DataFrame) -> DataFrame:
        """A group's values, computed once: every later action of the job (the model-ready
        fit, each write) would plan the group's unions and frames again under its own plan,
        and an incremental run's plan with them outgrows the driver's memory. On the CPU a
        local checkpoint; under the RAPIDS Accelerator, which runs no scan of a checkpoint,
        a cache."""
        if plans_for_gpu(values.sparkSession):
            return self.keep(values)
        return values.localCheckpoint()

    def _column(self, feature: AggregateFeature) -> Column:
        value = F.col(feature.column_name)
        padding = F.lit(PADDING_ID).cast("long")
        length = feature.operation().list_length()
        if length is not None:
            ids = F.transform(value, lambda pair: pair["id"])
            return F.concat(ids, F.array_repeat(padding, F.lit(length) - F.size(ids)))
        if self._as_ids(feature):
            return F.coalesce(value["id"], padding)
        return value.cast("double")

    def features(self) -> list[FeatureSpec]:
        return [self._spec(feature) for feature in self.outputs]

    def served(self) -> Served:
        """Every output from its group's tiles; a last or last_k of an encoded column as
        ids."""
        features = {}
        for feature in self.outputs:
            spec = feature.spec
            ids = self._as_ids(feature)
            features[feature.column_name] = Source(
                kind="ids" if ids else "value", group=feature.group, output=feature.output,
                column=spec.column if ids else None,
                width=feature.operation().list_length() if ids else None)
        return Served(features)

    def _spec(self, feature: AggregateFeature) -> FeatureSpec:
        spec = feature.spec
        described = _description(feature)
        length = feature.operation().list_length()
        if length is not None:
            return FeatureSpec(feature.column_name, "multi_hot", "int64", width=length,
                               shares=encoded_name(spec.column or ""), aggregation=described)
        if self._as_ids(feature):
            return FeatureSpec(feature.column_name, "categorical", "int64",
                               shares=encoded_name(spec.column or ""), aggregation=described)
        return FeatureSpec(
            feature.column_name, "continuous", "float32",
            transform_hint=LOG1P_STANDARDIZE if feature.operation().counts else STANDARDIZE,
            missing=feature.operation().may_be_missing, aggregation=described)


def _joined(events: DataFrame, values: DataFrame, keys: Sequence[str]) -> DataFrame:
    """``events`` with ``values`` (a row per distinct ``keys`` and ``TS_MICROS`` of theirs)
    beside them. A key other than the entities' (the user and the item, which validation
    requires) may be missing (a context column): matched null to null, as its distinct rows
    hold it. On the user as the events are partitioned (by the session's
    ``spark.sql.requireAllClusterKeysForCoPartition``, spark_conf/), only ``values`` is
    shuffled."""
    right = {key: f"_agg_key_{key}" for key in [*keys, TS_MICROS]}
    values = values.select(*(F.col(key).alias(name) for key, name in right.items()),
                           *(c for c in values.columns if c not in right))
    present = {*ENTITIES.values(), TS_MICROS}
    condition = [events[key] == values[name] if key in present
                 else events[key].eqNullSafe(values[name]) for key, name in right.items()]
    return events.join(values, condition, "left").drop(*right.values())


def _description(feature: AggregateFeature) -> dict[str, Any]:
    """What metadata.json says of an aggregation feature."""
    spec, window = feature.spec, feature.window
    return {"group": feature.group, "keys": list(feature.keys), "feature": feature.output,
            "op": spec.op,
            "column": spec.column, "filter": spec.filter, **spec.parameters(),
            "window": window.text, "window_s": window.seconds, "hop_s": window.hop}
