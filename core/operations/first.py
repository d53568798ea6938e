"""``first``: the value of the earliest event in the window (equal times: the smaller value)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from featureline.core.operations.base import Getter, Merges, Operation, _spark
from featureline.core.operations.last import PAIR_TS, PAIR_VALUE, PAIRS, pair_column

if TYPE_CHECKING:
    from pyspark.sql import Column


class First(Operation):
    """Partial: [ts, value] of the earliest event, or None; pairs merge by the smaller. The
    backfill's oldest-pair plan computes it: the RAPIDS Accelerator runs no minimum of a
    struct over a frame."""

    name = "first"
    fields = (PAIRS,)
    plan = "oldest"
    ordered = True
    may_be_missing = True

    def init(self) -> list[Any] | None:
        return None

    def add(self, partial: list[Any] | None, ts: int, value: Any) -> list[Any] | None:
        return self.merge(partial, [ts, value])

    def merge(self, left: list[Any] | None, right: list[Any] | None) -> list[Any] | None:
        if left is None or right is None:
            return right if left is None else left
        return min(left, right)

    def finish(self, partial: list[Any] | None) -> Any:
        return None if partial is None else partial[1]

    def from_fields(self, fields: Mapping[str, Any]) -> list[Any] | None:
        pair = PAIRS.read(fields)
        return None if pair is None else [pair[PAIR_TS], pair[PAIR_VALUE]]

    def state_columns(self, value: Column, ts: Column) -> dict[str, Column]:
        return {PAIRS.name: pair_column(value, ts)}

    def merge_columns(self, partial: Getter) -> Merges:
        # The smallest pair of a group (never empty), from a sorted list of them (as last's).
        F = _spark()
        return {PAIRS.name: (F.collect_list(partial(PAIRS.name)),
                             lambda pairs: F.sort_array(pairs)[0])}
