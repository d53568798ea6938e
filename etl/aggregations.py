"""The backfill: the ``aggregations:`` spec's values at given times, in Spark — the batch
executor of the rule of time that ``core/aggregations.py`` defines (docs/ARCHITECTURE.md,
"Features as definitions").

For a window of length ``w`` and hop ``h``, the value at ``t`` covers ``[own − w, t)``, where
``own`` is the start of the hop holding ``t``. It is computed in two parts, each a window
function over one union of rows, so no range join is needed:

- **the whole hops** ``[own − w, own)``: the events folded per key and hop into *tiles*
  (``core.aggregations.tiles``' partials), merged over a range frame of the tiles' starts;
- **the own hop's events before ``t``**: a frame from the start of ``t``'s hop to just
  before ``t`` (events at ``t`` itself are not before it).

The lifetime window (``all``) is one frame over every earlier event of the key. Each
operation's partial is a set of columns merged by Spark aggregates that are its ``merge``
(sum, min, max, the greater of (ts, value) pairs, the k greatest pairs, the greater rank per
HyperLogLog register), and finished as ``core.aggregations`` finishes it; the tests check
both against a brute-force reference.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, Window, WindowSpec
from pyspark.sql import functions as F

from featureline.core.aggregations import (
    HLL_ALPHA,
    HLL_BITS,
    HLL_MAX_RANK,
    HLL_REGISTERS,
    LABEL,
    MICROS,
    AggregateFeature,
    GroupSpec,
)
from featureline.core.events import LabelSpec, label_text
from featureline.etl.features.base import TS_MICROS

# Row kinds in the union the frames run over.
_KIND = "_agg_kind"
_EVENT, _TILE, _ANCHOR = 0, 1, 2
# The start of the hop a row belongs to (µs); for a tile, its own start.
_HOP = "_agg_hop"
# The order of a row in its frames (µs): an event's time, a tile's start, an anchor's time
# less 1 µs; and in the frames of whole hops, an anchor's own hop's start less 1 µs.
_AT = "_agg_at"
_HOP_AT = "_agg_hop_at"
_REGISTER = "_agg_register"
_RANK = "_agg_rank"

# The operations that keep values in (ts, value) order: what they read may carry more.
ORDERED = ("last", "last_k")

Columns = dict[str, Column]
Getter = Callable[[str], Column]


def _same(column: Column) -> Column:
    return column


@dataclass(frozen=True)
class SparkOperation:
    """An operation's partial as columns: ``state`` of one event; ``merge`` over a set of
    partials — per column an aggregate (run in a group or over a frame) and what turns its
    result back into a partial; ``combine`` of partials (None: absent); ``finish``."""

    state: Callable[[Column], Columns]
    merge: Callable[[Getter], dict[str, tuple[Column, Callable[[Column], Column]]]]
    combine: Callable[[Getter, Getter], Columns]
    finish: Callable[[Getter, int | None], Column]


def _pair(value: Column) -> Column:
    return F.struct(F.col(TS_MICROS).alias("ts"), value.alias("v"))


def _latest_k(pairs: Column, k: int | None) -> Column:
    return F.slice(F.sort_array(pairs, asc=False), 1, k or 1)


def _plus(zero: int | float) -> Callable[[Column, Column], Column]:
    # Columns are built inside, where a session is active.
    return lambda a, b: F.coalesce(a, F.lit(zero)) + F.coalesce(b, F.lit(zero))


_ZERO_L, _ZERO_D = 0, 0.0
OPERATIONS: dict[str, SparkOperation] = {
    "count": SparkOperation(
        state=lambda v: {"n": F.lit(1).cast("long")},
        merge=lambda c: {"n": (F.sum(c("n")), _same)},
        combine=lambda a, b: {"n": _plus(_ZERO_L)(a("n"), b("n"))},
        finish=lambda c, k: c("n")),
    "sum": SparkOperation(
        state=lambda v: {"s": v.cast("double")},
        merge=lambda c: {"s": (F.sum(c("s")), _same)},
        combine=lambda a, b: {"s": _plus(_ZERO_D)(a("s"), b("s"))},
        finish=lambda c, k: c("s")),
    "mean": SparkOperation(
        state=lambda v: {"s": v.cast("double"), "n": F.lit(1).cast("long")},
        merge=lambda c: {"s": (F.sum(c("s")), _same), "n": (F.sum(c("n")), _same)},
        combine=lambda a, b: {"s": _plus(_ZERO_D)(a("s"), b("s")),
                              "n": _plus(_ZERO_L)(a("n"), b("n"))},
        finish=lambda c, k: F.when(c("n") > 0, c("s") / c("n"))),
    "min": SparkOperation(
        state=lambda v: {"m": v},
        merge=lambda c: {"m": (F.min(c("m")), _same)},
        combine=lambda a, b: {"m": F.least(a("m"), b("m"))},
        finish=lambda c, k: c("m")),
    "max": SparkOperation(
        state=lambda v: {"m": v},
        merge=lambda c: {"m": (F.max(c("m")), _same)},
        combine=lambda a, b: {"m": F.greatest(a("m"), b("m"))},
        finish=lambda c, k: c("m")),
    "last": SparkOperation(
        state=lambda v: {"p": _pair(v)},
        merge=lambda c: {"p": (F.max(c("p")), _same)},
        combine=lambda a, b: {"p": F.greatest(a("p"), b("p"))},
        finish=lambda c, k: c("p")["v"]),
    "last_k": SparkOperation(
        state=lambda v: {"p": F.array(_pair(v))},
        merge=lambda c: {"p": (F.collect_list(c("p")), F.flatten)},
        combine=lambda a, b: {"p": F.concat(F.coalesce(a("p"), F.array()),
                                            F.coalesce(b("p"), F.array()))},
        finish=lambda c, k: F.transform(_latest_k(c("p"), k), lambda pair: pair["v"])),
}


def _merged(operation: SparkOperation, getter: Getter, window: WindowSpec | None = None,
            prefix: str = "") -> list[Column]:
    """The merge's columns, aggregated in a group (no ``window``) or over a frame."""
    return [post(aggregate if window is None else aggregate.over(window)).alias(prefix + name)
            for name, (aggregate, post) in operation.merge(getter).items()]


