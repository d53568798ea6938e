"""The operations that keep the latest values read: ``last`` and ``last_k``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import Field

from featureline.core.operations.base import (
    Getter,
    Merges,
    Operation,
    Parameters,
    PartialField,
    _spark,
)

if TYPE_CHECKING:
    from pyspark.sql import Column

# A (ts, value) pair's fields, in last's and last_k's partials.
PAIR_TS, PAIR_VALUE = "ts", "v"
PAIRS = PartialField("p")


def pair_column(value: Column, ts: Column) -> Column:
    """An event's (ts, value) pair, as last and last_k keep it."""
    return _spark().struct(ts.alias(PAIR_TS), value.alias(PAIR_VALUE))


class OnePair(Operation):
    """Partial: the [ts, value] pair of one event, or None: the latest (equal times: the
    greater value) where ``newest``, else the earliest (equal times: the smaller value)."""

    fields = (PAIRS,)
    ordered = True
    may_be_missing = True
    newest: ClassVar[bool]

    def init(self) -> list[Any] | None:
        return None

    def add(self, partial: list[Any] | None, ts: int, value: Any) -> list[Any] | None:
        return self.merge(partial, [ts, value])

    def merge(self, left: list[Any] | None, right: list[Any] | None) -> list[Any] | None:
        if left is None or right is None:
            return right if left is None else left
        return max(left, right) if self.newest else min(left, right)

    def finish(self, partial: list[Any] | None) -> Any:
        return None if partial is None else partial[1]

    def from_fields(self, fields: Mapping[str, Any]) -> list[Any] | None:
        pair = PAIRS.read(fields)
        return None if pair is None else [pair[PAIR_TS], pair[PAIR_VALUE]]

    def state_columns(self, value: Column, ts: Column) -> dict[str, Column]:
        return {PAIRS.name: pair_column(value, ts)}

    def merge_columns(self, partial: Getter) -> Merges:
        # The group's pair (never empty) from a sorted list: the RAPIDS Accelerator runs no
        # maximum or minimum of a struct, but sorts a list of them.
        F = _spark()
        return {PAIRS.name: (F.collect_list(partial(PAIRS.name)),
                             lambda pairs: F.sort_array(pairs, asc=not self.newest)[0])}


class Last(OnePair):
    """The latest event's value."""

    name = "last"
    plan = "newest"
    newest = True


class KeepK(Parameters):
    """last_k's parameters."""

    # How many values it keeps.
    k: int = Field(ge=1)


class LastK(Operation):
    """Partial: the latest ``k`` [ts, value] pairs, newest first (equal times: the greater
    value first); finished: their values. It reads every event: a row standing for several
    would be each of them."""

    name = "last_k"
    parameters = KeepK
    fields = (PAIRS,)
    plan = "newest"
    ordered = True
    reads_each_event = True

    @property
    def k(self) -> int:
        """How many values it keeps."""
        assert isinstance(self.params, KeepK)
        return self.params.k

    def list_length(self) -> int:
        return self.k

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
        return F.slice(F.sort_array(pairs, asc=False), 1, self.k)


