"""The aggregation engine's operations: each one class with its Python half and its Spark half
over one declared partial (docs/ARCHITECTURE.md, "Features as definitions").

A **partial** is an operation's summary of a set of events. Its fields are declared once
(:class:`PartialField`: a name, its types, its value for no events); the tables of tiles, the
Spark frames and the online store's JSON all use those names.

- **The Python half** — ``init`` / ``add`` / ``merge`` / ``finish`` over JSON-able values,
  ``from_fields`` / ``json_column`` from a table of tiles, ``to_json`` / ``from_json`` — is
  what the stream, the API's read-time merge and the consistency report call.
- **The Spark half** — ``state_columns`` (one event's partial), ``merge_columns`` (a set of
  partials, in a group or over a frame), ``combine_columns`` (two partials) and
  ``finish_column`` — is what the backfill and the tiles written at publish call. It is
  built-in column expressions only, which the RAPIDS Accelerator runs on the GPU.

Adding an operation is one class here and its line in :data:`OPERATIONS`; the executors read
nothing else of it. pyspark is imported only inside the Spark half (the API never calls it).

Events missing the operation's column are skipped before ``add`` (``count`` without a column
counts every event the filter keeps).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import pyarrow as pa
import pyarrow.compute as pc

if TYPE_CHECKING:
    from pyspark.sql import Column

Partial = Any
# A partial's column by its field's name (the executor knows where the partial is).
Getter = Callable[[str], "Column"]
# Per field: the aggregate merging a set of partials, and what turns its result into the field.
Merges = dict[str, tuple["Column", Callable[["Column"], "Column"]]]

# approx_distinct's HyperLogLog: 2^14 registers (0.8 % standard error), ranks capped at 40
# (exact far beyond 2^40 distinct values; the sum of 2^(40 − rank) fits a long exactly).
HLL_BITS = 14
HLL_REGISTERS = 1 << HLL_BITS
HLL_MAX_RANK = 40
HLL_ALPHA = 0.7213 / (1 + 1.079 / HLL_REGISTERS)
# Spark's xxhash64 seed.
XXHASH_SEED = 42
# A (ts, value) pair's fields, in last's and last_k's partials.
PAIR_TS, PAIR_VALUE = "ts", "v"


def _spark() -> ModuleType:
    """pyspark's functions, for the Spark half."""
    from pyspark.sql import functions

    return functions


def _same(column: Column) -> Column:
    return column


@dataclass(frozen=True)
class PartialField:
    """One field of a partial: its column's name (in tables of tiles and Spark frames), its
    Spark and Arrow types (None: the read value's own) and its value for no events."""

    name: str
    spark_type: str | None = None
    arrow_type: pa.DataType | None = None
    empty: Any = None

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


# The partials' fields, declared once.
COUNT = PartialField("n", "long", pa.int64(), 0)
SUM = PartialField("s", "double", pa.float64(), 0.0)
SQUARES = PartialField("q", "double", pa.float64(), 0.0)
EXTREME = PartialField("m")
PAIRS = PartialField("p")
# approx_distinct's: a register and its rank (a tile lists them: array<int> each).
REGISTERS = PartialField("registers", "int", empty=[])
RANKS = PartialField("ranks", "int", empty=[])


class Operation(ABC):
    """One aggregation: its partial's life (init → add … → merge … → finish) in Python and
    in Spark columns. ``k``: how many values last_k keeps."""

    name: ClassVar[str]
    # The partial's fields.
    fields: ClassVar[tuple[PartialField, ...]]
    # Whether it reads a column (count without one counts events), and of which kind.
    needs_column: ClassVar[bool] = True
    reads: ClassVar[Literal["any", "number", "text"]] = "any"
    # The backfill's plan: frames over the events and tiles, or a plan of its own.
    plan: ClassVar[Literal["frames", "latest", "distinct"]] = "frames"
    # A row standing for w equal events counts w times (count, sums); else any one counts.
    additive: ClassVar[bool] = False
    # It reads values in (ts, value) order: the value read may be a struct that orders first.
    ordered: ClassVar[bool] = False
    # It reads each event: rows that stand for several equal events cannot feed it.
    reads_each_event: ClassVar[bool] = False
    # It keeps the ``k`` latest values read: its value is a list of ``k`` (its spec's ``k``).
    takes_k: ClassVar[bool] = False
    # Its value counts something (a log1p transform fits it), and it has none without events.
    counts: ClassVar[bool] = False
    may_be_missing: ClassVar[bool] = False
    # A partial that maps this field's values to partials of the other fields (merged per
    # value, a tile lists them): approx_distinct's registers; None: one partial.
    per: ClassVar[PartialField | None] = None
    # Raised when a change moves the values it gives: an output's fingerprint holds it, so
    # outputs computed before are told apart (``etl.config.output_fingerprints``).
    version: ClassVar[int] = 1

    def __init__(self, k: int | None = None) -> None:
        self.k = k

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

    def exact_in_any_order(self, whole_numbers: bool) -> bool:
        """Whether partials can be subtracted exactly (a window's value is then the running
        partial less the events that left it) — ``whole_numbers``: the column read holds
        integers, whose sums are exact doubles below 2^53."""
        return False


