"""``approx_distinct``: HyperLogLog over xxhash64, merged by the greater rank per register."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from featureline.core.operations.base import Getter, Merges, Operation, PartialField, _same, _spark

if TYPE_CHECKING:
    from pyspark.sql import Column

# approx_distinct's HyperLogLog: 2^14 registers (0.8 % standard error), ranks capped at 40
# (exact far beyond 2^40 distinct values; the sum of 2^(40 − rank) fits a long exactly).
HLL_BITS = 14
HLL_REGISTERS = 1 << HLL_BITS
HLL_MAX_RANK = 40
HLL_ALPHA = 0.7213 / (1 + 1.079 / HLL_REGISTERS)
# Spark's xxhash64 seed.
XXHASH_SEED = 42
# A register and its rank (a tile lists them: array<int> each).
REGISTERS = PartialField("registers", "int", empty=[])
RANKS = PartialField("ranks", "int", empty=[])


class ApproxDistinct(Operation):
    """HyperLogLog over xxhash64 (Spark's ``xxhash64``, seed 42, of the value's UTF-8 text):
    partial {register: rank}, merged by the greater rank; finished: :func:`hll_estimate`.

    Written here rather than taken from a sketch library: the merge is an exact maximum, so
    the batch and the online store agree to the bit in any order (Apache DataSketches'
    union depends on the order of its inputs), and Spark builds the same registers with
    built-in functions the GPU runs. A table of tiles holds a key's registers and their
    ranks as two lists; the backfill reads it by the per-value plan (a register's rank changes only
    at its events and where a hop of them leaves the window)."""

    name = "approx_distinct"
    fields = (REGISTERS, RANKS)
    reads = "text"
    plan = "per_value"
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

    def value_terms(self, greatest: Column) -> dict[str, Column]:
        """A register's terms: 1 for being set, and 2^(max rank − rank) (a power of two,
        exact as a double and as a long); none without a rank."""
        F = _spark()
        present = greatest.isNotNull()
        return {"set": F.when(present, 1).otherwise(0).cast("long"),
                "powers": F.when(present, F.pow(F.lit(2.0), F.lit(HLL_MAX_RANK) - greatest)
                                 .cast("long")).otherwise(F.lit(0).cast("long"))}

    def finish_terms(self, sums: Getter) -> Column:
        return self.estimate_column(sums("set"), sums("powers"))

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


