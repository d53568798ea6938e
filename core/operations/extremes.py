"""The operations whose partial is one extreme value: ``min``, ``max`` and ``latest`` (the
latest event's time)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import pyarrow as pa

from featureline.core.operations.base import (
    Getter,
    Merges,
    Operation,
    PartialField,
    _same,
    _spark,
)

if TYPE_CHECKING:
    from pyspark.sql import Column

EXTREME = PartialField("m")


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


