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

A windowed count, and a sum or mean of whole numbers, is instead the key's running sum
less the rows that have left the window (one exit row per key and exit time): one frame for
all of them and the lifetime window (``all``), which is one frame over every earlier event
of the key. Each
operation's partial is a set of columns merged by Spark aggregates that are its ``merge``
(sum, min, max, the greater of (ts, value) pairs, the k greatest pairs, the greater rank per
HyperLogLog register), and finished as ``core.aggregations`` finishes it; the tests check
both against a brute-force reference.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from pyspark.sql import Column, DataFrame, Window, WindowSpec
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, BooleanType, DataType, IntegralType, StructType

from featureline.core.aggregations import LABEL, MICROS, AggregateFeature, GroupSpec
from featureline.core.aggregations import Window as TimeWindow
from featureline.core.events import LabelSpec, compares_text, label_text
from featureline.core.metadata import EVENT_TIMESTAMP
from featureline.core.operations import PAIR_TS, PAIR_VALUE, Getter, Operation, pair_column
from featureline.core.time_rule import DAY, expires, floor_to, next_midnight
from featureline.etl.features.base import TS_MICROS, hop_start

# Row kinds in the union the frames run over.
_KIND = "_agg_kind"
_EVENT, _TILE, _ANCHOR = 0, 1, 2
# A key's whole hops before an anchor's own hop, merged: kind ``_WHOLE + hop`` (µs).
_WHOLE = 3
# A row's partial leaving its windows (negated): at the exit time less 1 µs.
_EXIT = -1
# The start of the hop a row belongs to (µs), one column per hop ("_agg_hop<µs>"); for a
# tile, its own start.
_HOP = "_agg_hop"
# The order of a row in its frames (µs): an event's time, a tile's start, an anchor's time
# less 1 µs.
_AT = "_agg_at"
_REGISTER = "_agg_register"
# Per key of the lifetime partials: whether it had an event before their end.
_EARLIER = "_agg_earlier"
_RANK = "_agg_rank"
# last and last_k: an event's latest pairs up to itself, its place in (ts, value) order.
_PAIRS = "_agg_pairs"
_SEQ = "_agg_seq"
# last_k reads its k latest pairs with one lag each up to this k (the RAPIDS Accelerator
# runs lags; a collect_list over a frame only when told to), a frame's list beyond it.
LAGGED_UP_TO_K = 32

# A row standing for this many equal events (the same keys, time key and columns read), where
# a frame has the column: the additive operations count it that many times; an extreme, or
# the latest of equal events, is any one of them's.
WEIGHT = "_agg_weight"

Columns = dict[str, Column]


def _state(feature: AggregateFeature, value: Column, frame: DataFrame) -> Columns:
    """The partial of one of ``frame``'s rows: an event's, or where the frame has ``WEIGHT``,
    that of the equal events the row stands for. ValueError for last_k over such rows (its k
    latest would hold each of them)."""
    operation = feature.operation()
    state = operation.state_columns(value, F.col(TS_MICROS))
    _reads_rows_as_events(feature, frame)
    if WEIGHT not in frame.columns or not operation.additive:
        return state
    reference = operation.reference_field()
    return {name: column if reference and name == reference.name else column * F.col(WEIGHT)
            for name, column in state.items()}


def _rebased(frame: DataFrame, group: Sequence[str],
             partials: Sequence[tuple[Operation, Callable[[str], str]]]) -> DataFrame:
    """``frame`` with each partial that has a reference field (variance's shift: each
    (operation, its field's column by field name)) measured from one reference per ``group``
    (its columns' values): the least of its rows'. Adding their other fields then merges
    them, in a group or over a frame (``Operation.rebase_columns``)."""
    moved: dict[str, Column] = {}
    for operation, column in partials:
        field = operation.reference_field()
        if field is None:
            continue
        reference = F.min(column(field.name)).over(Window.partitionBy(*group))
        read: Getter = functools.partial(_column_of, column)
        moved.update({column(name): value for name, value
                      in operation.rebase_columns(read, reference).items()})
    return frame.withColumns(moved) if moved else frame


def _column_of(column: Callable[[str], str], name: str) -> Column:
    """The column holding a partial's field ``name``."""
    return F.col(column(name))


def _reads_rows_as_events(feature: AggregateFeature, frame: DataFrame) -> None:
    """ValueError for last_k over ``frame``'s rows where they stand for several events
    (``WEIGHT``): its k latest would hold each of them."""
    if feature.operation().reads_each_event and WEIGHT in frame.columns:
        raise ValueError(f"{feature.qualified}: {feature.spec.op} reads every event, not rows that "
                         "stand for several")


def _merged(operation: Operation, getter: Getter, window: WindowSpec | None = None,
            prefix: str = "") -> list[Column]:
    """The merge's columns, aggregated in a group (no ``window``) or over a frame."""
    return [post(aggregate if window is None else aggregate.over(window)).alias(prefix + name)
            for name, (aggregate, post) in operation.merge_columns(getter).items()]


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