def rule_column(rule: LabelSpec, categorical: bool) -> Column:
    """Whether an event matches ``rule`` (a missing value never matches): the label's and
    the filters' test, as ``core.events.matcher`` reads it; ``categorical``: the rule's
    column holds text (its literals compared as ``label_text``)."""
    column = F.col(rule.column)
    values = rule.value if isinstance(rule.value, list) else [rule.value]
    literals = [label_text(v) if categorical else float(v) if not isinstance(v, str) else v
                for v in values]
    comparisons = {">=": column.__ge__, ">": column.__gt__, "<=": column.__le__,
                   "<": column.__lt__, "==": column.__eq__, "!=": column.__ne__}
    matches = column.isin(literals) if rule.op == "in" else comparisons[rule.op](literals[0])
    return F.coalesce(matches, F.lit(False))


def backfill(events: DataFrame, queries: DataFrame, groups: Sequence[GroupSpec],
             numeric: Sequence[str], values: Mapping[str, Column] | None = None) -> DataFrame:
    """``queries`` (each group's keys and ``TS_MICROS``) with every output of ``groups``
    (``<group>__<feature>``) at its time, from ``events`` (the accepted events with their
    label and ``TS_MICROS``). ``numeric``: the events' number columns (filters compare them
    as numbers). ``values``: what a feature reads of a column where not the column itself
    (a struct of the value and its encoded id: last and last_k order by the value first)."""
    for group in groups:
        anchors = queries.select(*group.keys, TS_MICROS).distinct()
        queries = queries.join(group_values(events, anchors, group, numeric, values),
                               on=[*group.keys, TS_MICROS], how="left")
    return queries


def group_values(events: DataFrame, anchors: DataFrame, group: GroupSpec,
                 numeric: Sequence[str], values: Mapping[str, Column] | None = None
                 ) -> DataFrame:
    """One group's outputs at ``anchors`` (distinct keys and ``TS_MICROS``): a row each."""
    keys = list(group.keys)
    at = anchors
    for feature in group.outputs():
        column = feature.spec.column
        read = (values or {}).get(column) if column and feature.spec.op in ORDERED else None
        at = at.join(_values_at(events, anchors, keys, feature, numeric, read),
                     on=[*keys, TS_MICROS], how="left")
    return at


def _kept(events: DataFrame, feature: AggregateFeature, numeric: Sequence[str]) -> DataFrame:
    spec = feature.spec
    kept = events
    if spec.filter is not None:
        rule = spec.rule()
        kept = kept.where(F.col(LABEL) == 1 if rule is None else rule_column(
            rule, rule.column not in (*numeric, "ts")))
    if spec.column is not None:  # accepted events hold no NaN: validation quarantines it
        kept = kept.where(F.col(spec.column).isNotNull())
    return kept