class _Sums(Operation):
    """An operation whose partial's fields are all sums: partials merge by adding them (in
    Spark, a sum per field), and a row standing for several equal events counts that many
    times. Exact in any order over whole numbers."""

    additive = True

    def merge_columns(self, partial: Getter) -> Merges:
        F = _spark()
        return {field.name: (F.sum(partial(field.name)), _same) for field in self.fields}

    def combine_columns(self, left: Getter, right: Getter) -> dict[str, Column]:
        return {field.name: _plus(field, left, right) for field in self.fields}

    def exact_in_any_order(self, whole_numbers: bool) -> bool:
        return whole_numbers


class Count(_Sums):
    name = "count"
    fields = (COUNT,)
    needs_column = False
    counts = True

    def init(self) -> int:
        return 0

    def add(self, partial: int, ts: int, value: Any) -> int:
        return partial + 1

    def merge(self, left: int, right: int) -> int:
        return left + right

    def finish(self, partial: int) -> int:
        return partial

    def from_fields(self, fields: Mapping[str, Any]) -> int:
        return int(COUNT.read(fields))

    def json_column(self, fields: pa.Table) -> list[Any]:
        return COUNT.column(fields)

    def state_columns(self, value: Column, ts: Column) -> dict[str, Column]:
        return {COUNT.name: COUNT.typed(_spark().lit(1))}

    def finish_column(self, partial: Getter) -> Column:
        return partial(COUNT.name)

    def exact_in_any_order(self, whole_numbers: bool) -> bool:
        return True


class Sum(_Sums):
    name = "sum"
    fields = (SUM,)
    reads = "number"

    def init(self) -> float:
        return 0.0

    def add(self, partial: float, ts: int, value: float) -> float:
        return partial + value

    def merge(self, left: float, right: float) -> float:
        return left + right

    def finish(self, partial: float) -> float:
        return partial

    def from_fields(self, fields: Mapping[str, Any]) -> float:
        return float(SUM.read(fields))

    def json_column(self, fields: pa.Table) -> list[Any]:
        return SUM.column(fields)

    def state_columns(self, value: Column, ts: Column) -> dict[str, Column]:
        return {SUM.name: SUM.typed(value)}

    def finish_column(self, partial: Getter) -> Column:
        return partial(SUM.name)


class Mean(_Sums):
    """Partial: [sum, count]; no events → None."""

    name = "mean"
    fields = (SUM, COUNT)
    reads = "number"
    may_be_missing = True

    def init(self) -> list[float]:
        return [0.0, 0]

    def add(self, partial: list[float], ts: int, value: float) -> list[float]:
        return [partial[0] + value, partial[1] + 1]

    def merge(self, left: list[float], right: list[float]) -> list[float]:
        return [left[0] + right[0], left[1] + right[1]]

    def finish(self, partial: list[float]) -> float | None:
        return partial[0] / partial[1] if partial[1] else None

    def from_fields(self, fields: Mapping[str, Any]) -> list[float]:
        return [float(SUM.read(fields)), int(COUNT.read(fields))]

    def json_column(self, fields: pa.Table) -> list[Any]:
        return [list(pair) for pair in zip(SUM.column(fields), COUNT.column(fields),
                                           strict=True)]

    def state_columns(self, value: Column, ts: Column) -> dict[str, Column]:
        return {SUM.name: SUM.typed(value),
                COUNT.name: COUNT.typed(_spark().lit(1))}


    def finish_column(self, partial: Getter) -> Column:
        count = partial(COUNT.name)
        return _spark().when(count > 0, partial(SUM.name) / count)


