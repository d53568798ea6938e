"""lag_features: recency and activity per user and per user–item, strictly before each event.

For scope ``user`` (and ``ui``, the user–item pair): seconds since the previous event (missing
for the first: the model-ready step adds an indicator), the number of events in each window
``w`` — the aggregations' ``count`` over ``w`` by their rule of time (events in ``[start,
t)``, ``start`` = ``t − w`` rounded down to the window's hop; docs/ARCHITECTURE.md), so that
a group ``{keys: [user_id], features: [{op: count, windows: [w]}]}`` serves online the value
an example was trained on (the tests check both against the rule's reference and each
other) — and for users the previous item's id and their label history: the positives among
their earlier events and the share of them (missing for the first event) — what a user's
earlier events said about them, known at ``t``, for users the training split never saw as
much as for the others. Events at the very same instant are not "before" one another; of
earlier events at one instant, the previous item is the greatest item id as text, as the
engine's ``last`` orders them. At a request time the same values come from the engine's
tiles (:meth:`LagFeatures.served`: the input groups of ``core.model_inputs``). The
counts are frames over each event's hop, not the engine's backfill: that one joins its
values to distinct (key, time) anchors, 4.5× this stage's time at 1M events
(benchmarks/README.md). Two formulations give the same values: one for the CPU, one for the
RAPIDS Accelerator (``plans_for_gpu``); the tests check they agree.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator
from pyspark.sql import Column, DataFrame, Window, WindowSpec
from pyspark.sql import functions as F

from featureline.core.aggregations import FeatureSpec as AggregateSpec
from featureline.core.aggregations import GroupSpec, parse_window
from featureline.core.aggregations import Window as AggregateWindow
from featureline.core.metadata import PADDING_ID, encoded_name
from featureline.core.model_inputs import PAIR_INPUTS, USER_INPUTS, Served, Source
from featureline.core.settings import duration_seconds
from featureline.core.transforms import LOG1P_STANDARDIZE, STANDARDIZE
from featureline.etl.features.base import (
    EARLIER_EVENTS,
    EARLIER_POSITIVES,
    EVENTS,
    LABEL,
    MICROS,
    TS_MICROS,
    ColumnRoles,
    FeatureOp,
    FeatureSpec,
    Lookback,
    OpSettings,
    hop_start,
    plans_for_gpu,
)

SCOPES = {"user": ("user_id",), "ui": ("user_id", "item_id")}
# The input group serving each scope's values at a request time.
SERVING_GROUPS = {"user": USER_INPUTS, "ui": PAIR_INPUTS}
# The previous row's time and item, in (time, item) order; dropped once read.
_PREVIOUS_TS = "_previous_ts_us"
_PREVIOUS_ITEM = "_previous_item"


# A user's label history before each event (named apart from the entity tables' features).
PRIOR_POSITIVES = "user_prior_positives"
PRIOR_POSITIVE_RATE = "user_prior_positive_rate"


def _count(frame: DataFrame, window: WindowSpec) -> Column:
    """The events of a frame: its rows, or where an incremental run folded some, the events
    each stands for (``EVENTS``)."""
    if EVENTS in frame.columns:
        return F.coalesce(F.sum(EVENTS).over(window), F.lit(0).cast("long"))
    return F.count(F.lit(1)).over(window)


def _label_history(frame: DataFrame, positives: Column, events: Column) -> dict[str, Column]:
    """The positives among a user's earlier ``events`` and their share (null without any);
    counted over ``frame``'s rows, plus the user's events before them where an incremental
    run says how many (``EARLIER_EVENTS``, ``EARLIER_POSITIVES``)."""
    if EARLIER_EVENTS in frame.columns:
        positives = F.coalesce(positives, F.lit(0)) + F.col(EARLIER_POSITIVES)
        events = events + F.col(EARLIER_EVENTS)
    return {PRIOR_POSITIVES: F.coalesce(positives, F.lit(0)).cast("double"),
            PRIOR_POSITIVE_RATE: F.when(events > 0, F.coalesce(positives, F.lit(0)) / events)
            .cast("double")}


class LagFeaturesSettings(OpSettings):
    """Per user and user-item, strictly before the event: recency, activity in windows,
    the previous item and the user's label history."""

    op: Literal["lag_features"]
    # The activity windows: user_events_<w>, ui_events_<w> (each with the aggregations'
    # default hop: a window spans at least six of them).
    windows: list[str] = Field(default_factory=lambda: ["1h", "24h", "7d"], min_length=1)
    needs_encoded = ("item_id",)

    @field_validator("windows")
    @classmethod
    def _durations(cls, windows: list[str]) -> list[str]:
        for window in windows:
            if window == "all":
                raise ValueError("all: the lifetime count is not an activity window")
            duration_seconds(window)
            try:
                parse_window(window)
            except ValueError as error:  # its hop is the default one: no hop to set here
                raise ValueError(f"window {window} spans fewer than six of its hops (5 min "
                                 f"up to a day, 1 h up to 14 days, 1 d beyond) or is not a "
                                 f"multiple of one; e.g. 30m") from error
        return windows

    def build(self, roles: ColumnRoles) -> LagFeatures:
        return LagFeatures(self.windows)