def _values_at(events: DataFrame, anchors: DataFrame, keys: list[str],
               feature: AggregateFeature, numeric: Sequence[str],
               read: Column | None) -> DataFrame:
    """(keys, TS_MICROS, the feature's column) for each anchor."""
    kept = _kept(events, feature, numeric)
    value = read if read is not None else (
        F.col(feature.spec.column) if feature.spec.column else F.lit(True))
    if feature.spec.op == "approx_distinct":
        return _distinct_at(kept, anchors, keys, feature, value)
    operation = OPERATIONS[feature.spec.op]
    state = operation.state(value)
    names = list(state)
    rows = kept.select(*keys, TS_MICROS, F.col(TS_MICROS).alias(_AT), F.lit(_EVENT).alias(_KIND),
                       *(column.alias(name) for name, column in state.items()))
    anchor_rows = _anchor_rows(anchors, keys, state)
    window = feature.window
    if window.hop is None:
        union = rows.unionByName(anchor_rows)
        result = union.select(*keys, TS_MICROS, _KIND,
                              *_merged(operation, F.col, _before(keys)))
        # Combined with no partial: a count or sum of no events reads 0, as in the engine.
        alone = operation.combine(F.col, lambda name: F.lit(None))
        value_column = operation.finish(lambda name: alone[name], feature.spec.k)
        return result.where(F.col(_KIND) == _ANCHOR).select(
            *keys, TS_MICROS, value_column.alias(feature.column_name))
    hop = window.hop * MICROS
    span = (window.seconds or 0) * MICROS
    events_in_hops = rows.withColumns({_HOP: _hop_of(hop), _HOP_AT: _hop_of(hop)})
    tiles = events_in_hops.groupBy(*keys, _HOP).agg(*_merged(operation, F.col)).select(
        *keys, F.col(_HOP).alias(TS_MICROS), F.col(_HOP).alias(_AT), F.lit(_TILE).alias(_KIND),
        F.col(_HOP), F.col(_HOP).alias(_HOP_AT), *names)
    union = (events_in_hops.unionByName(tiles).unionByName(anchor_rows.withColumns(
        {_HOP: _hop_of(hop), _HOP_AT: _hop_of(hop) - 1})))
    framed = union.select(
        *keys, TS_MICROS, _KIND,
        *_merged(operation, lambda name: F.when(F.col(_KIND) == _TILE, F.col(name)),
                 _whole_hops(keys, span), "a_"),
        *_merged(operation, lambda name: F.when(F.col(_KIND) == _EVENT, F.col(name)),
                 _before(keys, _HOP), "b_"))
    combined = operation.combine(lambda name: F.col(f"a_{name}"), lambda name: F.col(f"b_{name}"))
    value_column = operation.finish(lambda name: combined[name], feature.spec.k)
    return framed.where(F.col(_KIND) == _ANCHOR).select(
        *keys, TS_MICROS, value_column.alias(feature.column_name))


# The frames end at the current row (the RAPIDS Accelerator runs no range frame whose upper
# bound lies behind it): an anchor at t is ordered at t − 1 µs, so "up to it" is "before t";
# the anchor itself holds no event.


def _hop_of(hop: int) -> Column:
    """The start of the hop holding a row's time (µs)."""
    return F.floor(F.col(TS_MICROS) / hop).cast("long") * hop


def _before(keys: Sequence[str], *within: str) -> WindowSpec:
    """The key's events before an anchor's time (in the anchor's hop, with ``within``)."""
    return Window.partitionBy(*keys, *within).orderBy(_AT).rangeBetween(
        Window.unboundedPreceding, 0)


def _whole_hops(keys: Sequence[str], span: int) -> WindowSpec:
    """The tiles of the whole hops [own − window, own) of an anchor ordered at own − 1 µs."""
    return Window.partitionBy(*keys).orderBy(_HOP_AT).rangeBetween(-(span - 1), 0)


def _anchor_rows(anchors: DataFrame, keys: list[str], state: Columns) -> DataFrame:
    rows = anchors.select(*keys, TS_MICROS, (F.col(TS_MICROS) - 1).alias(_AT),
                          F.lit(_ANCHOR).alias(_KIND))
    # An anchor holds no event: null state, typed as an event's.
    return rows.select("*", *(F.lit(None).alias(name) for name in state))


