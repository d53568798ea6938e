"""What every operation is built from: its partial's declared fields, the :class:`Operation`
base with its Python half and its Spark half, and the base of the operations whose partials are
sums (docs/ARCHITECTURE.md, "Features as definitions")."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    from pyspark.sql import Column

Partial = Any
# A partial's column by its field's name (the executor knows where the partial is).
Getter = Callable[[str], "Column"]
# Per field: the aggregate merging a set of partials, and what turns its result into the field.
Merges = dict[str, tuple["Column", Callable[["Column"], "Column"]]]


def _spark() -> ModuleType:
    """pyspark's functions, for the Spark half."""
    from pyspark.sql import functions

    return functions


def _same(column: Column) -> Column:
    return column


@dataclass(frozen=True)
class PartialField:
    """One field of a partial: its column's name (in tables of tiles and Spark frames), its
    Spark and Arrow types (None: the read value's own) and its value for no events.
    ``reference``: a value the other fields are measured from (variance's shift), carried
    rather than added; the executors move a key's partials to one reference before adding
    them (``Operation.rebase_columns``)."""

    name: str
    spark_type: str | None = None
    arrow_type: pa.DataType | None = None
    empty: Any = None
    reference: bool = False

    def typed(self, column: Column) -> Column:
        """``column`` cast to the field's Spark type (where it has one)."""
        return column if self.spark_type is None else column.cast(self.spark_type)

    def read(self, fields: Mapping[str, Any]) -> Any:
        """The field of one row of a table of tiles; missing or null: no events."""
        value = fields.get(self.name)
        return self.empty if value is None else value

    def column(self, fields: pa.Table) -> list[Any]:
        """The field of every row of a table of tiles as Python values (of its Arrow type
        where it has one); missing or null: no events."""
        if self.name not in fields.column_names:
            return [self.empty] * fields.num_rows
        values = fields[self.name]
        if self.arrow_type is None:
            return [self.empty if v is None else v for v in values.to_pylist()]
        return pc.fill_null(values.cast(self.arrow_type), self.empty).to_numpy().tolist()


# The fields several operations' partials share.
COUNT = PartialField("n", "long", pa.int64(), 0)
SUM = PartialField("s", "double", pa.float64(), 0.0)


