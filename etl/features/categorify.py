"""categorify: contiguous int64 ids by descending training-split frequency, stable across runs.

The id convention of metadata.json (docs/ARCHITECTURE.md): 0 is padding, 1 is
out-of-vocabulary (unseen, null, or rarer than ``freq_threshold``); known values get 2, 3, …
in order of descending count, ties by value.

A run that extends a previous vocabulary (:meth:`Categorify.extend`) keeps every id it had;
values it has not seen get the next ids, by descending count (``freq_threshold`` applies to
them only). A run that keeps its fit counts, and numbers, the values of every row it is given
(the validation split's too: ``FeaturePipeline.fit``). Each vocabulary has a version, a
digest of its (value, id) pairs, so two outputs can tell whether they encode alike.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from featureline.core.errors import ConfigError
from featureline.core.metadata import FIRST_ID, OOV_ID, PADDING_ID, encoded_name
from featureline.core.model_inputs import MAX_LIST_WIDTH, Served, Source
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

# The column naming each row's vocabulary where several are one table (``_fit_counted``).
_COLUMN = "_column"
# A list column's position and id of each of its values (``_lists``).
_POSITION, _ID = "_position", "_id"
# Characters a separator escapes in Spark's split pattern (a Java regular expression).
_PATTERN_CHARACTERS = frozenset("\\^$.|?*+()[]{}")


def list_values(column: Column, separator: str) -> Column:
    """A multi-valued column's values: the texts between its separators, spaces trimmed,
    empty ones left out (``core.model_inputs.list_values``, the same for a request)."""
    pattern = "".join(f"\\{c}" if c in _PATTERN_CHARACTERS else c for c in separator)
    return F.filter(F.transform(F.split(column, pattern), lambda value: F.trim(value)),
                    lambda value: value != "")


class CategorifySettings(OpSettings):
    """Ids by descending training-split frequency (0 padding, 1 out of vocabulary):
    <col>_cat."""

    op: Literal["categorify"]
    # The columns to encode (raw columns, @categorical).
    columns: list[str] = Field(min_length=1)
    # Values seen fewer times than this in the training split map to the OOV id 1.
    freq_threshold: int = Field(default=1, ge=1)

    def encodes(self, roles: ColumnRoles) -> list[str]:
        return self.inputs(roles)

    def build(self, roles: ColumnRoles) -> Categorify:
        return Categorify(self.inputs(roles), self.freq_threshold, dict(roles.lists))


class Categorify(FeatureOp):
    name = "categorify"
    fitted = True

    def __init__(self, columns: list[str], freq_threshold: int = 1,
                 separators: Mapping[str, str] | None = None) -> None:
        super().__init__()
        self.columns = columns
        self.freq_threshold = freq_threshold
        # The multi-valued columns: each value of a list is numbered, and its feature is the
        # list of their ids, ``widths`` long (the longest list of the training rows, at most
        # MAX_LIST_WIDTH; a kept fit's own: ``restore``), padded.
        self.separators = {c: sep for c, sep in (separators or {}).items() if c in columns}
        self.widths: dict[str, int] = {}
        self.kept_widths: dict[str, int] = {}
        self.vocabularies: dict[str, DataFrame] = {}
        self.sizes: dict[str, int] = {}
        self.versions: dict[str, str] = {}
        # Each column's largest id before this fit (FIRST_ID - 1: none): its ids after it
        # are the values it numbered.
        self.last_ids: dict[str, int] = {}
        self.previous: dict[str, DataFrame] = {}
        # Where the extended vocabularies' counts are this run's training rows' but some:
        # those counts (column → (value, count)), and the training rows they leave out.
        self.counted: dict[str, DataFrame] = {}
        self.uncounted: DataFrame | None = None

    def extend(self, previous: dict[str, DataFrame]) -> None:
        """Start from these vocabularies (column → (value, id)): their ids are kept."""
        self.previous = {c: v for c, v in previous.items() if c in self.columns}

    def count_from(self, counted: dict[str, DataFrame], uncounted: DataFrame) -> bool:
        """Count the training rows as ``counted`` (column → (value, count), the counts of
        the vocabularies extended) plus the ``uncounted`` rows, rather than every row again
        (an incremental run: docs/ARCHITECTURE.md, "Incremental runs"); whether it will. Not
        with a ``freq_threshold`` above 1: the vocabularies hold no count of the rarer
        values; nor where a column has no vocabulary to extend (``extend`` first). Every
        value the counted rows hold then has an id already."""
        if self.freq_threshold > 1 or set(self.columns) - (set(counted) & set(self.previous)):
            return False
        if self.separators and not self.kept_widths:
            return False  # a list's width is the longest of every training row
        self.counted, self.uncounted = dict(counted), uncounted
        return True

    def fit(self, train: DataFrame) -> None:
        # Every column's largest id, then every vocabulary's size and version, in one query
        # each: a query per column costs more than its rows on a day's run.
        known_ids = {column: known.select(F.col("value").cast("string"),
                                          F.col("id").cast("long"))
                     for column, known in self.previous.items()}
        largest = _per_table(known_ids, F.max("id").alias("last_id"))
        self.last_ids = {column: largest.get(column, {}).get("last_id") or FIRST_ID - 1
                         for column in self.columns}
        self.widths = dict(self.kept_widths)  # else each list's: _value_counts
        if self.uncounted is not None:
            self._fit_counted(self.uncounted)
            return
        for column in self.columns:
            counts = self.keep(self._value_counts(train, column))
            known = known_ids.get(column)
            last_id = self.last_ids[column]
            if known is None:
                vocabulary = self._ranked(counts, column, last_id)
            else:
                kept = known.join(counts.withColumnRenamed(column, "value"), on="value",
                                  how="left").fillna({"count": 0})
                unseen = counts.join(known, counts[column] == known["value"], how="left_anti")
                vocabulary = kept.unionByName(self._ranked(unseen, column, last_id))
            self.vocabularies[column] = self.keep(vocabulary)
        for column, (size, version) in summaries(self.vocabularies).items():
            self.sizes[column], self.versions[column] = size, version

    def restore(self, fit: Fit, train: DataFrame) -> None:
        """Fit (the ids extend from the fit's vocabularies), each list as wide as the fit's."""
        stats = fit.op_stats(self.name)
        missing = [c for c in self.separators if "width" not in stats.get(c, {})]
        if missing:
            raise ConfigError("--fit-from", f"{fit.output}: the fit holds no list width of "
                              f"{missing[0]} (it was not a list there): fit it again")
        self.kept_widths = {c: int(stats[c]["width"]) for c in self.separators}
        self.fit(train)

    def _value_counts(self, train: DataFrame, column: str) -> DataFrame:
        """``value_counts`` of a column; of a list column, of its lists' values, from the
        count of each distinct list — which also give the list's width where no kept fit
        does: its longest list (1 at least, at most MAX_LIST_WIDTH)."""
        separator = self.separators.get(column)
        if separator is None:
            return value_counts(train, column)
        lists = self.keep(value_counts(train, column).select(
            F.col(column), "count", F.size(list_values(F.col(column), separator)).alias("n")))
        if column not in self.widths:
            longest = lists.agg(F.max("n")).collect()[0][0]
            self.widths[column] = min(MAX_LIST_WIDTH, max(1, int(longest or 0)))
        return (lists.select(F.explode(list_values(F.col(column), separator)).alias(column),
                             "count")
                .groupBy(column).agg(F.sum("count").cast("long").alias("count")))

    def _fit_counted(self, uncounted: DataFrame) -> None:
        """``fit`` where every vocabulary is extended from its counts (``count_from``): the
        vocabularies as one table (``_COLUMN`` names each one's column), from one pass over
        the uncounted rows and one grouping with the counted values — a few Spark jobs for
        all the columns where a plan per column costs several each (a day's run: the
        jobs' fixed costs outweigh its rows). The ids are ``fit``'s: a known value keeps
        its id, the others are numbered after their column's largest id by descending
        count, ties by value in the column's own type (the typed columns ``_typed``)."""
        typed = {column: f"_typed_{n}" for n, column in enumerate(self.columns)}
        kinds = {column: uncounted.schema[column].dataType for column in self.columns}

        def row(column: str, value: Column, id_: Column, count: Column,
                original: Column | None) -> Column:
            return F.struct(F.lit(column).alias(_COLUMN), value.cast("string").alias("value"),
                            id_.cast("long").alias("id"), count.cast("long").alias("count"),
                            *[(original if other == column and original is not None
                               else F.lit(None)).cast(kinds[other]).alias(typed[other])
                              for other in self.columns])

        # Every known value with its id, its count in the counted rows, and each uncounted
        # row's value: grouped by column and value, they are the whole vocabularies.
        def values(column: str) -> Column:  # a row's values of the column, as rows
            separator = self.separators.get(column)
            if separator is None:
                return F.array(row(column, F.col(column), F.lit(None), F.lit(1), F.col(column)))
            return F.transform(list_values(F.col(column), separator),
                               lambda value: row(column, value, F.lit(None), F.lit(1), value))

        parts = [uncounted.select(F.explode(F.concat(*[values(column)
                                                       for column in self.columns]))
                                  .alias("_row"))]
        for column in self.columns:
            parts.append(self.previous[column].select(
                row(column, F.col("value"), F.col("id"), F.lit(0), None).alias("_row")))
            parts.append(self.counted[column].select(
                row(column, F.col("value"), F.lit(None), F.col("count"), None).alias("_row")))
        grouped = (functools.reduce(DataFrame.unionByName, parts).select("_row.*")
                   .where(F.col("value").isNotNull())
                   .groupBy(_COLUMN, "value")
                   .agg(F.max("id").alias("id"), F.sum("count").alias("count"),
                        *[F.max(name).alias(name) for name in typed.values()]))
        # The unseen values numbered by one window over the whole table (its known values'
        # own numbers unused): one table of few partitions, where a union of the known
        # and the unseen doubled them (each later read of it pays per partition).
        unseen = F.col("id").isNull()
        order = Window.partitionBy(_COLUMN, unseen).orderBy(
            F.desc("count"), *[F.asc(name) for name in typed.values()])
        last_ids = self.last_ids
        last_id = functools.reduce(
            lambda chosen, column: chosen.when(F.col(_COLUMN) == column,
                                               F.lit(last_ids[column])),
            self.columns[1:], F.when(F.col(_COLUMN) == self.columns[0],
                                     F.lit(last_ids[self.columns[0]])))
        vocabularies = self.keep(grouped.select(
            _COLUMN, "value",
            F.when(unseen, F.row_number().over(order) + last_id).otherwise(F.col("id"))
            .cast("long").alias("id"),
            F.coalesce(F.col("count"), F.lit(0)).cast("long").alias("count")))
        for column in self.columns:
            self.vocabularies[column] = vocabularies.where(F.col(_COLUMN) == column).drop(
                _COLUMN)
        rows = {row[_COLUMN]: row.asDict() for row in
                vocabularies.groupBy(_COLUMN).agg(*_summarizing()).collect()}
        for column in self.columns:
            self.sizes[column], self.versions[column] = _summary(rows.get(column, {}))

    def added(self, column: str) -> DataFrame:
        """The values of ``column`` this fit numbered that the vocabulary it extends had not
        (all of them without one): events of theirs were encoded OOV before. Their ids are
        the ones after the extended vocabulary's largest."""
        return self.vocabularies[column].where(
            F.col("id") > self.last_ids[column]).select("value")

    def _ranked(self, counts: DataFrame, column: str, last_id: int) -> DataFrame:
        """Values at or above the frequency threshold, numbered after ``last_id`` by
        descending count, ties by value."""
        order = Window.orderBy(F.desc("count"), F.asc(column))
        return counts.where(F.col("count") >= self.freq_threshold).select(
            F.col(column).cast("string").alias("value"),
            (F.row_number().over(order) + last_id).cast("long").alias("id"),
            F.col("count"),
        )

    def added_lists(self, column: str, rows: DataFrame) -> DataFrame:
        """``added`` of a column as the raw values of ``rows`` holding them (``value``): of a
        list column, each list with an added value."""
        separator = self.separators.get(column)
        if separator is None:
            return self.added(column)
        lists = rows.select(F.col(column).cast("string").alias("value")).distinct()
        held = lists.select("value", F.explode(list_values(F.col("value"), separator))
                            .alias("_one"))
        added = self.added(column).select(F.col("value").alias("_one"))
        return held.join(added, on="_one", how="left_semi").select("value").distinct()

    def transform(self, events: DataFrame, columns: list[str] | None = None) -> DataFrame:
        """``events`` with the ids of ``columns`` (every encoded column without)."""
        for column in self.columns if columns is None else columns:
            vocabulary = self.vocabularies[column].select(
                F.col("value").alias(column), F.col("id").alias(encoded_name(column)))
            if column in self.separators:
                events = self._with_lists(events, column, vocabulary)
                continue
            events = (events.join(vocabulary, on=column, how="left")
                      .fillna({encoded_name(column): OOV_ID}))
        return events

    def _with_lists(self, events: DataFrame, column: str, vocabulary: DataFrame) -> DataFrame:
        """``events`` with a list column's ids, in the list's order, padded to its width (no
        value: all padding). Each distinct list is encoded once, then joined on by its text."""
        width, name = self.widths[column], encoded_name(column)
        lists = events.select(column).where(F.col(column).isNotNull()).distinct()
        values = (lists.select(column, F.posexplode(list_values(
                      F.col(column), self.separators[column])).alias(_POSITION, name))
                  .join(vocabulary.withColumnRenamed(column, "_value")
                        .withColumnRenamed(name, _ID),
                        F.col(name) == F.col("_value"), "left")
                  .select(column, _POSITION, F.coalesce(F.col(_ID), F.lit(OOV_ID)).alias(_ID)))
        padding = F.array_repeat(F.lit(PADDING_ID).cast("long"), width)
        encoded = values.groupBy(column).agg(
            F.sort_array(F.collect_list(F.struct(_POSITION, _ID))).alias(name)).select(
            column, F.slice(F.concat(F.transform(name, lambda pair: pair[_ID].cast("long")),
                                     padding), 1, width).alias(name))
        joined = events.join(encoded, on=column, how="left")
        return joined.withColumn(name, F.coalesce(F.col(name), padding))

    def cardinality(self, column: str) -> int:
        """Rows the embedding table of ``column`` needs: the vocabulary plus padding and OOV."""
        return self.sizes[column] + FIRST_ID

    def features(self) -> list[FeatureSpec]:
        # Before the fit the names are known, the cardinalities and list widths not yet.
        return [FeatureSpec(encoded_name(c), "multi_hot" if c in self.separators else
                            "categorical", "int64",
                            self.cardinality(c) if c in self.sizes else None,
                            width=self.widths.get(c, 1))
                for c in self.columns]

    def served(self) -> Served:
        return Served({encoded_name(c): Source(kind="id", column=c,
                                               separator=self.separators.get(c),
                                               width=self.widths.get(c))
                       for c in self.columns})

    def artifacts(self) -> Artifacts:
        return Artifacts(
            tables={f"categorify/{c}": v.orderBy("id") for c, v in self.vocabularies.items()},
            stats={c: {"vocabulary_size": self.sizes[c], "cardinality": self.cardinality(c),
                       "freq_threshold": self.freq_threshold, "padding_id": PADDING_ID,
                       "oov_id": OOV_ID, "version": self.versions[c],
                       **({"separator": self.separators[c], "width": self.widths[c]}
                          if c in self.separators else {})} for c in self.columns},
        )


def summarize(vocabulary: DataFrame) -> tuple[int, str]:
    """A vocabulary's size and version: a digest of the size and the XOR of its (value, id)
    hashes, so the same pairs give the same version in any order."""
    return summaries({"": vocabulary})[""]


def summaries(vocabularies: dict[str, DataFrame]) -> dict[str, tuple[int, str]]:
    """``summarize`` of each vocabulary (column → (value, id, …)), in one query."""
    rows = _per_table(vocabularies, *_summarizing())
    return {column: _summary(rows.get(column, {})) for column in vocabularies}


def _summarizing() -> tuple[Column, ...]:
    """The aggregates of a vocabulary's rows its size and version come from (``_summary``)."""
    return (F.count(F.lit(1)).alias("n"),
            F.bit_xor(F.xxhash64(F.col("value").cast("string"),
                                 F.col("id").cast("long"))).alias("digest"))


def _summary(row: dict[str, Any]) -> tuple[int, str]:
    """A vocabulary's size and version from its ``_summarizing`` (no rows: an empty dict)."""
    size = int(row.get("n") or 0)
    return size, hashlib.sha256(f"{size}:{row.get('digest') or 0}".encode()).hexdigest()[:16]


def _per_table(tables: dict[str, DataFrame], *aggregates: Column) -> dict[str, dict[str, Any]]:
    """``aggregates`` of each table's (value, id) rows in one query: per table name, the
    aggregates by name (a table without rows has none)."""
    if not tables:
        return {}
    tagged = [frame.select(F.lit(name).alias("_table"), F.col("value"), F.col("id"))
              for name, frame in tables.items()]
    union = functools.reduce(DataFrame.unionByName, tagged)
    return {row["_table"]: row.asDict() for row in
            union.groupBy("_table").agg(*aggregates).collect()}