def hll_columns(text: Column) -> tuple[Column, Column]:
    """A value's HyperLogLog register and rank, as ``core.aggregations.hll_register`` computes
    them: xxhash64 (seed 42) of its text; the low bits pick the register, 1 + the trailing
    zeros of the rest (read off its lowest set bit, a power of two) the rank."""
    hashed = F.xxhash64(text)  # Spark's seed: XXHASH_SEED
    register = hashed.bitwiseAND(F.lit(HLL_REGISTERS - 1))
    rest = F.shiftrightunsigned(hashed, HLL_BITS)
    lowest = rest.bitwiseAND(-rest)
    rank = F.when(rest == 0, F.lit(HLL_MAX_RANK)).otherwise(
        F.least(F.log2(lowest).cast("int") + 1, F.lit(HLL_MAX_RANK)))
    return register.cast("int"), rank.cast("int")


def hll_estimate_column(registers: Column, powers: Column) -> Column:
    """``core.aggregations.hll_estimate`` from the count of registers set and the exact sum
    of 2^(max rank − rank) over them."""
    empty = F.lit(HLL_REGISTERS) - registers
    harmonic = (empty * F.lit(1 << HLL_MAX_RANK) + powers).cast("double") / float(
        1 << HLL_MAX_RANK)
    raw = F.lit(HLL_ALPHA * HLL_REGISTERS * HLL_REGISTERS) / harmonic
    linear = F.lit(HLL_REGISTERS) * F.log(F.lit(float(HLL_REGISTERS)) / empty.cast("double"))
    estimate = F.when((raw <= 2.5 * HLL_REGISTERS) & (empty > 0), linear).otherwise(raw)
    return F.when(registers > 0, F.round(estimate).cast("long")).otherwise(F.lit(0).cast("long"))


def _distinct_at(kept: DataFrame, anchors: DataFrame, keys: list[str],
                 feature: AggregateFeature, value: Column) -> DataFrame:
    """approx_distinct: per key and register, the greatest rank in the frames (the same two
    parts as the other operations), then the estimate over the registers at each anchor."""
    register, rank = hll_columns(value.cast("string"))
    rows = kept.select(*keys, TS_MICROS, F.col(TS_MICROS).alias(_AT),
                       register.alias(_REGISTER), rank.alias(_RANK), F.lit(_EVENT).alias(_KIND))
    by_register = [*keys, _REGISTER]
    # Each anchor once per register its key has.
    registers = rows.select(*by_register).distinct()
    anchor_rows = anchors.join(registers, on=keys).select(
        *keys, TS_MICROS, (F.col(TS_MICROS) - 1).alias(_AT), _REGISTER,
        F.lit(None).cast("int").alias(_RANK), F.lit(_ANCHOR).alias(_KIND))
    window = feature.window
    if window.hop is None:
        ranked = rows.unionByName(anchor_rows).select(
            *keys, TS_MICROS, _KIND, F.max(_RANK).over(_before(by_register)).alias(_RANK))
    else:
        hop = window.hop * MICROS
        span = (window.seconds or 0) * MICROS
        events_in_hops = rows.withColumns({_HOP: _hop_of(hop), _HOP_AT: _hop_of(hop)})
        tiles = events_in_hops.groupBy(*by_register, _HOP).agg(F.max(_RANK).alias(_RANK)).select(
            *keys, F.col(_HOP).alias(TS_MICROS), F.col(_HOP).alias(_AT), _REGISTER, _RANK,
            F.lit(_TILE).alias(_KIND), _HOP, F.col(_HOP).alias(_HOP_AT))
        union = (events_in_hops.unionByName(tiles).unionByName(anchor_rows.withColumns(
            {_HOP: _hop_of(hop), _HOP_AT: _hop_of(hop) - 1})))
        of_tiles = F.max(F.when(F.col(_KIND) == _TILE, F.col(_RANK))).over(
            _whole_hops(by_register, span))
        of_events = F.max(F.when(F.col(_KIND) == _EVENT, F.col(_RANK))).over(
            _before(by_register, _HOP))
        ranked = union.select(*keys, TS_MICROS, _KIND,
                              F.greatest(of_tiles, of_events).alias(_RANK))
    at_anchors = ranked.where(F.col(_KIND) == _ANCHOR)
    estimates = at_anchors.groupBy(*keys, TS_MICROS).agg(
        F.count(_RANK).alias("registers"),
        # 2^(max rank − rank): a power of two, exact as a double and as a long.
        F.sum(F.pow(F.lit(2.0), F.lit(HLL_MAX_RANK) - F.col(_RANK)).cast("long"))
        .alias("powers"))
    values = estimates.select(*keys, TS_MICROS, hll_estimate_column(
        F.col("registers"), F.coalesce(F.col("powers"), F.lit(0).cast("long")))
        .alias(feature.column_name))
    # Anchors of keys with no kept event at all read 0.
    return anchors.join(values, on=[*keys, TS_MICROS], how="left").fillna(
        0, subset=[feature.column_name])
