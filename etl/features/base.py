"""The feature-op interface: an op is one file holding its settings model (checked when the
configuration loads) and its transform (fit statistics on the training split, transform any
split); ``etl/features/__init__.py`` registers it with one line.

Each op is a pure ``DataFrame -> DataFrame`` step made of built-in Spark SQL only (no Python
UDFs), so the RAPIDS Accelerator can run it on the GPU.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field
from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from featureline.core.model_inputs import Served
from featureline.core.settings import Settings
from featureline.core.time_rule import MICROS, floor_to
from featureline.etl.rapids import RAPIDS_PLUGIN

if TYPE_CHECKING:
    from featureline.etl.fit import Fit

LABEL = "label"
SPLIT = "split"
TRAIN = "train"
VALID = "valid"
# Event time in microseconds since the epoch: the order and range key of the time windows.
TS_MICROS = "_ts_us"
# Per row: the user's events, and positives among them, before the rows an incremental run
# gives an op (docs/ARCHITECTURE.md, "Incremental runs"); absent in a full run, which gives
# every row.
EARLIER_EVENTS = "_earlier_events"
EARLIER_POSITIVES = "_earlier_positives"
# Per row of an incremental run's window: the events it stands for — 1, or the count of a
# user's earlier events folded into one row, its label their positives (``Lookback.windows``);
# absent in a full run, whose every row is one event.
EVENTS = "_events"
CATEGORICAL_SELECTOR = "@categorical"
CONTINUOUS_SELECTOR = "@continuous"

Kind = Literal["categorical", "continuous", "multi_hot"]


def epoch_micros(ts: Column) -> Column:
    """``unix_micros(ts)`` from operators the RAPIDS Accelerator runs (it does not run
    ``unix_micros``): whole seconds by a cast, the fraction from the timestamp as a double.
    Exact to the microsecond before the year 2242 — a double near 2^33 seconds still tells
    microseconds apart — and validation keeps events before 2100. The fraction (never
    negative: the cast floors) is rounded by ``floor(x + 0.5)``, not ``round``: Spark rounds a
    double through a BigDecimal, 2.6× this column's time over a stored history
    (benchmarks/README.md).
    """
    seconds = ts.cast("long")
    fraction = F.floor((ts.cast("double") - seconds.cast("double")) * MICROS + 0.5)
    return seconds * MICROS + fraction


def with_time_key(frame: DataFrame) -> DataFrame:
    """``frame`` with ``TS_MICROS``, the key the time windows order and range by."""
    return frame.withColumn(TS_MICROS, epoch_micros(F.col("ts")))


def hop_start(hop: int, at: Column | None = None) -> Column:
    """The start of the hop (µs, ``hop`` long) holding a row's ``TS_MICROS`` (or ``at``)."""
    return floor_to(F.col(TS_MICROS) if at is None else at, hop)


def plans_for_gpu(spark: SparkSession) -> bool:
    """The session runs the RAPIDS Accelerator (or plans for it, in explain-only mode): ops
    whose fastest CPU formulation the plugin does not run choose another, same values."""
    conf = spark.conf
    return (RAPIDS_PLUGIN in (conf.get("spark.plugins", "") or "")
            and (conf.get("spark.rapids.sql.enabled", "true") or "").lower() != "false")


def population_std(column: Column) -> Column:
    """``stddev_pop(column)`` as an aggregate the RAPIDS Accelerator runs over a whole table:
    it runs ``stddev_samp`` there and ``stddev_pop`` only per group, so the sample deviation
    scaled by sqrt((n - 1) / n); 0 for one value, null for none, as ``stddev_pop``."""
    n = F.count(column)
    scaled = F.stddev_samp(column) * F.sqrt((n - 1) / n)
    return F.when(n > 0, F.coalesce(scaled, F.lit(0.0)))