def group_values(events: DataFrame, anchors: DataFrame | None, group: GroupSpec,
                 numeric: Sequence[str], values: Mapping[str, Column] | None = None,
                 aligned: int | None = None, prior: Lifetime | None = None,
                 outputs: Sequence[AggregateFeature] | None = None,
                 days: DataFrame | None = None) -> DataFrame:
    """One group's outputs at ``anchors`` (distinct keys and ``TS_MICROS``): a row each
    (``outputs``: those of the group's only).

    Every output but approx_distinct comes from one union of the group's events, its tiles
    (one set per hop) and the anchors, and one select of window functions over it: the
    events' plan is read once per hop, not once per output. ``aligned`` (µs): every anchor
    is a multiple of it — the events are then folded per key and span of it before the
    frames run, which see no single event; no ``anchors`` with it: the end of each span a
    key had events in (the entity tables' midnights after each active day). ``prior`` (with
    ``aligned`` and ``anchors``): the lifetime outputs' partials of the events before
    ``events``' (``prior.before``, a multiple of ``aligned``), folded in as their span.
    ``days``: the :func:`day_partials` of the days before ``events``', each read as one event
    at its day's start (``outputs`` then on days only, :func:`on_days`)."""
    keys = list(group.keys)
    outputs = list(group.outputs() if outputs is None else outputs)
    own_plan = {"per_value": _per_value_at, "newest": _newest_at, "oldest": _oldest_at}
    framed = [f for f in outputs if f.operation().plan not in own_plan]
    if anchors is None and not (aligned and framed):
        raise ValueError("group_values: anchors are needed without aligned framed outputs")
    if prior is not None and (anchors is None or not aligned or prior.before % aligned
                              or len(framed) < len(outputs)):
        raise ValueError("group_values: a prior needs anchors, aligned spans it starts one "
                         "of, and framed outputs only")
    if days is not None and (anchors is None or aligned or not all(map(on_days, outputs))):
        raise ValueError("group_values: day partials need anchors, no aligned spans, and "
                         "outputs on days only")
    for feature in outputs:
        _reads_rows_as_events(feature, events)
    if framed:
        at = _framed_values(events, anchors, keys, framed, numeric, values or {}, aligned,
                            prior, days)
    elif anchors is not None:
        at = anchors
    if anchors is None:
        anchors = at.select(*keys, TS_MICROS)
    for feature in outputs:
        if feature.operation().plan in own_plan:
            values_at = own_plan[feature.operation().plan](
                events.where(_keeps(feature, numeric)), anchors, keys, feature,
                _read(feature, values or {}))
            at = at.join(values_at, on=[*keys, TS_MICROS], how="left")
    return at


def _keeps(feature: AggregateFeature, numeric: Sequence[str]) -> Column:
    """Whether an event counts for the feature: its filter, and its column present
    (accepted events hold no NaN: validation quarantines it)."""
    spec = feature.spec
    keeps = F.lit(True)
    if spec.filter is not None:
        rule = spec.rule()
        keeps = F.col(LABEL) == 1 if rule is None else rule_column(
            rule, compares_text(rule.column, numeric))
    if spec.column is not None:
        keeps = keeps & F.col(spec.column).isNotNull()
    return keeps


def _read(feature: AggregateFeature, values: Mapping[str, Column]) -> Column:
    column = feature.spec.column
    if column is None:
        return F.lit(True)
    read = values.get(column) if feature.operation().ordered else None
    return read if read is not None else F.col(column)


def _framed_values(events: DataFrame, anchors: DataFrame | None, keys: list[str],
                   features: list[AggregateFeature], numeric: Sequence[str],
                   values: Mapping[str, Column], aligned: int | None = None,
                   prior: Lifetime | None = None, days: DataFrame | None = None
                   ) -> DataFrame:
    """The outputs of the frames plan at ``anchors`` (or, with ``aligned`` and none, at the
    end of each folded span): one union of the event rows (``days``' rows among them), the
    exit rows, the whole-hop rows and the anchors, and each output's columns over frames of
    it (:func:`plan_for`)."""
    plans = [plan_for(index, feature, aligned, events.schema)
             for index, feature in enumerate(features)]
    state = {name: column for plan in plans
             for name, column in plan.state(numeric, values, events).items()}
    hops = sorted({plan.hop for plan in plans if isinstance(plan, TilesAndHead)})
    # A key's rows measured from one reference where a partial has one (variance's shift):
    # the events, then again once folded spans, a prior's or stored days' rows join them.
    rebasing = [(plan.operation, functools.partial(plan.column, STATE)) for plan in plans
                if plan.operation.reference_field() is not None]
    if rebasing:
        events = _rebased(events.select(*keys, TS_MICROS, *(
            c.alias(n) for n, c in state.items())), keys, rebasing)
        state = {name: F.col(name) for name in state}
    if aligned:
        events = _folded(events, keys, plans, state, aligned, prior)
        state = {name: F.col(name) for name in state}
    if days is not None:  # each day's partial: an event row at the day's start
        events = events.select(*keys, TS_MICROS, *(c.alias(n) for n, c in state.items()))
        events = events.unionByName(days.select(*keys, TS_MICROS, *(
            F.col(_partial_column(plan.feature, field)).alias(plan.column(STATE, field))
            for plan in plans for field in plan.fields)))
        state = {name: F.col(name) for name in state}
    if rebasing and (prior is not None or days is not None):
        events = _rebased(events, keys, rebasing)
    rows, union, queried = _rows_and_anchors(events, anchors, keys, state, hops, aligned)
    union = _with_exits(union, rows, keys, [p for p in plans if isinstance(p, Exits)], aligned)
    # The frames ordered by time per key first; the exit rows are gone before the others.
    running = [plan for plan in plans if plan.running]
    if running:
        union = union.select("*", *(c for plan in running for c in plan.running_columns(keys))
                             ).where(F.col(_KIND) != _EXIT)
    for hop in hops:
        # The whole hops of the tiled outputs of this hop: a row per key and queried hop.
        tiled = [p for p in plans if isinstance(p, TilesAndHead) and p.hop == hop]
        tiles = rows.groupBy(*keys, f"{_HOP}{hop}").agg(*(
            c for plan in tiled for c in plan.merged(plan.partial(STATE), part=STATE)))
        union = union.unionByName(_whole_hop_rows(
            tiles, queried.select(*keys, hop_start(hop).alias(f"{_HOP}{hop}")).distinct(),
            keys, hop, [(plan.span, plan.hops_merged) for plan in tiled]),
            allowMissingColumns=True)
    framed = union.select(*keys, TS_MICROS, _KIND, *(
        c for plan in plans for c in plan.anchor_columns(keys))).where(F.col(_KIND) == _ANCHOR)
    return framed.select(*keys, TS_MICROS, *(plan.value() for plan in plans))