def _hops(window: AggregateWindow) -> tuple[Column, int]:
    """The start of the hop an event's time falls in, and the window's length (both µs)."""
    assert window.seconds is not None and window.hop is not None  # never the lifetime
    return hop_start(window.hop * MICROS), window.seconds * MICROS


class LagFeatures(FeatureOp):
    name = "lag_features"

    def __init__(self, windows: list[str]) -> None:
        super().__init__()
        self.windows = windows
        self.item_column = encoded_name("item_id")

    def transform(self, events: DataFrame) -> DataFrame:
        frames = (self._frames_to_current_row if plans_for_gpu(events.sparkSession)
                  else self._frames_before_current_row)
        for scope, keys in SCOPES.items():
            events = frames(events, scope, keys)
        return events

    def activity_group(self, scope: str) -> GroupSpec:
        """The scope's activity windows as the aggregations' group they equal (outputs
        ``<scope>_events_<w>``): a group with these features serves online what an example
        holds."""
        return GroupSpec(name=scope, keys=list(SCOPES[scope]), features=[
            AggregateSpec(op="count", name=f"{scope}_events", windows=self.windows)])

    def _frames_before_current_row(self, events: DataFrame, scope: str,
                                   keys: tuple[str, ...]) -> DataFrame:
        """On the CPU: frames from the partition's start to just before the event, which
        grow incrementally (a sliding frame re-aggregates its whole width for every row:
        ten times the time at 1M events, benchmarks/README.md)."""
        by_time = Window.partitionBy(*keys).orderBy(TS_MICROS)
        before = by_time.rangeBetween(Window.unboundedPreceding, -1)
        previous_ts = F.max(TS_MICROS).over(before)
        columns = {f"{scope}_secs_since_prev": (F.col(TS_MICROS) - previous_ts) / MICROS}
        # Events in [start, t) = events before t less those of the hops before start's
        # (start = t's hop's start less the window: a bound over the hops' starts).
        earlier = _count(events, before)
        for output in self.activity_group(scope).outputs():
            hop, span = _hops(output.window)
            older = _count(events, Window.partitionBy(*keys).orderBy(hop).rangeBetween(
                Window.unboundedPreceding, -span - 1))
            columns[output.output] = (earlier - older).cast("double")
        if scope == "user":
            # The latest earlier event; on a tie in time, the greater item (as text).
            latest = F.max(F.struct(TS_MICROS, "item_id", self.item_column)).over(before)
            columns["user_prev_item"] = F.coalesce(latest[self.item_column],
                                                   F.lit(PADDING_ID).cast("long"))
            columns.update(_label_history(events, F.sum(LABEL).over(before), earlier))
        return events.withColumns(columns)

    def _frames_to_current_row(self, events: DataFrame, scope: str,
                               keys: tuple[str, ...]) -> DataFrame:
        """Under the RAPIDS Accelerator: the same values from frames it plans on the GPU. It
        runs no range frame whose upper bound lies behind the current row, and no max over a
        struct (docs/ARCHITECTURE.md, "GPU")."""
        by_time = Window.partitionBy(*keys).orderBy(TS_MICROS)
        in_order = Window.partitionBy(*keys).orderBy(TS_MICROS, "item_id")
        # The row before the first one of an instant is the previous instant's last: its
        # time, and its greatest item (as text) on a tie in time.
        events = events.withColumns({_PREVIOUS_TS: F.lag(TS_MICROS).over(in_order),
                                     _PREVIOUS_ITEM: F.lag(self.item_column).over(in_order)})
        opens_instant = F.col(_PREVIOUS_TS).isNull() | (F.col(_PREVIOUS_TS) != F.col(TS_MICROS))
        instant = Window.partitionBy(*keys, TS_MICROS)
        previous_ts = F.max(F.when(opens_instant, F.col(_PREVIOUS_TS))).over(instant)
        columns = {f"{scope}_secs_since_prev": (F.col(TS_MICROS) - previous_ts) / MICROS}
        at_instant = _count(events, by_time.rangeBetween(0, 0))
        for output in self.activity_group(scope).outputs():
            # Events in [start, t): those of the hops from start's to t's, less those of t's
            # hop, plus those of t's hop before t.
            hop, span = _hops(output.window)
            through_own = _count(events, Window.partitionBy(*keys).orderBy(hop).rangeBetween(
                -span, 0))
            own_hop = Window.partitionBy(*keys, hop)
            own_before = _count(events, own_hop.orderBy(TS_MICROS).rangeBetween(
                Window.unboundedPreceding, 0)) - at_instant
            columns[output.output] = (through_own - _count(events, own_hop)
                                      + own_before).cast("double")
        if scope == "user":
            previous_item = F.max(F.when(opens_instant, F.col(_PREVIOUS_ITEM))).over(instant)
            columns["user_prev_item"] = F.coalesce(previous_item, F.lit(PADDING_ID).cast("long"))
            # Up to and including t, less what happened at t.
            so_far = by_time.rangeBetween(Window.unboundedPreceding, 0)
            now = by_time.rangeBetween(0, 0)
            columns.update(_label_history(
                events, F.sum(LABEL).over(so_far) - F.sum(LABEL).over(now),
                _count(events, so_far) - at_instant))
        return events.withColumns(columns).drop(_PREVIOUS_TS, _PREVIOUS_ITEM)

    def served(self) -> Served:
        """Per scope, its windows' counts and its latest event's time (the seconds since
        it); the user's last item and label history (the positives and their mean)."""
        features, groups = {}, {}
        for scope in SCOPES:
            group = SERVING_GROUPS[scope]
            latest = f"{scope}_latest"
            groups[group] = [*self.activity_group(scope).features,
                             AggregateSpec(op="latest", name=latest)]
            features[f"{scope}_secs_since_prev"] = Source(kind="since", group=group,
                                                          output=latest)
            features.update({output.output: Source(kind="value", group=group,
                                                   output=output.output)
                             for output in self.activity_group(scope).outputs()})
        groups[USER_INPUTS] += [
            AggregateSpec(op="last", column="item_id", name="user_prev_item"),
            AggregateSpec(op="count", filter=LABEL, name=PRIOR_POSITIVES),
            AggregateSpec(op="mean", column=LABEL, name=PRIOR_POSITIVE_RATE)]
        features["user_prev_item"] = Source(kind="ids", group=USER_INPUTS,
                                            output="user_prev_item", column="item_id")
        for name in (PRIOR_POSITIVES, PRIOR_POSITIVE_RATE):
            features[name] = Source(kind="value", group=USER_INPUTS, output=name)
        return Served(features, groups)

    def lookback(self) -> Lookback:
        """The windows' reach (a window and its hop: the start is rounded down to a hop),
        of which the items and labels are read, and beyond the latest earlier event (the
        seconds since it, its item) only as counts in the windows; the label history before
        the rows given comes with every row an incremental run gives (``_label_history``)."""
        windows = [parse_window(window) for window in self.windows]
        widest = max((w.seconds or 0) + (w.hop or 0) for w in windows)
        counted = tuple((w.seconds * MICROS, w.hop * MICROS) for w in windows
                        if w.seconds is not None and w.hop is not None)
        return Lookback(span_us=widest * MICROS, columns=frozenset({"item_id", LABEL}),
                        windows=counted if len(counted) == len(windows) else ())

    def features(self) -> list[FeatureSpec]:
        specs = []
        for scope in SCOPES:
            specs.append(FeatureSpec(f"{scope}_secs_since_prev", "continuous", "float32",
                                     transform_hint=LOG1P_STANDARDIZE, missing=True))
            specs += [FeatureSpec(output.output, "continuous", "float32",
                                  transform_hint=LOG1P_STANDARDIZE)
                      for output in self.activity_group(scope).outputs()]
        specs.append(FeatureSpec("user_prev_item", "categorical", "int64",
                                 shares=self.item_column))
        specs += [FeatureSpec(PRIOR_POSITIVES, "continuous", "float32",
                              transform_hint=LOG1P_STANDARDIZE),
                  FeatureSpec(PRIOR_POSITIVE_RATE, "continuous", "float32",
                              transform_hint=STANDARDIZE, missing=True)]
        return specs