def value_counts(train: DataFrame, column: str) -> DataFrame:
    """``column`` and ``count``: how many training rows hold each value (nulls left out).
    Categorify and count_encode both ask for it; kept by the first (``FeatureOp.keep``), it
    is one pass over the training rows for both."""
    return (train.where(F.col(column).isNotNull()).groupBy(column)
            .agg(F.count(F.lit(1)).cast("long").alias("count")))


@dataclass(frozen=True)
class ColumnRoles:
    """The event columns an op may read, by kind, and the label's column (never an input)."""

    categorical: tuple[str, ...]
    continuous: tuple[str, ...]
    # Declared context columns, what the ``@categorical`` / ``@continuous`` selectors stand for.
    categorical_context: tuple[str, ...]
    continuous_context: tuple[str, ...]
    label_column: str
    # Columns observed after the event (``etl.source.roles``): never an example's input.
    outcomes: tuple[str, ...] = ()
    # Multi-valued columns and their separators (``etl.attributes[].lists``).
    lists: tuple[tuple[str, str], ...] = ()

    def expand(self, columns: list[str]) -> list[str]:
        """Replace the selectors by the declared columns; a selector never expands to the
        label's own column, nor to an outcome: either would leak into the example."""
        selected = {CATEGORICAL_SELECTOR: self.categorical_context,
                    CONTINUOUS_SELECTOR: self.continuous_context}
        expanded: list[str] = []
        for column in columns:
            if column in selected:
                expanded.extend(c for c in selected[column]
                                if c != self.label_column and c not in self.outcomes)
            else:
                expanded.append(column)
        return list(dict.fromkeys(expanded))


class OpSettings(Settings):
    """The settings every op takes; an op's own model adds ``op: Literal[<name>]`` and its
    parameters, checked when the configuration loads."""

    # The op's name, ``Literal[<name>]`` in each op's model (the configuration's discriminator).
    op: str
    # Output column → its 1-3 character TFRecord name, over the generated one.
    short_names: dict[str, str] = Field(default_factory=dict)
    # The kind of column the op reads.
    input_kind: ClassVar[Literal["categorical", "continuous"]] = "categorical"
    # Columns whose encoded ids the op reads, so a categorify of them must come first.
    needs_encoded: ClassVar[tuple[str, ...]] = ()

    def inputs(self, roles: ColumnRoles) -> list[str]:
        """The event columns the op reads, selectors expanded."""
        return roles.expand(getattr(self, "columns", []))

    def encodes(self, roles: ColumnRoles) -> list[str]:
        """The columns whose encoded ids the op adds (categorify)."""
        return []

    def build(self, roles: ColumnRoles) -> FeatureOp:
        """The op these settings describe."""
        raise NotImplementedError


@dataclass(frozen=True)
class Lookback:
    """The earlier events of its user an op reads for an event: those in the ``span_us``
    microseconds before it, and the ``rows`` rows before it (in (time, item) order); of
    them, the ``columns`` beside the user and the time key (an incremental run hands the
    op no other column of an earlier event). ``windows`` (none: one by one): the op reads
    the span's events, but for those rows, only as counts in these windows — ``(length_us,
    hop_us)``, each covering ``[t − length, t)`` with ``t`` rounded down to a multiple of
    its hop — so an incremental run may fold them into rows that each stand for events no
    window boundary separates (``EVENTS``; per user, item and span for the (user, item)
    pairs its events hold: ``incremental.folded``)."""

    span_us: int = 0
    rows: int = 0
    columns: frozenset[str] = frozenset()
    windows: tuple[tuple[int, int], ...] = ()

    def __or__(self, other: Lookback) -> Lookback:
        # Folds that every op reading a span allows: their windows together (none where
        # one reads its events one by one).
        spans = [lookback for lookback in (self, other) if lookback.span_us]
        windows: tuple[tuple[int, int], ...] = ()
        if spans and all(lookback.windows for lookback in spans):
            windows = tuple(sorted({w for lookback in spans for w in lookback.windows}))
        return Lookback(max(self.span_us, other.span_us), max(self.rows, other.rows),
                        self.columns | other.columns, windows)