def _folded(events: DataFrame, keys: list[str], plans: Sequence[FramedPlan],
            state: Columns, aligned: int, prior: Lifetime | None) -> DataFrame:
    """The events folded per key and aligned span: each span's partial, at its start; with
    ``prior``, the lifetime partials of the events before the first span as one more span
    (the one before it), counted by the lifetime outputs only."""
    folded = [column for plan in plans for column in plan.merged(plan.partial(STATE),
                                                                 part=STATE)]
    events = events.select(*keys, TS_MICROS, *(c.alias(n) for n, c in state.items()))
    events = events.groupBy(*keys, floor_to(F.col(TS_MICROS), aligned)
                            .alias(TS_MICROS)).agg(*folded)
    if prior is None:
        return events
    return events.unionByName(prior.frame.select(
        *keys, F.lit(prior.before - aligned).alias(TS_MICROS),
        *(F.col(_partial_column(plan.feature, field)).alias(plan.column(STATE, field))
          for plan in plans if plan.feature.window.seconds is None for field in plan.fields)),
        allowMissingColumns=True)


def _rows_and_anchors(events: DataFrame, anchors: DataFrame | None, keys: list[str],
                      state: Columns, hops: Sequence[int], aligned: int | None
                      ) -> tuple[DataFrame, DataFrame, DataFrame]:
    """The event rows (their partials, ``_AT`` and each tiled hop's start), their union with
    the anchors (ordered at ``t − 1 µs``), and the anchors. Without ``anchors``: each folded
    span (one row per key and span) is also the anchor at its end, one row read once."""
    hop_columns = {f"{_HOP}{hop}": hop_start(hop) for hop in hops}
    if anchors is not None:
        rows = events.select(*keys, TS_MICROS, F.col(TS_MICROS).alias(_AT),
                             F.lit(_EVENT).alias(_KIND),
                             *(c.alias(n) for n, c in state.items()),
                             *(c.alias(n) for n, c in hop_columns.items()))
        union = rows.unionByName(anchors.select(
            *keys, TS_MICROS, (F.col(TS_MICROS) - 1).alias(_AT), F.lit(_ANCHOR).alias(_KIND),
            *(c.alias(n) for n, c in hop_columns.items())), allowMissingColumns=True)
        return rows, union, anchors
    both = events.select("*", F.explode(F.array(F.lit(_EVENT), F.lit(_ANCHOR))).alias(_KIND))
    anchor = F.col(_KIND) == _ANCHOR
    union = both.select(*keys, F.when(anchor, F.col(TS_MICROS) + F.lit(aligned))
                        .otherwise(F.col(TS_MICROS)).alias(TS_MICROS), _KIND,
                        *(F.when(~anchor, F.col(n)).alias(n) for n in state))
    union = union.select(
        "*", (F.col(TS_MICROS) - F.when(anchor, 1).otherwise(0)).alias(_AT),
        *(c.alias(n) for n, c in hop_columns.items()))
    return union.where(~anchor), union, union.where(anchor)


def _with_exits(union: DataFrame, rows: DataFrame, keys: list[str], plans: Sequence[Exits],
                aligned: int | None) -> DataFrame:
    """``union`` with the exit rows of the ``plans``: per key and time their rows leave a
    window, those rows' partial negated. A hop's tiles (a folded span's: that of its last
    µs) are read once for every window length that hop has."""
    by_hop: dict[int, dict[int, list[Exits]]] = {}
    for plan in plans:
        by_hop.setdefault(plan.hop, {}).setdefault(plan.span, []).append(plan)
    for hop, by_span in by_hop.items():
        members = [plan for leaving in by_span.values() for plan in leaving]
        tiles = rows.groupBy(*keys, hop_start(hop, F.col(TS_MICROS) + F.lit((aligned or 1) - 1))
                             .alias(_AT)).agg(*(column for plan in members for column
                                                in plan.merged(plan.partial(STATE), part=STATE)))
        for span, leaving in by_span.items():
            gone = expires(F.col(_AT), span, hop)  # a tile's start: its events'
            union = union.unionByName(tiles.select(
                *keys, gone.alias(TS_MICROS), (gone - 1).alias(_AT), F.lit(_EXIT).alias(_KIND),
                *(_negated(plan, field).alias(plan.column(STATE, field))
                  for plan in leaving for field in plan.fields)), allowMissingColumns=True)
    return union


def _negated(plan: FramedPlan, field: str) -> Column:
    """A plan's partial's field as an exit row holds it: negated, a reference kept."""
    reference = plan.operation.reference_field()
    column = F.col(plan.column(STATE, field))
    return column if reference is not None and reference.name == field else -column


def _whole_hop_rows(tiles: DataFrame, queried: DataFrame, keys: Sequence[str], hop: int,
                    merges: Sequence[tuple[int, Callable[[WindowSpec], list[Column]]]]
                    ) -> DataFrame:
    """Per key and hop start ``h`` that ``queried`` names (its keys and ``_HOP<hop>``), the
    ``tiles`` (a row per key and ``_HOP<hop>``) of ``[h − span, h)`` merged — each of
    ``merges`` a span (µs) and the merge over a frame of it (the tile rows' kind ``_TILE``) —
    as a row of kind ``_WHOLE + hop`` ordered at ``h − 1``: before every event of its hop and
    at or before its anchors, so the frame of the events before an anchor in its hop carries
    it. These frames run over the tiles and the queried hops only: one over every row of the
    key would hold its events and anchors of a whole window, merged again each time it moves
    (per key, its active hops × its rows in a window)."""
    column = f"{_HOP}{hop}"
    union = (tiles.withColumn(_KIND, F.lit(_TILE))
             .unionByName(queried.withColumn(_KIND, F.lit(_ANCHOR)), allowMissingColumns=True))
    # A tile at its start, a hop's query just before it: its frame is [h − span, h).
    order = F.col(column) - F.when(F.col(_KIND) == _ANCHOR, 1).otherwise(0)
    merged = [c for span, merge in merges for c in merge(
        Window.partitionBy(*keys).orderBy(order).rangeBetween(-(span - 1), 0))]
    queries = union.select(*keys, column, _KIND, *merged).where(F.col(_KIND) == _ANCHOR)
    return queries.drop(_KIND).select(
        "*", F.col(column).alias(TS_MICROS), (F.col(column) - 1).alias(_AT),
        F.lit(_WHOLE + hop).alias(_KIND))


