"""The aggregation spec and its engine (core.aggregations) against a brute-force reference
that implements the rule of time on its own: for every operation × window, random logs with
ties at hop and window boundaries give the reference's values from the engine's tiles, merged
in any order; bad specs fail naming the key."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from featureline.core.aggregations import (
    ALL,
    GroupSpec,
    check_groups,
    event_value,
    fold,
    merge_tiles,
    parse_window,
    tiles,
    value_from_tiles,
)
from featureline.core.errors import ConfigError
from featureline.core.settings import Settings, validate
from tests.aggregation_reference import (
    CONTRACT,
    LABEL,
    MICROS,
    OFFSETS,
    ORIGIN,
    OUTPUTS,
    SPEC,
    kept,
    reference,
    same_value,
)


def test_output_names_follow_the_spec():
    assert [f.output for f in OUTPUTS][:12] == [
        "count_30m", "count_1h", "count_1d", "count_7d", "purchases_1d", "purchases_30d",
        "positives_all", "value_sum_1h", "value_sum_7d", "value_sum_all", "price_mean_30d",
        "positive_rate"]
    assert [f.output for f in OUTPUTS][-6:] == [
        "category_first_1h", "category_first_all", "value_first_7d", "value_median_1d",
        "price_approx_percentile_7d", "price_approx_percentile_all"]
    assert OUTPUTS[0].qualified == "user_activity:count_30m"
    assert OUTPUTS[0].column_name == "user_activity__count_30m"


def test_hops_by_window_length():
    assert [(w.seconds, w.hop) for w in map(parse_window, ["30m", "1d", "25h", "14d", "30d"])] \
        == [(1800, 300), (86_400, 300), (90_000, 3600), (1_209_600, 3600), (2_592_000, 86_400)]
    assert parse_window(ALL).start(ORIGIN) is None
    # The 1h window at 10:07 starts at 09:05: rounded down to its 5-minute hop.
    window = parse_window("1h")
    t = ORIGIN + (10 * 3600 + 7 * 60) * MICROS
    assert window.start(t) == ORIGIN + (9 * 3600 + 5 * 60) * MICROS
    assert window.covers(window.start(t), t) and not window.covers(window.start(t) - 1, t)
    assert not window.covers(t, t)  # strictly before t: an example never sees itself


def _with_label(event):
    return {**event, "label": int(LABEL(event))}


_events = st.lists(st.fixed_dictionaries({
    "ts": OFFSETS.map(lambda offset: ORIGIN + offset),
    "user_id": st.just("u1"),
    "item_id": st.sampled_from([f"i{n}" for n in range(6)]),
    "event_type": st.sampled_from(["view", "click", "purchase"]),
    "value": st.one_of(st.none(), st.sampled_from([0.5, 1.0, 2.0, 4.0, -3.0])),
    "price": st.one_of(st.none(), st.sampled_from([1.25, 9.5, 100.0])),
    "category": st.one_of(st.none(), st.sampled_from(["c1", "c2", "c3"])),
}), max_size=40).map(lambda events: [_with_label(e) for e in events])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=_events, at=st.lists(OFFSETS, min_size=1, max_size=4), seed=st.integers(0, 99))
def test_tiles_merged_at_any_time_equal_the_definition(events, at, seed):
    """Serving: every event in its tile, read at any time after the latest. The batch, at any
    time t: the whole tiles before t's own tile, merged with the partial of the own tile's
    events before t. Tiles fold events in any order and merge in any order."""
    shuffle = random.Random(seed).shuffle
    latest = max((e["ts"] for e in events), default=ORIGIN)
    times = [ORIGIN + offset for offset in at] + [latest + 1, latest + 3 * 86_400 * MICROS]
    for feature in OUTPUTS:
        operation = feature.operation()
        pairs = [(e["ts"], event_value(feature.spec, e)) for e in events if kept(feature, e)]
        shuffle(pairs)
        for t in times:
            hop = (feature.window.hop or 0) * MICROS
            own = t // hop * hop if hop else t
            by_tile = list(tiles(operation, feature.window,
                                 [p for p in pairs if p[0] < own]).items())
            shuffle(by_tile)
            tail = fold(operation, (p for p in pairs if own <= p[0] < t))
            got = operation.finish(operation.merge(
                merge_tiles(operation, feature.window, dict(by_tile), t), tail))
            expected = reference(feature, events, t)
            assert same_value(feature, got, expected), (feature.output, t - ORIGIN, got, expected)
            if t > latest:
                served = value_from_tiles(operation, feature.window,
                                          tiles(operation, feature.window, pairs), t)
                assert same_value(feature, served, expected), (feature.output, t - ORIGIN)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=_events, at=OFFSETS,
       later=st.lists(st.one_of(OFFSETS, st.integers(0, 400 * MICROS)), min_size=1, max_size=6))
def test_merged_outputs_are_kept_only_while_they_cannot_change(events, at, later):
    """The API's outputs of a key merged at one request time (``MergedTiles``) answer later
    requests exactly as merging again would — for the same tiles, until
    ``Window.constant_until`` — and are merged again for new tiles."""
    from featureline.feature_store.online import GroupLayout, MergedTiles
    from featureline.feature_store.tiles import decode_key_tiles, encode_key_tiles

    group = GroupLayout.of(SPEC)

    def stored(events):
        return encode_key_tiles(group.features, {
            f.output: tiles(f.operation(), f.window,
                            [(e["ts"], event_value(f.spec, e)) for e in events if kept(f, e)])
            for f in OUTPUTS})

    merged = MergedTiles()
    times = sorted(ORIGIN + offset for offset in [at, *later])
    blobs = [stored(events), stored(events[: len(events) // 2])]
    for n, t in enumerate(times):
        blob = blobs[n % 3 == 2]  # now and then other tiles of the same key
        got, held = merged.at(group, ("u1",), blob, t)
        decoded = decode_key_tiles(group.features, blob)
        assert held == tuple(name in decoded for name in group.features)
        for feature in OUTPUTS:
            operation, window = feature.operation(), feature.window
            expected = value_from_tiles(operation, window, decoded[feature.output], t)
            assert same_value(feature, got[group.positions[feature.output]], expected), (
                feature.output, t - ORIGIN)
            until = window.constant_until(t)
            if until is not None:
                assert until > t
                last = value_from_tiles(operation, window, decoded[feature.output], until - 1)
                assert same_value(feature, last, expected), (feature.output, t - ORIGIN, until - t)
    # Kept: the same request time and tiles are not merged again.
    assert merged.at(group, ("u1",), blobs[0], times[0])[0] is merged.at(
        group, ("u1",), blobs[0], times[0])[0]


def test_an_idle_key_decays():
    feature = next(f for f in OUTPUTS if f.output == "count_1h")
    operation = feature.operation()
    last = ORIGIN + 3600 * MICROS + 17
    by_tile = tiles(operation, feature.window, [(ORIGIN + 60 * MICROS, True), (last, True)])
    assert value_from_tiles(operation, feature.window, by_tile, last + 1) == 2
    # An hour and up to one hop after its last event, the key reads 0.
    decayed = last + 3600 * MICROS + 300 * MICROS
    assert value_from_tiles(operation, feature.window, by_tile, decayed) == 0
    assert value_from_tiles(operation, feature.window, by_tile, last + 3600 * MICROS) == 1


@given(st.integers(0, 40 * 86_400 * MICROS))
def test_an_event_counts_until_its_window_expires(offset):
    """``Window.expires(ts)``: the first time an event at ts is out of the window — the
    reference's own rule decides, one µs before and at it."""
    ts = ORIGIN + offset
    for feature in OUTPUTS:
        window = feature.window
        ends = window.expires(ts)
        event = [{"ts": ts, "user_id": "u", "item_id": "i", "value": 1.0}]
        count = next(f for f in OUTPUTS if f.output == "count_1h").spec
        probe = type(feature)(feature.group, feature.keys, "probe", count, window)
        if ends is None:
            assert reference(probe, event, ts + 400 * 86_400 * MICROS) == 1
            continue
        assert ends > ts
        assert reference(probe, event, ends - 1) == 1
        assert reference(probe, event, ends) == 0