class Parameters(BaseModel):
    """An operation's parameters, written beside ``op`` in its feature's spec (last_k's
    ``k``): none here; an operation that takes some declares their model (unknown keys are
    errors, values are hashable)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Operation(ABC):
    """One aggregation: its partial's life (init → add … → merge … → finish) in Python and
    in Spark columns, given its :class:`Parameters`."""

    name: ClassVar[str]
    # The partial's fields (set per object where its parameters make them).
    fields: tuple[PartialField, ...]
    # Whether it reads a column (count without one counts events), and of which kind.
    needs_column: ClassVar[bool] = True
    reads: ClassVar[Literal["any", "number", "text"]] = "any"
    # The backfill's plan (etl/aggregations.py): frames over the events and tiles; the
    # newest (ts, value) pairs before each anchor (``ordered``, a list of ``list_length()``);
    # the oldest pair in its window (``ordered``); or, with ``per``, the greatest of one
    # field per value of the other, finished from sums of each value's terms
    # (``value_terms``, ``finish_terms``).
    plan: ClassVar[Literal["frames", "newest", "oldest", "per_value"]] = "frames"
    # A row standing for w equal events counts w times (count, sums); else any one counts.
    additive: ClassVar[bool] = False
    # It reads values in (ts, value) order: the value read may be a struct that orders first.
    ordered: ClassVar[bool] = False
    # It reads each event: rows that stand for several equal events cannot feed it.
    reads_each_event: ClassVar[bool] = False
    # Its parameters' model.
    parameters: ClassVar[type[Parameters]] = Parameters
    # Its value counts something (a log1p transform fits it), and it has none without events.
    counts: ClassVar[bool] = False
    may_be_missing: ClassVar[bool] = False
    # A partial that maps this field's values to partials of the other fields (merged per
    # value, a tile lists them): approx_distinct's registers; None: one partial.
    per: ClassVar[PartialField | None] = None
    # Raised when a change moves the values it gives: an output's fingerprint holds it, so
    # outputs computed before are told apart (``etl.config.output_fingerprints``).
    version: ClassVar[int] = 1

    def __init__(self, params: Parameters | None = None) -> None:
        self.params = self.parameters() if params is None else params

    def list_length(self) -> int | None:
        """The length of its value where that is a list (last_k's ``k``); None: one value."""
        return None

    # --- the Python half ------------------------------------------------------------------

    @abstractmethod
    def init(self) -> Partial:
        """The partial of no events."""

    @abstractmethod
    def add(self, partial: Partial, ts: int, value: Any) -> Partial:
        """``partial`` with one more event (``ts`` in microseconds, ``value`` not None)."""

    @abstractmethod
    def merge(self, left: Partial, right: Partial) -> Partial:
        """The partial of both sets of events (commutative and associative)."""

    @abstractmethod
    def finish(self, partial: Partial) -> Any:
        """The feature value."""

    @abstractmethod
    def from_fields(self, fields: Mapping[str, Any]) -> Partial:
        """The partial from the fields of one row of a table of tiles."""

    def to_json(self, partial: Partial) -> Any:
        """The partial as JSON holds it (the online store's tiles)."""
        return partial

    def json_column(self, fields: pa.Table) -> list[Any]:
        """Each row's partial as :meth:`to_json` holds it, from a table of tiles' fields:
        row by row here, from the columns where an operation can (publish encodes every
        key's tiles)."""
        return [self.to_json(self.from_fields(row)) for row in fields.to_pylist()]

    def from_json(self, stored: Any) -> Partial:
        """The partial :meth:`to_json` stored."""
        return stored

    # --- the Spark half -------------------------------------------------------------------

    @abstractmethod
    def state_columns(self, value: Column, ts: Column) -> dict[str, Column]:
        """One event's partial, by field: its ``value`` read (``True`` for count) at ``ts``
        (µs)."""

    @abstractmethod
    def merge_columns(self, partial: Getter) -> Merges:
        """Per field, the aggregate merging a set of partials (in a group or over a frame)
        and what turns its result into the field."""

    def combine_columns(self, left: Getter, right: Getter) -> dict[str, Column]:
        """The partial of two partials, either absent (null): the frames plan's."""
        raise NotImplementedError(f"{self.name}: the backfill's {self.plan} plan")

    def finish_column(self, partial: Getter) -> Column:
        """The feature value: the frames plan's."""
        raise NotImplementedError(f"{self.name}: the backfill's {self.plan} plan")

    def value_terms(self, greatest: Column) -> dict[str, Column]:
        """What one value of ``per`` adds to the sums its partial is finished from, given its
        greatest other field (null: none in the window): the per-value plan's."""
        raise NotImplementedError(f"{self.name}: the backfill's {self.plan} plan")

    def finish_terms(self, sums: Getter) -> Column:
        """The feature value from the sums of :meth:`value_terms` over the values: the
        per-value plan's."""
        raise NotImplementedError(f"{self.name}: the backfill's {self.plan} plan")

    def reference_field(self) -> PartialField | None:
        """The partial's reference field, if it has one (:class:`PartialField`)."""
        return next((field for field in self.fields if field.reference), None)

    def rebase_columns(self, partial: Getter, reference: Column) -> dict[str, Column]:
        """The partial measured from ``reference`` instead of its own reference field: what
        the executors add once a key's partials share one."""
        raise NotImplementedError(f"{self.name} has no reference field")

    def exact_in_any_order(self, whole_numbers: bool) -> bool:
        """Whether partials can be subtracted exactly (a window's value is then the running
        partial less the events that left it) — ``whole_numbers``: the column read holds
        integers, whose sums are exact doubles below 2^53."""
        return False


class _Sums(Operation):
    """An operation whose partial's fields are sums: partials merge by adding them (in Spark,
    a sum per field; a reference field, which the executors made one per key, is kept), and a
    row standing for several equal events counts that many times. Exact in any order over
    whole numbers."""

    additive = True

    def merge_columns(self, partial: Getter) -> Merges:
        F = _spark()
        return {field.name: ((F.min if field.reference else F.sum)(partial(field.name)), _same)
                for field in self.fields}

    def combine_columns(self, left: Getter, right: Getter) -> dict[str, Column]:
        F = _spark()
        return {field.name: F.coalesce(left(field.name), right(field.name)) if field.reference
                else _plus(field, left, right) for field in self.fields}

    def exact_in_any_order(self, whole_numbers: bool) -> bool:
        return whole_numbers


def _plus(field: PartialField, left: Getter, right: Getter) -> Column:
    """Two partials' field added, an absent one as no events."""
    F = _spark()
    empty = F.lit(field.empty)
    return F.coalesce(left(field.name), empty) + F.coalesce(right(field.name), empty)


