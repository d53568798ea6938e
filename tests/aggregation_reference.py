"""The rule of time written from its definition alone, for the tests: the value of an
aggregation at ``t`` from the raw events, with no tiles, hops of tiles or merges — the
brute-force reference the engine, the Spark backfill and the online path are checked against."""

from __future__ import annotations

import math
from datetime import datetime, timezone

import pytest
from hypothesis import strategies as st

from featureline.core.aggregations import GroupSpec
from featureline.core.events import EventContract, LabelSpec, matcher

MICROS = 1_000_000
# A Monday 00:00 UTC: day, hour and 5-minute boundaries all fall on it.
ORIGIN = int(datetime(2026, 1, 5, tzinfo=timezone.utc).timestamp()) * MICROS
CONTRACT = EventContract(
    event_types=["view", "click", "purchase"], ts_min=datetime(2000, 1, 1, tzinfo=timezone.utc),
    ts_max=datetime(2100, 1, 1, tzinfo=timezone.utc), continuous=["price"],
    categorical=["category"], label=LabelSpec(column="event_type", op="in",
                                              value=["click", "purchase"]))

# Every operation, with and without filters and windows, hops defaulted and overridden.
SPEC = GroupSpec.model_validate({"name": "user_activity", "keys": ["user_id"], "features": [
    {"op": "count", "windows": ["30m", "1h", "1d", "7d"]},
    {"op": "count", "name": "purchases", "filter": "event_type in (purchase)",
     "windows": ["1d", "30d"]},
    {"op": "count", "name": "positives", "filter": "label", "windows": ["all"]},
    {"op": "sum", "column": "value", "windows": ["1h", "7d", "all"]},
    {"op": "mean", "column": "price", "windows": ["30d"]},
    {"op": "mean", "column": "label", "name": "positive_rate"},
    # Whole numbers summed in windows (the backfill's running sums less exits).
    {"op": "sum", "column": "label", "name": "positives_sum", "windows": ["1h", "7d"]},
    {"op": "mean", "column": "label", "name": "recent_positive_rate", "windows": ["1d"]},
    {"op": "min", "column": "price", "windows": ["1d"]},
    {"op": "max", "column": "value", "windows": ["10m"], "hop": "1m"},
    {"op": "last", "column": "category", "windows": ["1h"]},
    {"op": "latest", "windows": ["1d", "all"]},
    {"op": "last_k", "column": "item_id", "k": 3},
    {"op": "last_k", "column": "item_id", "k": 2, "windows": ["1d"]},
    {"op": "approx_distinct", "column": "category", "windows": ["7d"]},
    {"op": "approx_distinct", "column": "item_id"},
    {"op": "variance", "column": "value", "windows": ["1d", "all"]},
    # Of whole numbers: the running sums less exits, as the windowed counts.
    {"op": "variance", "column": "label", "name": "label_variance", "windows": ["1h"]},
    # The earliest value: a window's start moves past it; equal times take the smaller.
    {"op": "first", "column": "category", "windows": ["1h", "all"]},
    {"op": "first", "column": "value", "windows": ["7d"], "hop": "1d"},
    # Percentiles over declared edges: inside a bucket, and in either outer one.
    {"op": "approx_percentile", "column": "value", "name": "value_median",
     "edges": [-1, 0.75, 1.5], "q": 0.5, "windows": ["1d"]},
    {"op": "approx_percentile", "column": "price", "edges": [0, 5, 50, 200], "q": 0.9,
     "windows": ["7d", "all"]},
]})
OUTPUTS = SPEC.outputs()
LABEL = matcher(CONTRACT.label, CONTRACT)

# Offsets from ORIGIN over nine days: on and one microsecond around 5-minute, hour and day
# boundaries, and in between (a hypothesis strategy).
OFFSETS = st.one_of(
    st.builds(lambda n, d: n * 300 * MICROS + d, st.integers(0, 12 * 24 * 9),
              st.sampled_from([-1, 0, 1])),
    st.integers(0, 9 * 86_400 * MICROS))


def reference(feature, events, t):
    """The value at ``t`` written from the definition alone: events with ts in [start, t),
    start = floor((t − window) / hop) · hop, kept by the filter, with the column present."""
    spec, window = feature.spec, feature.window
    if window.seconds is None:
        start = -math.inf
    else:
        hop = window.hop * MICROS
        start = math.floor((t - window.seconds * MICROS) / hop) * hop
    rule = spec.rule()
    matching = [e for e in events if start <= e["ts"] < t
            and (spec.filter is None or (LABEL(e) if rule is None else matcher(rule, CONTRACT)(e)))]
    pairs = [(e["ts"], e[spec.column] if spec.column else True) for e in matching]
    values = [v for _, v in pairs if v is not None]
    op = spec.op
    if op == "count":
        return len(values)
    if op == "sum":
        return math.fsum(values)
    if op == "mean":
        return math.fsum(values) / len(values) if values else None
    if op == "variance":
        if not values:
            return None
        mean = math.fsum(values) / len(values)
        return math.fsum((v - mean) ** 2 for v in values) / len(values)
    if op == "latest":
        return max((ts for ts, _ in pairs), default=None)
    if op in ("min", "max"):
        return (min if op == "min" else max)(values) if values else None
    ordered = sorted(((ts, v) for ts, v in pairs if v is not None), reverse=True)
    if op == "last":
        return ordered[0][1] if ordered else None
    if op == "first":
        return ordered[-1][1] if ordered else None
    if op == "last_k":
        return [v for _, v in ordered[: spec.params.k]]
    if op == "approx_percentile":
        return _percentile(values, spec.params.edges, spec.params.q)
    assert op == "approx_distinct"
    return len(set(values))


def _percentile(values, edges, q):
    """The ``q`` percentile over the buckets of ``edges``: the value at rank q·n, linear
    inside its bucket, an outer bucket's edge in an outer bucket; None without values."""
    if not values:
        return None
    buckets = [0] * (len(edges) + 1)
    for value in values:
        buckets[sum(edge <= value for edge in edges)] += 1
    rank, below = q * len(values), 0
    for index, count in enumerate(buckets):
        if count and below + count >= rank:
            if index in (0, len(edges)):
                return edges[min(index, len(edges) - 1)]
            low, high = edges[index - 1], edges[index]
            return low + (high - low) * (rank - below) / count
        below += count
    raise AssertionError("the buckets hold every value")


def same_value(feature, got, expected):
    """Whether an executor's value is the reference's: sums and percentiles to 1e-12, a
    variance (a difference of sums) to 1e-9, the rest exactly."""
    if expected is not None and feature.spec.op in ("sum", "mean", "approx_percentile"):
        return got == pytest.approx(expected, rel=1e-12, abs=1e-12)
    if expected is not None and feature.spec.op == "variance":
        return got == pytest.approx(expected, rel=1e-9, abs=1e-9)
    return got == expected


def kept(feature, event):
    rule = feature.spec.rule()
    if feature.spec.filter is None:
        return True
    return bool(LABEL(event) if rule is None else matcher(rule, CONTRACT)(event))