def test_approx_distinct_within_two_percent_at_ten_thousand_and_order_free():
    feature = next(f for f in OUTPUTS if f.output == "item_id_approx_distinct")
    operation = feature.operation()
    pairs = [(ORIGIN + n * MICROS, f"item-{n % 10_000}") for n in range(30_000)]
    by_tile = tiles(operation, parse_window("1d"), pairs)
    estimate = value_from_tiles(operation, feature.window, by_tile, ORIGIN + 86_400 * MICROS)
    assert abs(estimate - 10_000) / 10_000 <= 0.02
    reversed_tiles = dict(reversed(list(by_tile.items())))
    assert value_from_tiles(operation, feature.window, reversed_tiles,
                            ORIGIN + 86_400 * MICROS) == estimate


class _Spec(Settings):
    aggregations: list[GroupSpec]


def _group(**feature):
    return {"name": "g", "keys": ["user_id"], "features": [feature]}


@pytest.mark.parametrize(("group", "key", "message"), [
    (_group(op="median", column="value"), "aggregations[0].features[0].op", "'count'"),
    (_group(op="count", windows=["1h"], hop="15m"), "aggregations[0].features[0].windows[0]",
     "at least 6"),
    (_group(op="count", windows=["2m"]), "aggregations[0].features[0].windows[0]", "hop"),
    (_group(op="count", windows=["soon"]), "aggregations[0].features[0].windows[0]",
     "not a duration"),
    (_group(op="last_k", column="item_id"), "aggregations[0].features[0].k", "needs k"),
    (_group(op="last_k", column="item_id", k=0), "aggregations[0].features[0].k",
     "greater than or equal to 1"),
    (_group(op="count", k=3), "aggregations[0].features[0].k", "count takes no k (last_k does)"),
    (_group(op="sum"), "aggregations[0].features[0].column", "needs a column"),
    (_group(op="count", filter="event_type is purchase"), "aggregations[0].features[0].filter",
     "cannot parse"),
    ({"name": "g", "keys": ["user_id"], "features": [{"op": "count"}, {"op": "count"}]},
     "aggregations[0].features[1].name", "count is also the output of features[0]"),
    ({"name": "g", "keys": [], "features": [{"op": "count"}]}, "aggregations[0].keys", "at least"),
])
def test_bad_specs_name_the_key(group, key, message):
    with pytest.raises(ConfigError) as raised:
        validate(_Spec, {"aggregations": [group]}, origin="test")
    assert raised.value.key == key
    assert message in raised.value.message


