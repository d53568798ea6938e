"""The operations whose partials are sums: ``count``, ``sum``, ``mean`` and ``variance``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from featureline.core.operations.base import COUNT, SUM, Getter, PartialField, _spark, _Sums

if TYPE_CHECKING:
    from pyspark.sql import Column

SQUARES = PartialField("q", "double", pa.float64(), 0.0)
# variance's: the value its sums are measured from, and the sum of the deviations from it.
SHIFT = PartialField("c", "double", pa.float64(), 0.0, reference=True)
DEVIATIONS = PartialField("d", "double", pa.float64(), 0.0)


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
    mean). Partial: [count, reference, Σ (x − reference), Σ (x − reference)²], the reference
    being one of the values (the first added), so the sums stay near the values' spread
    however far they are from 0; two partials merge by moving the second to the first's
    reference (Chan's update). Finished as ``q / n − (s / n)²`` (never below 0); no events →
    None. In Spark the executors move a key's partials to one reference, then add them."""

    name = "variance"
    fields = (COUNT, SHIFT, DEVIATIONS, SQUARES)
    reads = "number"
    may_be_missing = True
    version = 2

    def init(self) -> list[float]:
        return [0, 0.0, 0.0, 0.0]

    def add(self, partial: list[float], ts: int, value: float) -> list[float]:
        count, shift, total, squares = partial
        if not count:
            return [1, float(value), 0.0, 0.0]
        deviation = value - shift
        return [count + 1, shift, total + deviation, squares + deviation * deviation]

    def merge(self, left: list[float], right: list[float]) -> list[float]:
        if not right[0]:
            return left
        if not left[0]:
            return right
        count, total, squares = _moved(right, left[1])
        return [left[0] + count, left[1], left[2] + total, left[3] + squares]

    def finish(self, partial: list[float]) -> float | None:
        count, _, total, squares = partial
        if not count:
            return None
        mean = total / count
        return max(squares / count - mean * mean, 0.0)

    def from_fields(self, fields: Mapping[str, Any]) -> list[float]:
        return [int(COUNT.read(fields)), float(SHIFT.read(fields)),
                float(DEVIATIONS.read(fields)), float(SQUARES.read(fields))]

    def json_column(self, fields: pa.Table) -> list[Any]:
        return [list(row) for row in zip(*(field.column(fields) for field in self.fields),
                                         strict=True)]

    def state_columns(self, value: Column, ts: Column) -> dict[str, Column]:
        F = _spark()
        return {COUNT.name: COUNT.typed(F.lit(1)), SHIFT.name: SHIFT.typed(value),
                DEVIATIONS.name: F.lit(0.0), SQUARES.name: F.lit(0.0)}

    def rebase_columns(self, partial: Getter, reference: Column) -> dict[str, Column]:
        count, total = partial(COUNT.name), partial(DEVIATIONS.name)
        moved = partial(SHIFT.name) - reference
        return {SHIFT.name: reference, DEVIATIONS.name: total + count * moved,
                SQUARES.name: partial(SQUARES.name) + 2 * moved * total
                + count * moved * moved}

    def finish_column(self, partial: Getter) -> Column:
        F = _spark()
        count = partial(COUNT.name)
        mean = partial(DEVIATIONS.name) / count
        return F.when(count > 0, F.greatest(partial(SQUARES.name) / count - mean * mean,
                                            F.lit(0.0)))


def _moved(partial: list[float], reference: float) -> tuple[float, float, float]:
    """A variance partial's count and sums measured from ``reference`` instead of its own."""
    count, shift, total, squares = partial
    moved = shift - reference
    return (count, total + count * moved,
            squares + 2 * moved * total + count * moved * moved)