# The parts of an output's partial in the union: its state on the event rows, the merge of
# the events before the anchor, and of the whole hops before the anchor's own.
STATE, BEFORE, HOPS = "", "before_", "hops_"


class FramedPlan:
    """How one output of the frames plan gets its value at each anchor (a base: see
    :func:`plan_for`). Its partial's columns
    in the union are named ``_agg<index>_<part><field>`` (``part``: :data:`STATE`,
    :data:`BEFORE`, :data:`HOPS`)."""

    # Computed over frames ordered by time per key, before the exit rows leave the union.
    running: ClassVar[bool] = True

    def __init__(self, index: int, feature: AggregateFeature) -> None:
        self.index = index
        self.feature = feature
        self.operation = feature.operation()
        self.fields = _fields(self.operation)
        window = feature.window
        self.hop = (window.hop or 0) * MICROS
        self.span = (window.seconds or 0) * MICROS

    def column(self, part: str, field: str) -> str:
        return f"_agg{self.index}_{part}{field}"

    def partial(self, part: str, kind: int | None = None) -> Getter:
        """The partial's ``part``, null on the rows not of ``kind`` (where given)."""
        def read(field: str) -> Column:
            value = F.col(self.column(part, field))
            return value if kind is None else F.when(F.col(_KIND) == kind, value)

        return read

    def merged(self, partial: Getter, window: WindowSpec | None = None,
               part: str = BEFORE) -> list[Column]:
        """``partial`` merged in a group (no ``window``) or over a frame, as ``part``."""
        return _merged(self.operation, partial, window, prefix=self.column(part, ""))

    def state(self, numeric: Sequence[str], values: Mapping[str, Column],
              events: DataFrame) -> Columns:
        """An event row's partial: null where the event does not count."""
        keeps = _keeps(self.feature, numeric)
        return {self.column(STATE, field): F.when(keeps, column) for field, column
                in _state(self.feature, _read(self.feature, values), events).items()}

    def running_columns(self, keys: Sequence[str]) -> list[Column]:
        """Its :data:`BEFORE` part over the running frame (running plans)."""
        return []

    def anchor_columns(self, keys: Sequence[str]) -> list[Column]:
        """What the anchor rows carry to :meth:`value`."""
        return [F.col(self.column(BEFORE, field)) for field in self.fields]

    def value(self) -> Column:
        combined = self.operation.combine_columns(_nothing, self.partial(BEFORE))
        return self.operation.finish_column(combined.__getitem__).alias(
            self.feature.column_name)


class LifetimeFrame(FramedPlan):
    """The lifetime (``all``): every earlier row of the key."""

    def running_columns(self, keys: Sequence[str]) -> list[Column]:
        return self.merged(self.partial(STATE), _before(keys))


class Exits(LifetimeFrame):
    """A window whose partials subtract exactly (``Operation.exact_in_any_order``: a count,
    sums of whole numbers): the key's running partial less the rows that have left the
    window — an event leaves at its tile's start + hop + window (``time_rule.expires``), so
    each key gets one exit row per exit time holding its tile's partial negated. One running
    frame per key serves all of them and the lifetime outputs."""


class Direct(FramedPlan):
    """A window whose hops aligned anchors start: at an anchor ``t`` it is ``[t − window,
    t)``, a frame over the (folded) event rows; no tiles, no exits."""

    def running_columns(self, keys: Sequence[str]) -> list[Column]:
        return self.merged(self.partial(STATE, _EVENT), _recent(keys, self.span))


class TilesAndHead(FramedPlan):
    """Any other window: the whole hops ``[own − window, own)`` merged from the key's tiles
    (:func:`_whole_hop_rows`), combined with the events of the anchor's own hop before ``t``
    (a frame from the hop's start to just before ``t``)."""

    running = False

    def anchor_columns(self, keys: Sequence[str]) -> list[Column]:
        own_hop = _before(keys, f"{_HOP}{self.hop}")
        return (self.merged(self.partial(STATE, _EVENT), own_hop)
                + self.merged(self.partial(HOPS, _WHOLE + self.hop), own_hop, part=HOPS))

    def hops_merged(self, frame: WindowSpec) -> list[Column]:
        """The tile rows merged over ``frame``, as its :data:`HOPS` part."""
        return self.merged(self.partial(STATE, _TILE), frame, part=HOPS)

    def value(self) -> Column:
        combined = self.operation.combine_columns(self.partial(HOPS), self.partial(BEFORE))
        return self.operation.finish_column(combined.__getitem__).alias(
            self.feature.column_name)


def plan_for(index: int, feature: AggregateFeature, aligned: int | None,
             schema: StructType) -> FramedPlan:
    """The plan of output ``index`` of the frames plan: :class:`Direct` where aligned anchors
    start its hops, :class:`Exits` where its partials subtract exactly, the lifetime's frame,
    else :class:`TilesAndHead`."""
    window = feature.window
    if _starts_hops(feature, aligned):
        return Direct(index, feature)
    if window.seconds is None or window.hop is None:
        return LifetimeFrame(index, feature)
    column = feature.spec.column
    whole_numbers = column is not None and isinstance(
        schema[column].dataType, (IntegralType, BooleanType))
    if feature.operation().exact_in_any_order(whole_numbers):
        return Exits(index, feature)
    return TilesAndHead(index, feature)


def _starts_hops(feature: AggregateFeature, aligned: int | None) -> bool:
    """Whether anchors that are multiples of ``aligned`` (µs) start the feature's hops: its
    window at an anchor ``t`` is then ``[t − window, t)``, a frame over the rows, which may
    be folded per aligned span. ValueError where a folded span could straddle the window's
    start (``aligned`` neither a multiple of the hop dividing the window, nor dividing the
    hop)."""
    if not aligned or feature.window.hop is None:
        return False
    hop, span = feature.window.hop * MICROS, (feature.window.seconds or 0) * MICROS
    if aligned % hop == 0 and span % aligned == 0:
        return True
    if hop % aligned:
        raise ValueError(f"{feature.qualified}: anchors aligned to {aligned} µs fold events "
                         f"across its window's start")
    return False