class Variance(_Sums):
    """The population variance of the values (the mean of the squared deviations from their
    mean). Partial: [count, sum, sum of squares], merged by adding; finished as
    ``q / n − (s / n)²`` (never below 0); no events → None."""

    name = "variance"
    fields = (COUNT, SUM, SQUARES)
    reads = "number"
    may_be_missing = True

    def init(self) -> list[float]:
        return [0, 0.0, 0.0]

    def add(self, partial: list[float], ts: int, value: float) -> list[float]:
        return [partial[0] + 1, partial[1] + value, partial[2] + value * value]

    def merge(self, left: list[float], right: list[float]) -> list[float]:
        return [left[0] + right[0], left[1] + right[1], left[2] + right[2]]

    def finish(self, partial: list[float]) -> float | None:
        count, total, squares = partial
        if not count:
            return None
        return max(squares / count - (total / count) ** 2, 0.0)

    def from_fields(self, fields: Mapping[str, Any]) -> list[float]:
        return [int(COUNT.read(fields)), float(SUM.read(fields)), float(SQUARES.read(fields))]

    def json_column(self, fields: pa.Table) -> list[Any]:
        return [list(row) for row in zip(*(field.column(fields) for field in self.fields),
                                         strict=True)]

    def state_columns(self, value: Column, ts: Column) -> dict[str, Column]:
        number = SUM.typed(value)
        return {COUNT.name: COUNT.typed(_spark().lit(1)), SUM.name: number,
                SQUARES.name: number * number}


    def finish_column(self, partial: Getter) -> Column:
        F = _spark()
        count = partial(COUNT.name)
        mean = partial(SUM.name) / count
        return F.when(count > 0, F.greatest(partial(SQUARES.name) / count - mean * mean,
                                            F.lit(0.0)))


def _plus(field: PartialField, left: Getter, right: Getter) -> Column:
    """Two partials' field added, an absent one as no events."""
    F = _spark()
    empty = F.lit(field.empty)
    return F.coalesce(left(field.name), empty) + F.coalesce(right(field.name), empty)


class _Extreme(Operation):
    """Partial: the value, or None for no events."""

    fields = (EXTREME,)
    may_be_missing = True
    pick: ClassVar[Callable[..., Any]]

    def init(self) -> Any:
        return None

    def add(self, partial: Any, ts: int, value: Any) -> Any:
        return value if partial is None else type(self).pick(partial, value)

    def merge(self, left: Any, right: Any) -> Any:
        if left is None or right is None:
            return right if left is None else left
        return type(self).pick(left, right)

    def finish(self, partial: Any) -> Any:
        return partial

    def from_fields(self, fields: Mapping[str, Any]) -> Any:
        return EXTREME.read(fields)

    def json_column(self, fields: pa.Table) -> list[Any]:
        return EXTREME.column(fields)

    def state_columns(self, value: Column, ts: Column) -> dict[str, Column]:
        return {EXTREME.name: value}

    def finish_column(self, partial: Getter) -> Column:
        return partial(EXTREME.name)


class Min(_Extreme):
    name = "min"
    pick = min

    def merge_columns(self, partial: Getter) -> Merges:
        return {EXTREME.name: (_spark().min(partial(EXTREME.name)), _same)}

    def combine_columns(self, left: Getter, right: Getter) -> dict[str, Column]:
        return {EXTREME.name: _spark().least(left(EXTREME.name), right(EXTREME.name))}


class Max(_Extreme):
    name = "max"
    pick = max

    def merge_columns(self, partial: Getter) -> Merges:
        return {EXTREME.name: (_spark().max(partial(EXTREME.name)), _same)}

    def combine_columns(self, left: Getter, right: Getter) -> dict[str, Column]:
        return {EXTREME.name: _spark().greatest(left(EXTREME.name), right(EXTREME.name))}


class Latest(Max):
    """The time of the latest event (µs since the epoch; None without one): what "seconds
    since the previous event" is computed from at a request time. It reads no column."""

    name = "latest"
    needs_column = False

    def add(self, partial: Any, ts: int, value: Any) -> Any:
        return ts if partial is None else max(partial, ts)

    def state_columns(self, value: Column, ts: Column) -> dict[str, Column]:
        return {EXTREME.name: ts}


def pair_column(value: Column, ts: Column) -> Column:
    """An event's (ts, value) pair, as last and last_k keep it."""
    return _spark().struct(ts.alias(PAIR_TS), value.alias(PAIR_VALUE))


