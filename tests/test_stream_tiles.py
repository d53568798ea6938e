"""The stream's executor of the aggregations (stream/tiles.py) against the brute-force
reference, on a real Redis: random logs of several users (ties at hop and window boundaries)
split at a random cut into the batch's tiles — as the ETL writes them and publish loads
them — and the pushed events after it, added in random batches and delivered again, give
merged from the stored tiles, at times after the last event, the reference's value for
every operation × window; an entity table's group gives the reference's values at the
midnight after the entity's latest event, as the processor writes its row."""

from __future__ import annotations

import random
from types import SimpleNamespace

import orjson
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from featureline.core.aggregations import entity_group, event_value, tiles, value_from_tiles
from featureline.core.time_rule import DAY
from featureline.feature_store.tiles import (
    decode_key_tiles,
    encode_key_tiles,
    tile_key,
    tiles_prefix,
)
from featureline.stream.processor import entity_values
from featureline.stream.tiles import SCRIPT_EVENTS, SCRIPT_KEYS, StreamTiles
from tests.aggregation_reference import (
    CONTRACT,
    LABEL,
    MICROS,
    OFFSETS,
    ORIGIN,
    SPEC,
    kept,
    reference,
    same_value,
)
from tests.feast_data import fresh_db

GROUPS = [SPEC, entity_group("user", 7)]
USERS = ["u1", "u2", "u3"]
GENERATION = 1

_events = st.lists(st.fixed_dictionaries({
    "ts": OFFSETS.map(lambda offset: ORIGIN + offset),
    "user_id": st.sampled_from(USERS),
    "item_id": st.sampled_from([f"i{n}" for n in range(6)]),
    "event_type": st.sampled_from(["view", "click", "purchase"]),
    "value": st.one_of(st.none(), st.sampled_from([0.5, 1.0, 2.0, -3.0])),
    "price": st.one_of(st.none(), st.sampled_from([1.25, 9.5, 100.0])),
    "category": st.one_of(st.none(), st.sampled_from(["c1", "c2", "c3"])),
}), max_size=30)


@pytest.fixture(scope="module")
def client(redis_server):
    return redis.Redis.from_url(fresh_db(redis_server, 7))


def _digest(event: dict) -> bytes:
    """An event's identity, as the processor's digest of its line: equal events, one."""
    return orjson.dumps(event, option=orjson.OPT_SORT_KEYS)


def _publish(client: redis.Redis, events: list[dict], cut: int) -> None:
    """Each user's tiles of the events before ``cut``: the hops a window can still reach at
    the cut, and the lifetime's one tile — what publish writes."""
    for group in GROUPS:
        features = {f.output: f for f in group.outputs()}
        for user in USERS:
            own = [e for e in events if e["user_id"] == user]
            by_output = {}
            for output, feature in features.items():
                pairs = [(e["ts"], event_value(feature.spec, e)) for e in own
                         if kept(feature, e)]
                held = tiles(feature.operation(), feature.window, pairs)
                start = feature.window.start(cut)
                by_output[output] = {tile: partial for tile, partial in held.items()
                                     if start is None or tile >= start}
            client.set(tiles_prefix("p", GENERATION, group.name) + tile_key([user]),
                       encode_key_tiles(features, by_output))


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(logged=_events, cut_offset=OFFSETS, batch=st.integers(1, 7),
       later=st.lists(st.integers(0, 9 * 86_400 * MICROS), max_size=3), seed=st.integers(0, 99))