@pytest.mark.parametrize(("groups", "message"), [
    ([_group(op="sum", column="dwell")], "[0].features[0].column: the events have no column "
                                         "'dwell'"),
    ([_group(op="count", filter="country == de")], "[0].features[0].filter: the events have no "
                                                   "column 'country'"),
    ([{"name": "g", "keys": ["user_id", "country"], "features": [{"op": "count"}]}],
     "[0].keys[1]: 'country' is not a text column"),
    ([{"name": "g", "keys": ["price"], "features": [{"op": "count"}]}],
     "[0].keys[0]: 'price' is not a text column"),
    ([_group(op="approx_distinct", column="value")], "[0].features[0].column: approx_distinct "
                                                      "reads text values; 'value' is a number"),
    ([_group(op="variance", column="category")], "[0].features[0].column: variance reads "
                                                 "numbers; 'category' is text"),
    ([_group(op="count"), _group(op="count")], "[1].name: group g is also [0]"),
    ([{"name": "item", "keys": ["item_id"], "features": [{"op": "count"}]}],
     "[0].name: item is the item table's group"),
])
def test_specs_read_only_columns_the_events_have(groups, message):
    specs = [GroupSpec.model_validate(g) for g in groups]
    with pytest.raises(ValueError) as raised:
        check_groups(specs, CONTRACT)
    assert str(raised.value).startswith(message)