@dataclass(frozen=True)
class FeatureSpec:
    """One output column of a feature op, as metadata.json describes it."""

    name: str
    kind: Kind
    dtype: Literal["int64", "float32"]
    cardinality: int | None = None
    # The categorical feature whose ids (and embedding table) this one reuses.
    shares: str | None = None
    # Values per row: 1, or K for a multi-hot list.
    width: int = 1
    short_name: str | None = None
    # Continuous features: the model-ready transform the op proposes (etl.model_ready may
    # override it), whether a row can have no value (then a missing indicator is added), and,
    # once fitted, the transform applied with its statistics (metadata.json's "transform").
    transform_hint: str = "standardize"
    missing: bool = False
    transform: dict[str, Any] | None = None
    # An aggregation's definition: its group, keys, op, column, filter, window and hop.
    aggregation: dict[str, Any] | None = None
    # A derived feature's expression (core.derive).
    derived: str | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"name": self.name, "short_name": self.short_name,
                                "dtype": self.dtype, "kind": self.kind, "width": self.width}
        if self.cardinality is not None:
            data["cardinality"] = self.cardinality
        if self.shares is not None:
            data["shares"] = self.shares
        if self.transform is not None:
            data["transform"] = self.transform
        if self.aggregation is not None:
            data["aggregation"] = self.aggregation
        if self.derived is not None:
            data["derived"] = self.derived
        return data


@dataclass
class Artifacts:
    """What a fitted op keeps for serving: Parquet tables and a JSON-able summary."""

    tables: dict[str, DataFrame] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)


class FeatureOp(ABC):
    """A feature transform with an explicit fit on the training split."""

    name: str
    # True for an op with statistics fitted on the training split: its outputs move as the
    # split grows. The others' outputs for an event depend only on the event and its user's
    # earlier events, so an incremental run keeps them (docs/ARCHITECTURE.md, "Incremental
    # runs").
    fitted: ClassVar[bool] = False

    def __init__(self) -> None:
        # Statistics cached for the transforms; ``release`` frees them.
        self._kept: list[DataFrame] = []

    def fit(self, train: DataFrame) -> None:  # noqa: B027 - stateless ops need no statistics
        """Learn statistics from the training split (stateless ops have none)."""

    def restore(self, fit: Fit, train: DataFrame) -> None:
        """Take the statistics from ``fit`` instead of fitting them (docs/ARCHITECTURE.md,
        "Fits"). Ops with nothing of their own to freeze fit as usual: the stateless ones,
        categorify (its ids extend from the fit's vocabularies), the aggregations (values
        of the events, not statistics)."""
        self.fit(train)

    @abstractmethod
    def transform(self, events: DataFrame) -> DataFrame:
        """Add this op's output columns to ``events``."""

    @abstractmethod
    def features(self) -> list[FeatureSpec]:
        """The output columns, valid after ``fit``."""

    def artifacts(self) -> Artifacts:
        return Artifacts()

    def served(self) -> Served | None:
        """How each of its features is computed at a request time (``core.model_inputs``);
        None: it cannot be (metadata.json names its features under ``inputs.unserved``)."""
        return None

    def lookback(self) -> Lookback:
        """The earlier events of the user the op reads (none for most ops)."""
        return Lookback()

    def keep(self, frame: DataFrame) -> DataFrame:
        """Cache a fitted statistic for the transforms; ``release`` frees it. A statistic
        another op already cached (the same plan: ``value_counts``) is shared, not cached
        again: Spark finds a cached result by its plan, and that op releases it."""
        if frame.storageLevel == StorageLevel.NONE:
            self._kept.append(frame.persist())
        return frame

    def release(self) -> None:
        for frame in self._kept:
            frame.unpersist()
        self._kept = []