def test_streamed_tiles_serve_the_definition(client, logged, cut_offset, batch, later, seed):
    client.flushdb()
    # An exact duplicate is one event (the ETL's rule); each carries its label.
    events = list({_digest(e): {**e, "label": int(LABEL(e))} for e in logged}.values())
    cut = ORIGIN + cut_offset
    _publish(client, [e for e in events if e["ts"] < cut], cut)
    stream = StreamTiles(client, "p", CONTRACT)
    stream.serve(GROUPS, GENERATION, cut)
    pushed = [e for e in events if e["ts"] >= cut]
    rng = random.Random(seed)
    # Every pushed event, some delivered again, in a random order and random batches.
    deliveries = pushed + rng.sample(pushed, len(pushed) // 2)
    rng.shuffle(deliveries)
    for low in range(0, len(deliveries), batch):
        stream.add([(_digest(e), e["ts"], e["label"], e) for e in deliveries[low:low + batch]])

    latest = max([cut, *(e["ts"] + 1 for e in events)])
    differ = []
    for group in GROUPS:
        features = {f.output: f for f in group.outputs()}
        for user in USERS:
            own = [e for e in events if e["user_id"] == user]
            stored = client.get(tiles_prefix("p", GENERATION, group.name) + tile_key([user]))
            held = decode_key_tiles(features, stored) if stored else {}
            for t in [latest, *(latest + offset for offset in later)]:
                for output, feature in features.items():
                    got = value_from_tiles(feature.operation(), feature.window,
                                           held.get(output, {}), t)
                    expected = reference(feature, own, t)
                    if not same_value(feature, got, expected):
                        differ.append((output, user, t - ORIGIN, got, expected))
            if group.name == "user" and any(e["ts"] >= cut for e in own):
                row = entity_values(features, stored)
                assert row is not None
                values, at = row
                assert at == (max(e["ts"] for e in own) // DAY + 1) * DAY
                differ += [(output, user, "row", values[output], reference(feature, own, at))
                           for output, feature in features.items()
                           if not same_value(feature, values[output], reference(feature, own, at))]
    assert differ == [], differ[:5]


def test_a_key_another_processor_wrote_after_the_read_is_read_again(client):
    """Two processors add events of one user at once: the one whose read came before the
    other's write finds the key's version moved, leaves it unwritten and reads it again —
    both events counted, each once."""
    client.flushdb()
    _publish(client, [], ORIGIN)
    first, second = (StreamTiles(client, "p", CONTRACT) for _ in range(2))
    for stream in (first, second):
        stream.serve(GROUPS, GENERATION, ORIGIN)
    mine, theirs = ({"ts": ORIGIN + offset, "user_id": "u1", "item_id": "i1",
                     "event_type": kind, "value": 1.0, "price": None, "category": "c1"}
                    for offset, kind in ((MICROS, "view"), (2 * MICROS, "click")))
    scripts, reads = first._scripts, []

    def interleaved(script, calls):
        replies = scripts(script, calls)
        if script is first.read:
            reads.append(len(calls))
            if len(reads) == 1:  # between this read and its write
                second.add([(_digest(theirs), theirs["ts"], 1, theirs)])
        return replies

    first._scripts = interleaved
    added = first.add([(_digest(mine), mine["ts"], 0, mine)])
    assert reads == [1, 1]  # read again after the conflict
    group = entity_group("user", 7)
    features = {f.output: f for f in group.outputs()}
    stored = client.get(tiles_prefix("p", GENERATION, "user") + tile_key(["u1"]))
    assert added["user"][("u1",)].stored == stored
    values, _ = entity_values(features, stored)
    assert (values["user_events"], values["user_positives"]) == (2, 1)
    # Delivered again to either: nothing moves.
    second.add([(_digest(mine), mine["ts"], 0, mine)])
    assert client.get(tiles_prefix("p", GENERATION, "user") + tile_key(["u1"])) == stored


def test_script_calls_hold_at_most_their_keys_and_events():
    """A batch's keys split into script calls of at most SCRIPT_KEYS keys and SCRIPT_EVENTS
    events, each key in one call — a key with more events than a call takes, alone."""
    keys = [("g", (str(n),)) for n in range(1200)]
    events = [1] * 600 + [SCRIPT_EVENTS + 1] + [3] * 599
    parts = StreamTiles._parts(SimpleNamespace(cluster=False), keys, events)  # type: ignore[arg-type]
    assert sorted(at for part in parts for at in part) == list(range(1200))
    assert [600] in parts
    for part in parts:
        assert len(part) <= SCRIPT_KEYS
        assert part == [600] or sum(events[at] for at in part) <= SCRIPT_EVENTS
    assert len(parts) == 5  # 500 + 100 single events, the big key, 333 + 266 of three