def _nothing(name: str) -> Column:
    """No partial: the whole hops of a plan without them."""
    return F.lit(None)


# The frames end at the current row (the RAPIDS Accelerator runs no range frame whose upper
# bound lies behind it): an anchor at t is ordered at t − 1 µs, so "up to it" is "before t";
# the anchor itself holds no event.


def _before(keys: Sequence[str], *within: str) -> WindowSpec:
    """The key's events before an anchor's time (in the anchor's hop, with ``within``)."""
    return Window.partitionBy(*keys, *within).orderBy(_AT).rangeBetween(
        Window.unboundedPreceding, 0)


def _recent(keys: Sequence[str], span: int) -> WindowSpec:
    """The key's rows in ``[t − span, t)`` of an anchor at ``t`` (ordered at t − 1 µs)."""
    return Window.partitionBy(*keys).orderBy(_AT).rangeBetween(-(span - 1), 0)


def _per_value_at(kept: DataFrame, anchors: DataFrame, keys: list[str],
                  feature: AggregateFeature, value: Column) -> DataFrame:
    """The per-value plan (approx_distinct's): an operation whose partial is the greatest of
    one field per value of another (``Operation.per``: a register and its rank), finished
    from sums of each value's terms (``Operation.value_terms``). Without an anchor per value:
    a value's greatest in the window changes only just after one of its events (``ts + 1``)
    and where a hop of its events leaves the window (the hop's start + window + hop) — its
    greatest there comes from the same two frames as the other operations' (whole hops, the
    own hop before ``t``). Each change is a difference in the sums of terms; an anchor sums
    its key's differences up to its time. Rows: the events and those change times, not each
    anchor once per value its key has (ten times the time at 1M events,
    benchmarks/README.md)."""
    operation = feature.operation()
    assert operation.per is not None
    state = operation.state_columns(value, F.col(TS_MICROS))
    register = state.pop(operation.per.name)
    (rank,) = state.values()
    by_register = [*keys, _REGISTER]
    rows = kept.select(*keys, TS_MICROS, F.col(TS_MICROS).alias(_AT),
                       register.alias(_REGISTER), rank.alias(_RANK), F.lit(_EVENT).alias(_KIND))
    ranked = _ranks_at_changes(rows, by_register, feature.window)
    # What the value adds to the sums from each change on, less what it added before.
    added = {f"_agg_terms_{name}": column
             for name, column in operation.value_terms(F.col(_RANK)).items()}
    zero = F.lit(0).cast("long")
    in_order = Window.partitionBy(*by_register).orderBy(TS_MICROS)
    at_changes = ranked.where(F.col(_KIND) == _ANCHOR).select(
        *by_register, TS_MICROS, *(column.alias(name) for name, column in added.items()))
    differences = at_changes.select(
        *keys, TS_MICROS, F.lit(_EVENT).alias(_KIND),
        *((F.col(name) - F.lag(name, 1, 0).over(in_order)).alias(name) for name in added))
    union = differences.unionByName(anchors.select(
        *keys, TS_MICROS, F.lit(_ANCHOR).alias(_KIND), *(zero.alias(name) for name in added)))
    so_far = Window.partitionBy(*keys).orderBy(TS_MICROS).rangeBetween(
        Window.unboundedPreceding, 0)
    sums = union.select(*keys, TS_MICROS, _KIND,
                        *(F.sum(name).over(so_far).alias(name) for name in added))
    return sums.where(F.col(_KIND) == _ANCHOR).select(
        *keys, TS_MICROS, operation.finish_terms(lambda name: F.col(f"_agg_terms_{name}"))
        .alias(feature.column_name))


def _ranks_at_changes(rows: DataFrame, by_register: list[str], window: TimeWindow
                      ) -> DataFrame:
    """Each register's greatest rank in the ``window`` where it can change (just after one
    of its events, where a hop of them leaves the window), as anchor rows beside the event
    ``rows``: the lifetime's over every earlier row, a window's of its whole hops before the
    change's hop and of that hop's events before it (a change row holds none)."""
    def change_rows(changes: DataFrame) -> DataFrame:
        return changes.distinct().select(
            *by_register[:-1], TS_MICROS, (F.col(TS_MICROS) - 1).alias(_AT), _REGISTER,
            F.lit(None).cast("int").alias(_RANK), F.lit(_ANCHOR).alias(_KIND))

    after_events = rows.select(*by_register, (F.col(TS_MICROS) + 1).alias(TS_MICROS))
    if window.hop is None:
        return rows.unionByName(change_rows(after_events)).select(
            *by_register, TS_MICROS, _KIND, F.max(_RANK).over(_before(by_register)).alias(_RANK))
    hop, span = window.hop * MICROS, (window.seconds or 0) * MICROS
    hop_column = f"{_HOP}{hop}"
    rows = rows.withColumn(hop_column, hop_start(hop))
    tiles = rows.groupBy(*by_register, hop_column).agg(F.max(_RANK).alias(_RANK))
    leaving = tiles.select(*by_register, expires(F.col(hop_column), span, hop).alias(TS_MICROS))
    changes = change_rows(after_events.unionByName(leaving)).withColumn(hop_column,
                                                                       hop_start(hop))
    whole = _whole_hop_rows(
        tiles, changes.select(*by_register, hop_column).distinct(), by_register, hop,
        [(span, lambda frame: [F.max(F.when(F.col(_KIND) == _TILE, F.col(_RANK)))
                               .over(frame).alias(_RANK)])])
    return rows.unionByName(whole).unionByName(changes).select(
        *by_register, TS_MICROS, _KIND,
        F.max(_RANK).over(_before(by_register, hop_column)).alias(_RANK))