class Last(Operation):
    """Partial: [ts, value] of the latest event (equal times: the greater value), or None."""

    name = "last"
    fields = (PAIRS,)
    plan = "latest"
    ordered = True
    may_be_missing = True

    def init(self) -> list[Any] | None:
        return None

    def add(self, partial: list[Any] | None, ts: int, value: Any) -> list[Any] | None:
        return self.merge(partial, [ts, value])

    def merge(self, left: list[Any] | None, right: list[Any] | None) -> list[Any] | None:
        if left is None or right is None:
            return right if left is None else left
        return max(left, right)

    def finish(self, partial: list[Any] | None) -> Any:
        return None if partial is None else partial[1]

    def from_fields(self, fields: Mapping[str, Any]) -> list[Any] | None:
        pair = PAIRS.read(fields)
        return None if pair is None else [pair[PAIR_TS], pair[PAIR_VALUE]]

    def state_columns(self, value: Column, ts: Column) -> dict[str, Column]:
        return {PAIRS.name: pair_column(value, ts)}

    def merge_columns(self, partial: Getter) -> Merges:
        # The greatest pair of a group (never empty): the RAPIDS Accelerator runs no maximum
        # of a struct, but sorts a list of them.
        F = _spark()
        return {PAIRS.name: (F.collect_list(partial(PAIRS.name)),
                             lambda pairs: F.sort_array(pairs, asc=False)[0])}


class LastK(Operation):
    """Partial: the latest ``k`` [ts, value] pairs, newest first (equal times: the greater
    value first); finished: their values. It reads every event: a row standing for several
    would be each of them."""

    name = "last_k"
    takes_k = True
    fields = (PAIRS,)
    plan = "latest"
    ordered = True
    reads_each_event = True

    def init(self) -> list[list[Any]]:
        return []

    def add(self, partial: list[list[Any]], ts: int, value: Any) -> list[list[Any]]:
        return self.merge(partial, [[ts, value]])

    def merge(self, left: list[list[Any]], right: list[list[Any]]) -> list[list[Any]]:
        return sorted([*left, *right], reverse=True)[: self.k]

    def finish(self, partial: list[list[Any]]) -> list[Any]:
        return [value for _, value in partial]

    def from_fields(self, fields: Mapping[str, Any]) -> list[list[Any]]:
        return self.merge([], [[pair[PAIR_TS], pair[PAIR_VALUE]]
                               for pair in PAIRS.read(fields) or []])

    def state_columns(self, value: Column, ts: Column) -> dict[str, Column]:
        return {PAIRS.name: _spark().array(pair_column(value, ts))}

    def merge_columns(self, partial: Getter) -> Merges:
        F = _spark()
        return {PAIRS.name: (F.collect_list(partial(PAIRS.name)),
                             lambda lists: self.latest_column(F.flatten(lists)))}

    def latest_column(self, pairs: Column) -> Column:
        """The ``k`` latest of a list of pairs, newest first."""
        F = _spark()
        return F.slice(F.sort_array(pairs, asc=False), 1, self.k or 1)