@pytest.mark.parametrize(("data", "key", "message"), [
    ({"aggregations": [_group(op="sum", column="dwell")]},
     "aggregations[0].features[0].column", "the events have no column 'dwell'"),
    ({"aggregations": [_group(op="last", column="event_type")]},
     "aggregations[0].features[0].column", "add event_type to a categorify op's columns"),
    ({"aggregations": [_group(op="last_k", column="price", k=3)]},
     "aggregations[0].features[0].column", "last_k keeps ids of a text column"),
    ({"aggregations": [_group(op="count")], "etl": {"aggregations": []}},
     "etl.aggregations", "write aggregations at the top level"),
])
def test_the_file_names_the_key_of_a_spec_the_events_cannot_feed(data, key, message):
    from featureline.config import parse_config

    with pytest.raises(ConfigError) as raised:
        parse_config(data)
    assert (raised.value.key, message in raised.value.message) == (key, True), raised.value


def test_the_spec_reaches_the_etl():
    from featureline.config import parse_config

    config = parse_config({"aggregations": [_group(op="count", windows=["1h"])]})
    assert [f.column_name for g in config.etl.aggregations for f in g.outputs()] == [
        "g__count_1h"]


def test_a_percentile_is_within_a_bucket_of_numpys():
    """approx_percentile's value lies in the bucket of the exact percentile: off by less
    than the bucket's width, in any merge order."""
    import numpy as np

    rng = np.random.default_rng(5)
    values = rng.gamma(2.0, 3.0, size=5_000)
    edges = [float(edge) for edge in range(0, 31)]
    for q in (0.1, 0.5, 0.9):
        spec = GroupSpec.model_validate({"name": "g", "keys": ["user_id"], "features": [
            {"op": "approx_percentile", "column": "x", "edges": edges, "q": q}]})
        operation = spec.outputs()[0].operation()
        halves = [fold(operation, ((0, float(v)) for v in part)) for part in
                  (values[:1_700], values[1_700:])]
        got = operation.finish(operation.merge(halves[1], halves[0]))
        exact = float(np.percentile(values, q * 100))
        assert abs(got - exact) < 1.0, (q, got, exact)
        assert got == operation.finish(fold(operation, ((0, float(v)) for v in values)))


@pytest.mark.parametrize(("feature", "key", "message"), [
    ({"op": "approx_percentile", "column": "value", "q": 0.5}, "edges", "needs edges"),
    ({"op": "approx_percentile", "column": "value", "edges": [1, 1], "q": 0.5}, "edges",
     "edges must increase: [1.0, 1.0]"),
    ({"op": "approx_percentile", "column": "value", "edges": [1], "q": 1.5}, "q",
     "less than 1"),
    ({"op": "mean", "column": "value", "q": 0.5}, "q", "mean takes no q (approx_percentile"),
])
def test_bad_percentile_parameters_name_the_key(feature, key, message):
    with pytest.raises(ConfigError) as raised:
        validate(_Spec, {"aggregations": [_group(**feature)]}, origin="test")
    assert raised.value.key == f"aggregations[0].features[0].{key}"
    assert message in raised.value.message


def test_a_variance_of_values_far_from_zero_is_numpys_in_any_merge_order():
    """2,000 values 1e9 + N(0, 1) added to two partials, merged either way and through the
    online store's JSON: NumPy's variance to 1e-6 (plain sums of squares gave 0.0)."""
    import numpy as np

    values = 1e9 + np.random.default_rng(4).normal(size=2_000)
    spec = GroupSpec.model_validate({"name": "g", "keys": ["user_id"], "features": [
        {"op": "variance", "column": "x"}]})
    operation = spec.outputs()[0].operation()
    left = fold(operation, ((0, float(v)) for v in values[:700]))
    right = fold(operation, ((0, float(v)) for v in values[700:]))
    stored = operation.from_json(operation.to_json(right))
    exact = float(np.var(values))
    for merged in (operation.merge(left, right), operation.merge(stored, left)):
        assert operation.finish(merged) == pytest.approx(exact, rel=1e-6)
    empty = operation.init()
    assert operation.merge(empty, left) == left == operation.merge(left, empty)
    assert operation.finish(left) == pytest.approx(float(np.var(values[:700])), rel=1e-6)