def _paired(kept: DataFrame, keys: list[str], value: Column) -> tuple[DataFrame, WindowSpec]:
    """Each event's keys, time and (ts, value) pair, and the key's events in (ts, value)
    order — by plain columns (the RAPIDS Accelerator orders no window by a struct): a value
    read as a struct (the raw value and its id) by its fields."""
    paired = kept.select(*keys, TS_MICROS, pair_column(value, F.col(TS_MICROS)).alias(_PAIRS))
    pair_type = paired.schema[_PAIRS].dataType
    assert isinstance(pair_type, StructType)
    read = pair_type[PAIR_VALUE].dataType
    fields = ([F.col(f"{_PAIRS}.{PAIR_VALUE}.{name}") for name in read.fieldNames()]
              if isinstance(read, StructType) else [F.col(f"{_PAIRS}.{PAIR_VALUE}")])
    return paired, Window.partitionBy(*keys).orderBy(TS_MICROS, *fields)


# The oldest-pair plan's window starts: a row per key and start, ``_START`` (µs) holding it.
_START = "_agg_start"
# Before every event time: the lifetime's start.
_NO_START = -(1 << 63)


def _oldest_at(kept: DataFrame, anchors: DataFrame, keys: list[str],
               feature: AggregateFeature, value: Column) -> DataFrame:
    """The oldest-pair plan (first's): the oldest (ts, value) pair of an anchor's window
    ``[start, t)``. Each distinct window start of a key is a row among its events; in
    descending (ts, value) order, with the events at its time before it, the last event so
    far is the oldest at or after it. An anchor takes its start's pair where that is before
    ``t``. Rows: the events and the distinct starts (one per key and hop), no frame."""
    paired, ordered = _paired(kept, keys, value)
    start = feature.window.start(F.col(TS_MICROS))
    starts = anchors.select(*keys, (F.lit(_NO_START) if start is None else start)
                            .cast("long").alias(_START)).distinct()
    rows = paired.select(*keys, F.col(TS_MICROS).alias(_AT), F.lit(_EVENT).alias(_KIND),
                         _PAIRS, F.row_number().over(ordered).alias(_SEQ)).unionByName(
        starts.select(*keys, F.col(_START).alias(_AT), F.lit(_ANCHOR).alias(_KIND)),
        allowMissingColumns=True)
    newest_first = Window.partitionBy(*keys).orderBy(
        F.col(_AT).desc(), F.col(_KIND).asc(), F.col(_SEQ).desc()).rowsBetween(
        Window.unboundedPreceding, 0)
    oldest = rows.select(*keys, F.col(_AT).alias(_START), _KIND,
                         F.last(_PAIRS, ignorenulls=True).over(newest_first).alias(_PAIRS))
    oldest = oldest.where(F.col(_KIND) == _ANCHOR).drop(_KIND)
    at = anchors.select(*keys, TS_MICROS, (F.lit(_NO_START) if start is None else start)
                        .cast("long").alias(_START))
    pair = F.col(_PAIRS)
    return at.join(oldest, on=[*keys, _START], how="left").select(
        *keys, TS_MICROS, F.when(pair[PAIR_TS] < F.col(TS_MICROS), pair[PAIR_VALUE])
        .alias(feature.column_name))


def _newest_at(kept: DataFrame, anchors: DataFrame, keys: list[str],
               feature: AggregateFeature, value: Column) -> DataFrame:
    """The newest-pairs plan (last's and last_k's): the ``k`` newest (ts, value) pairs
    before an anchor in its window (``k``: the value's list length, 1 for one value), in
    memory bounded by ``k``, not by the frame: each
    event carries its key's ``k`` latest (ts, value) pairs up to itself, newest first (its
    own pair and a lag per earlier one in (ts, value) order; last: its own pair), an anchor
    takes those of the latest event before it (the last non-null over its key's rows so
    far), and a window keeps the ones from its start. The ``k`` latest of ``[start, t)``
    are those of the ``k`` latest before ``t`` at or after ``start``: any later event is in
    the window too."""
    length = feature.operation().list_length()
    k, many = length or 1, length is not None
    paired, ordered = _paired(kept, keys, value)
    if many and k <= LAGGED_UP_TO_K:
        # Newest first: the event's pair, then the k − 1 before it (one lag each; none
        # before the key's first event).
        pairs = F.filter(F.array(F.col(_PAIRS), *(F.lag(_PAIRS, offset).over(ordered)
                                                   for offset in range(1, k))),
                         lambda pair: pair.isNotNull())
    elif many:
        pairs = F.reverse(F.collect_list(_PAIRS).over(ordered.rowsBetween(-(k - 1), 0)))
    else:
        pairs = F.col(_PAIRS)
    rows = paired.select(
        *keys, TS_MICROS, F.col(TS_MICROS).alias(_AT), F.lit(_EVENT).alias(_KIND),
        pairs.alias(_PAIRS), F.row_number().over(ordered).alias(_SEQ))
    union = rows.unionByName(anchors.select(
        *keys, TS_MICROS, (F.col(TS_MICROS) - 1).alias(_AT), F.lit(_ANCHOR).alias(_KIND)),
        allowMissingColumns=True)
    # Events at an anchor's _AT are before it; among them, the last in (ts, value) order.
    so_far = Window.partitionBy(*keys).orderBy(_AT, _KIND, _SEQ).rowsBetween(
        Window.unboundedPreceding, 0)
    latest = F.last(_PAIRS, ignorenulls=True).over(so_far)
    window = feature.window
    start = window.start(F.col(TS_MICROS))
    if many:
        if start is not None:
            latest = F.filter(latest, lambda pair: pair[PAIR_TS] >= start)
        newest_first = F.coalesce(latest, F.array())
        values = F.transform(newest_first, lambda pair: pair[PAIR_VALUE])
    else:
        values = latest[PAIR_VALUE] if start is None else F.when(
            latest[PAIR_TS] >= start, latest[PAIR_VALUE])
    return union.select(*keys, TS_MICROS, _KIND, values.alias(feature.column_name)).where(
        F.col(_KIND) == _ANCHOR).drop(_KIND)


# --- tiles: the online executors' starting point ---------------------------------------------

# A tile's start (µs): its hop's start; 0 for the lifetime's one tile.
TILE = "tile"


def events_cut(events: DataFrame) -> int:
    """The cut of ``events`` (with ``TS_MICROS``): 1 µs after the latest; 1 without events."""
    latest = events.agg(F.max(TS_MICROS)).first()
    return (latest[0] if latest and latest[0] is not None else 0) + 1