class ApproxDistinct(Operation):
    """HyperLogLog over xxhash64 (Spark's ``xxhash64``, seed 42, of the value's UTF-8 text):
    partial {register: rank}, merged by the greater rank; finished: :func:`hll_estimate`.

    Written here rather than taken from a sketch library: the merge is an exact maximum, so
    the batch and the online store agree to the bit in any order (Apache DataSketches'
    union depends on the order of its inputs), and Spark builds the same registers with
    built-in functions the GPU runs. A table of tiles holds a key's registers and their
    ranks as two lists; the backfill has a plan of its own (a register's rank changes only
    at its events and where a hop of them leaves the window)."""

    name = "approx_distinct"
    fields = (REGISTERS, RANKS)
    reads = "text"
    plan = "distinct"
    counts = True
    per = REGISTERS

    def init(self) -> dict[int, int]:
        return {}

    def add(self, partial: dict[int, int], ts: int, value: Any) -> dict[int, int]:
        register, rank = hll_register(value if isinstance(value, str) else str(value))
        if partial.get(register, 0) < rank:
            partial = {**partial, register: rank}
        return partial

    def merge(self, left: dict[int, int], right: dict[int, int]) -> dict[int, int]:
        merged = dict(left)
        for register, rank in right.items():
            if merged.get(register, 0) < rank:
                merged[register] = rank
        return merged

    def finish(self, partial: dict[int, int]) -> int:
        return hll_estimate(partial)

    def from_fields(self, fields: Mapping[str, Any]) -> dict[int, int]:
        return dict(zip(REGISTERS.read(fields), RANKS.read(fields), strict=True))

    def json_column(self, fields: pa.Table) -> list[Any]:
        return [sorted([register, rank] for register, rank
                       in dict(zip(registers, ranks, strict=True)).items())
                for registers, ranks in zip(REGISTERS.column(fields), RANKS.column(fields),
                                            strict=True)]

    def to_json(self, partial: dict[int, int]) -> list[list[int]]:
        """[register, rank] pairs: JSON's object keys are text."""
        return sorted([register, rank] for register, rank in partial.items())

    def from_json(self, stored: list[list[int]]) -> dict[int, int]:
        return {register: rank for register, rank in stored}

    # The Spark half per register: an event's register and rank, merged per register by
    # the greater rank; the backfill's plan finishes from the count of registers set and the
    # sum of 2^(max rank − rank) (:meth:`estimate_column`).

    def state_columns(self, value: Column, ts: Column) -> dict[str, Column]:
        register, rank = self.register_columns(value.cast("string"))
        return {REGISTERS.name: register, RANKS.name: rank}

    def merge_columns(self, partial: Getter) -> Merges:
        return {RANKS.name: (_spark().max(partial(RANKS.name)), _same)}

    @staticmethod
    def register_columns(text: Column) -> tuple[Column, Column]:
        """A value's register and rank, as :func:`hll_register` computes them: xxhash64
        (seed 42) of its text; the low bits pick the register, 1 + the trailing zeros of the
        rest (read off its lowest set bit, a power of two) the rank."""
        F = _spark()
        hashed = F.xxhash64(text)  # Spark's seed: XXHASH_SEED
        register = hashed.bitwiseAND(F.lit(HLL_REGISTERS - 1))
        rest = F.shiftrightunsigned(hashed, HLL_BITS)
        lowest = rest.bitwiseAND(-rest)
        rank = F.when(rest == 0, F.lit(HLL_MAX_RANK)).otherwise(
            F.least(F.log2(lowest).cast("int") + 1, F.lit(HLL_MAX_RANK)))
        return register.cast("int"), rank.cast("int")

    @staticmethod
    def estimate_column(registers: Column, powers: Column) -> Column:
        """:func:`hll_estimate` from the count of registers set and the exact sum of
        2^(max rank − rank) over them."""
        F = _spark()
        empty = F.lit(HLL_REGISTERS) - registers
        harmonic = (empty * F.lit(1 << HLL_MAX_RANK) + powers).cast("double") / float(
            1 << HLL_MAX_RANK)
        raw = F.lit(HLL_ALPHA * HLL_REGISTERS * HLL_REGISTERS) / harmonic
        linear = F.lit(HLL_REGISTERS) * F.log(F.lit(float(HLL_REGISTERS))
                                              / empty.cast("double"))
        estimate = F.when((raw <= 2.5 * HLL_REGISTERS) & (empty > 0), linear).otherwise(raw)
        # Half to even, as Python's round(): the engine's estimate to the unit.
        return F.when(registers > 0, F.bround(estimate).cast("long")).otherwise(
            F.lit(0).cast("long"))


def hll_register(text: str) -> tuple[int, int]:
    """The register (the hash's low :data:`HLL_BITS` bits) and rank (1 + the trailing zeros
    of the rest, at most :data:`HLL_MAX_RANK`) of one value."""
    import xxhash

    hashed = xxhash.xxh64_intdigest(text.encode(), seed=XXHASH_SEED)
    rest = hashed >> HLL_BITS
    rank = (rest & -rest).bit_length() if rest else HLL_MAX_RANK
    return hashed & (HLL_REGISTERS - 1), min(rank, HLL_MAX_RANK)


def hll_estimate(registers: Mapping[int, int]) -> int:
    """The distinct count the registers estimate: HyperLogLog's harmonic mean, linear
    counting while it is below 2.5 × registers and some register is empty. The sum of
    2^(max rank − rank) is an exact integer, so Spark's sum equals this one."""
    empty = HLL_REGISTERS - len(registers)
    powers = sum(1 << (HLL_MAX_RANK - rank) for rank in registers.values())
    harmonic = (empty * (1 << HLL_MAX_RANK) + powers) / float(1 << HLL_MAX_RANK)
    raw = HLL_ALPHA * HLL_REGISTERS * HLL_REGISTERS / harmonic
    if raw <= 2.5 * HLL_REGISTERS and empty:
        return round(HLL_REGISTERS * math.log(HLL_REGISTERS / empty))
    return round(raw)


OPERATIONS: dict[str, type[Operation]] = {
    op.name: op for op in (Count, Sum, Mean, Variance, Min, Max, Latest, Last, LastK,
                            ApproxDistinct)}
