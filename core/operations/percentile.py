"""``approx_percentile``: a percentile of the values, read off a histogram over declared
edges. The partial is the count per bucket, so partials merge by adding them (exactly, in any
order) and the backfill computes it as it computes ``count``."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pydantic import Field, field_validator

from featureline.core.operations.base import Getter, Parameters, PartialField, _spark, _Sums

if TYPE_CHECKING:
    from pyspark.sql import Column

# At most this many edges: the Spark half's finish is a chain over the buckets.
MAX_EDGES = 32


class Buckets(Parameters):
    """Buckets over declared edges: bucket 0 holds the values below ``edges[0]``, bucket i
    those in ``[edges[i − 1], edges[i])``, the last those at or above ``edges[-1]``."""

    # The edges, increasing.
    edges: tuple[float, ...] = Field(min_length=1, max_length=MAX_EDGES)

    @field_validator("edges")
    @classmethod
    def _increasing(cls, edges: tuple[float, ...]) -> tuple[float, ...]:
        if any(b <= a for a, b in itertools.pairwise(edges)):
            raise ValueError(f"edges must increase: {list(edges)}")
        return edges


class Percentile(Buckets):
    """approx_percentile's parameters."""

    # Which percentile, as a fraction: 0.5 is the median.
    q: float = Field(gt=0, lt=1)


class ApproxPercentile(_Sums):
    """The ``q`` percentile of the values, interpolated linearly inside the bucket that holds
    it (rank ``q × n``); in the outer buckets, their edge. None without values. Within a
    bucket's width of the exact percentile."""

    name = "approx_percentile"
    reads = "number"
    may_be_missing = True
    parameters = Percentile

    def __init__(self, params: Parameters | None = None) -> None:
        super().__init__(params)
        assert isinstance(self.params, Percentile)
        self.edges = self.params.edges
        self.q = self.params.q
        self.fields = tuple(PartialField(f"b{index}", "long", pa.int64(), 0)
                            for index in range(len(self.edges) + 1))

    def init(self) -> list[int]:
        return [0] * len(self.fields)

    def add(self, partial: list[int], ts: int, value: float) -> list[int]:
        counts = list(partial)
        counts[bisect.bisect_right(self.edges, value)] += 1
        return counts

    def merge(self, left: list[int], right: list[int]) -> list[int]:
        return [a + b for a, b in zip(left, right, strict=True)]

    def finish(self, partial: list[int]) -> float | None:
        rank = self.q * sum(partial)
        if not rank:
            return None
        below = 0
        for index, count in enumerate(partial):
            if count and below + count >= rank:
                return self._inside(index, float(below), float(count), rank)
            below += count
        return self.edges[-1]

    def _inside(self, index: int, below: Any, count: Any, rank: Any) -> Any:
        """The percentile in bucket ``index`` (floats or Spark columns): ``below`` values
        before it, ``count`` in it."""
        if index == 0:
            return self.edges[0]
        if index == len(self.edges):
            return self.edges[-1]
        low, high = self.edges[index - 1], self.edges[index]
        return (rank - below) / count * (high - low) + low

    def from_fields(self, fields: Mapping[str, Any]) -> list[int]:
        return [int(field.read(fields)) for field in self.fields]

    def json_column(self, fields: pa.Table) -> list[Any]:
        return [list(row) for row in zip(*(field.column(fields) for field in self.fields),
                                         strict=True)]

    def state_columns(self, value: Column, ts: Column) -> dict[str, Column]:
        F = _spark()
        number = value.cast("double")
        bounds = [None, *self.edges, None]
        state = {}
        for index, field in enumerate(self.fields):
            low, high = bounds[index], bounds[index + 1]
            inside = F.lit(True)
            if low is not None:
                inside = inside & (number >= F.lit(low))
            if high is not None:
                inside = inside & (number < F.lit(high))
            state[field.name] = F.when(inside, 1).otherwise(0).cast("long")
        return state

    def finish_column(self, partial: Getter) -> Column:
        F = _spark()
        counts = [partial(field.name) for field in self.fields]
        total = counts[0]
        for count in counts[1:]:
            total = total + count
        rank = F.lit(self.q) * total
        below = F.lit(0).cast("long")
        value = F.lit(self.edges[-1])
        chain = None
        for index, count in enumerate(counts):
            found = (count > 0) & (below + count >= rank)
            inside = F.lit(self._inside(index, 0.0, 1.0, 0.0)) if index in (
                0, len(self.edges)) else self._inside(index, below, count, rank)
            chain = F.when(found, inside) if chain is None else chain.when(found, inside)
            below = below + count
        assert chain is not None
        return F.when(total > 0, chain.otherwise(value)).cast("double")

    def exact_in_any_order(self, whole_numbers: bool) -> bool:
        return True