def output_tiles(events: DataFrame, group: GroupSpec, numeric: Sequence[str],
                 cut: int, prior: Lifetime | None = None, days: DataFrame | None = None,
                 outputs: Sequence[AggregateFeature] | None = None
                 ) -> list[tuple[AggregateFeature, DataFrame]]:
    """Per output of ``group``, its tiles as of ``cut`` (µs, after every event): a row per key
    and hop — the group's keys, ``tile`` and the operation's partial columns (the names
    ``core.aggregations`` reads with ``Operation.from_fields``) — for the hops a window can
    still cover at or after ``cut`` (from ``window.start(cut)``); the lifetime's one tile
    (start 0) per key. Merged at a request time ``t ≥ cut`` they give the value at ``t``
    (``core.aggregations.value_from_tiles``): what the online store starts from. ``prior``:
    the lifetime partials of the events before ``events``' (``prior.before``, before every
    window's start at ``cut``). ``days``: every day's :func:`day_partials`, which the outputs
    on days read instead of the events (a day's partial: its events'). ``outputs``: those of
    the group's only."""
    keys = list(group.keys)
    tiles = []
    for feature in group.outputs() if outputs is None else outputs:
        window = feature.window
        start = window.start(cut)
        if days is not None and on_days(feature):
            tiles.append((feature, _tiles_of_days(days, keys, feature, start)))
            continue
        kept = events.where(_keeps(feature, numeric))
        if prior is not None and start is not None and start < prior.before:
            raise ValueError(f"{feature.qualified}: its window at {cut} µs starts before "
                             f"the prior's events end ({prior.before} µs)")
        if start is not None and window.hop is not None:
            kept = kept.where(F.col(TS_MICROS) >= start).withColumn(
                TILE, hop_start(window.hop * MICROS))
        else:
            kept = kept.withColumn(TILE, F.lit(0).cast("long"))
        operation = feature.operation()
        state = kept.select(*keys, TILE, TS_MICROS, *(
            column.alias(name) for name, column
            in _state(feature, _read(feature, {}), kept).items()))
        if prior is not None and start is None:
            state = state.unionByName(prior.frame.select(
                *keys, F.lit(0).cast("long").alias(TILE),
                *(F.col(_partial_column(feature, name)).alias(name)
                  for name in _fields(operation))), allowMissingColumns=True)
        per = [] if operation.per is None else [operation.per.name]
        state = _rebased(state, [*keys, TILE], [(operation, str)])
        frame = state.groupBy(*keys, TILE, *per).agg(*_merged(operation, F.col))
        if per:  # a partial per value of a field (approx_distinct's registers): listed
            frame = frame.groupBy(*keys, TILE).agg(*(
                F.collect_list(name).alias(name) for name in _fields(operation)))
        tiles.append((feature, frame))
    return tiles


def _tiles_of_days(days: DataFrame, keys: list[str], feature: AggregateFeature,
                   start: int | None) -> DataFrame:
    """An output on days' tiles (:func:`output_tiles`) from every day's partials: those of
    the days from ``start`` on merged per key and hop (the lifetime's: per key); a key
    whose days hold no event it counts has none."""
    operation = feature.operation()
    fields = _fields(operation)
    hop = feature.window.hop
    tile = (F.lit(0).cast("long") if start is None or hop is None
            else hop_start(hop * MICROS))
    rows = days if start is None else days.where(F.col(TS_MICROS) >= start)
    counted = F.lit(False)
    for field in fields:
        counted = counted | F.col(_partial_column(feature, field)).isNotNull()
    state = rows.where(counted).select(*keys, tile.alias(TILE), *(
        F.col(_partial_column(feature, field)).alias(field) for field in fields))
    state = _rebased(state, [*keys, TILE], [(operation, str)])
    return state.groupBy(*keys, TILE).agg(*_merged(operation, F.col))


# --- lifetime partials: where a day's run starts its lifetime values from --------------------

@dataclass(frozen=True)
class Lifetime:
    """A group's lifetime outputs' partials of its events before ``before`` (µs): a row per
    key, its keys and ``<output's column>__<partial>`` columns."""

    frame: DataFrame
    before: int


def lifetime(events: DataFrame, group: GroupSpec, numeric: Sequence[str], before: int,
             prior: Lifetime | None = None) -> Lifetime:
    """The lifetime partials of ``events`` before ``before``, and of ``prior``'s where given
    (``events`` then read from ``prior.before`` on). ValueError for a group with an
    operation the frames plan does not compute (last, last_k, approx_distinct): their
    partials stay in Spark's frames only."""
    keys = list(group.keys)
    features = [f for f in group.outputs() if f.window.seconds is None]
    others = sorted({f.spec.op for f in group.outputs() if f.operation().plan != "frames"})
    if others:
        raise ValueError(f"{group.name}: lifetime partials of the operations the frames "
                         f"plan computes only (not {', '.join(others)})")
    rows = events if prior is None else events.where(F.col(TS_MICROS) >= prior.before)
    # The events after ``before`` count for nothing (rather than filtered out: a log that
    # starts after ``before`` would leave the aggregate an empty input, which adaptive
    # execution replaces by a relation the RAPIDS Accelerator does not run); the keys
    # without an earlier one are left out.
    earlier = F.col(TS_MICROS) < before
    state = [F.when(earlier & _keeps(f, numeric), column).alias(_partial_column(f, name))
             for f in features
             for name, column in _state(f, _read(f, {}), rows).items()]
    rows = rows.select(*keys, earlier.cast("int").alias(_EARLIER), *state)
    if prior is not None:
        rows = rows.unionByName(prior.frame.withColumn(_EARLIER, F.lit(1)))
    rows = _rebased(rows, keys, [(f.operation(), functools.partial(_partial_column, f))
                                 for f in features])
    merged = [column for f in features for column in _merged(
        f.operation(), _named(f"{f.column_name}__"), prefix=f"{f.column_name}__")]
    frame = rows.groupBy(*keys).agg(*merged, F.max(_EARLIER).alias(_EARLIER))
    return Lifetime(frame.where(F.col(_EARLIER) == 1).drop(_EARLIER), before)


# --- day partials: where a day's run starts its values on days from ----------------------

def on_days(feature: AggregateFeature) -> bool:
    """Whether the feature's window starts at a midnight at every time (the lifetime, or a
    hop of whole days) and the frames plan computes it: its values after a day read that
    day's partial (:func:`day_partials`) as they read its events."""
    hop = feature.window.hop
    return feature.operation().plan == "frames" and (hop is None or hop * MICROS % DAY == 0)


def day_partials(events: DataFrame, group: GroupSpec, numeric: Sequence[str],
                 values: Mapping[str, Column] | None = None) -> DataFrame | None:
    """Per key and UTC day with events, the partials of the group's outputs on days
    (:func:`on_days`) of the events that day: its keys, ``TS_MICROS`` (the day's start) and
    ``<output's column>__<partial>`` columns. None: the group has no such output."""
    keys = list(group.keys)
    features = [f for f in group.outputs() if on_days(f)]
    if not features:
        return None
    state = [F.when(_keeps(f, numeric), column).alias(_partial_column(f, name))
             for f in features
             for name, column in _state(f, _read(f, values or {}), events).items()]
    rows = events.select(*keys, floor_to(F.col(TS_MICROS), DAY).alias(TS_MICROS), *state)
    rows = _rebased(rows, [*keys, TS_MICROS], [(f.operation(), functools.partial(
        _partial_column, f)) for f in features])
    return rows.groupBy(*keys, TS_MICROS).agg(*(
        column for f in features for column in _merged(
            f.operation(), _named(f"{f.column_name}__"), prefix=f"{f.column_name}__")))


def _partial_column(feature: AggregateFeature, field: str) -> str:
    """The column of an output's partial's ``field`` in the stored partials."""
    return f"{feature.column_name}__{field}"


def _fields(operation: Operation) -> list[str]:
    """The names of an operation's partial's fields."""
    return [field.name for field in operation.fields]


def _named(prefix: str) -> Getter:
    """A partial read from the columns ``<prefix><name>``."""
    return lambda name: F.col(prefix + name)


# --- daily snapshots: what Feast's offline store reads --------------------------------------



def snapshot_anchors(events: DataFrame, group: GroupSpec, cut: int,
                     after: int | None = None) -> DataFrame:
    """The group's keys and the day starts (``TS_MICROS``) its values are snapshotted at,
    as the entity tables are: the day after each day a key had events, then each following
    day while an event of it can still leave a window (the longest window and its hop),
    up to the day after the log's last event (``cut``: µs, just after it). ``after`` (µs):
    only the days after it, from the events of the days that reach them."""
    keys = list(group.keys)
    if after is not None:
        events = events.where(F.col(TS_MICROS) >= after - (decay_days(group) + 1) * DAY)
    active = events.select(*keys, (next_midnight(F.col(TS_MICROS)) / DAY).cast("long")
                           .alias("_agg_after")).distinct()
    end = last_snapshot(cut) // DAY
    days = F.sequence(F.col("_agg_after"), F.least(F.col("_agg_after") + decay_days(group),
                                                  F.lit(end).cast("long")))
    anchors = active.select(*keys, F.explode(days).alias("_agg_day")).distinct().select(
        *keys, (F.col("_agg_day") * DAY).alias(TS_MICROS))
    return anchors if after is None else anchors.where(F.col(TS_MICROS) > after)


def reach(outputs: Sequence[AggregateFeature], since: int) -> int | None:
    """The first event time (µs) the ``outputs``' values at or after ``since`` read: where
    the longest window starts at ``since``; None where an output reads the whole lifetime."""
    starts = [feature.window.start(since) for feature in outputs]
    return None if any(start is None for start in starts) else min(
        start for start in starts if start is not None)


def last_snapshot(cut: int) -> int:
    """The last snapshot day (µs, a midnight): the day after the last event (``cut``: µs,
    just after it)."""
    return next_midnight(cut - 1)


def decay_days(group: GroupSpec) -> int:
    """The days after a key's last event that its snapshots still change on: an event can
    leave a window (with its hop) until then."""
    spans = [f.window.seconds + f.window.hop for f in group.outputs()
             if f.window.seconds is not None and f.window.hop is not None]
    return -(-max(spans, default=0) * MICROS // DAY)


def group_snapshots(values: DataFrame, snapshots: DataFrame, group: GroupSpec,
                    outputs: Sequence[AggregateFeature] | None = None) -> DataFrame:
    """The group's outputs at its snapshot days as Feast reads them, from ``values``
    (:func:`group_values`' rows at anchors that hold the ``snapshots`` ones,
    :func:`snapshot_anchors`): the keys, ``event_timestamp`` (the day's start: the values of
    the events before it) and each output by its name in the group, raw values as the API
    serves them (a value read as its raw value and its id, the raw one)."""
    keys = [*group.keys, TS_MICROS]
    return snapshot_rows(values.join(snapshots.select(*keys), on=keys, how="left_semi"), group,
                         outputs)


def snapshot_rows(values: DataFrame, group: GroupSpec,
                  outputs: Sequence[AggregateFeature] | None = None) -> DataFrame:
    """:func:`group_values`' rows as Feast reads them: the keys, ``event_timestamp`` and each
    output (``outputs``: those only) by its name in the group."""
    return values.select(
        *group.keys, F.timestamp_micros(TS_MICROS).alias(EVENT_TIMESTAMP),
        *(_raw(F.col(f.column_name), values.schema[f.column_name].dataType).alias(f.output)
          for f in (group.outputs() if outputs is None else outputs)))


def _raw(value: Column, read: DataType) -> Column:
    """A value as the API serves it: of a (raw, id) pair, the raw value; of a list, each."""
    if isinstance(read, ArrayType) and isinstance(read.elementType, StructType):
        return F.transform(value, lambda pair: pair["raw"])
    return value["raw"] if isinstance(read, StructType) else value
