"""Aggregation features defined in featureline.yaml only — a user group and a
[user_id, category] group — in the ETL's examples, TFRecords and metadata.json, each example's
values equal to the brute-force reference at its own time."""

from __future__ import annotations

import json
import math
import random
from collections import Counter
from datetime import timezone

import pyarrow.dataset as ds
import pytest
import yaml

from featureline.config import parse_config
from featureline.core.aggregations import MICROS, entity_group
from featureline.core.metadata import PADDING_ID
from featureline.core.transforms import apply
from featureline.etl import job
from featureline.etl.datagen import write_log
from featureline.etl.tfrecord.reader import read_numpy
from tests.aggregation_reference import reference
from tests.job_config import PER_EVENT_LABEL, TEST_SPARK

# A job run of its own (~40 s on 2 cores).
pytestmark = pytest.mark.slow

SPEC = """
aggregations:
  - name: user_activity
    keys: [user_id]
    features:
      - {op: count, windows: [1h, 1d, 7d]}
      - {op: count, name: purchases, filter: "event_type in (purchase)", windows: [1d]}
      - {op: sum, column: value, windows: [7d, all]}
      - {op: mean, column: price, windows: [1d]}
      - {op: last_k, column: item_id, k: 3}
      - {op: last, column: category, windows: [1d]}
      - {op: first, column: category, windows: [1d]}
      - {op: approx_distinct, column: category, windows: [7d]}
      - {op: latest, windows: [7d]}
  - name: user_category
    keys: [user_id, category]
    features:
      - {op: count, windows: [1d]}
      - {op: count, name: positives, filter: label, windows: [1d]}
      - {op: max, column: price, windows: [7d]}
      - {op: approx_percentile, column: price, edges: [10, 50, 200], q: 0.5, windows: [7d]}
derive:
  - {name: category_rate, expr: "ratio(user_category:positives_1d, user_category:count_1d,
                                       prior=0.2, weight=4)"}
  - {name: price_over_max, expr: "price / user_category:price_max_7d"}
  - {name: recency, expr: "bucketize(seconds_since(user_activity:latest_7d), [60, 3600])"}
  - {name: mixed, expr: "coalesce(log1p(category_rate * 10 - 3), -1)
                         - clip(user_activity:count_1h, 0, 5)"}
"""
# Each derived feature by hand, from its inputs' brute-force values and the event's price.
DERIVED = {
    "category_rate": lambda v: (v["user_category:positives_1d"] + 0.2 * 4)
    / (v["user_category:count_1d"] + 4),
    "price_over_max": lambda v: None if v["price"] is None or not v[
        "user_category:price_max_7d"] else v["price"] / v["user_category:price_max_7d"],
    "recency": lambda v: None if v["user_activity:latest_7d"] is None else float(sum(
        edge <= (v["ts"] - v["user_activity:latest_7d"]) / MICROS for edge in (60, 3600))),
    "mixed": lambda v: ((math.log1p(v["category_rate"] * 10 - 3)
                         if v["category_rate"] * 10 - 3 > -1 else -1)
                        - min(max(v["user_activity:count_1h"], 0), 5)),
}


@pytest.fixture(scope="module")
def aggregated(spark, tmp_path_factory):
    root = tmp_path_factory.mktemp("aggregated")
    log = root / "events.jsonl"
    write_log(log, events=1500, users=20, items=30, days=4, seed=5, bad_fraction=0.0)
    config = parse_config({**yaml.safe_load(SPEC), "etl": {
        "source": {"path": str(log)}, "output": {"path": str(root / "out")},
        "label": PER_EVENT_LABEL, "spark": TEST_SPARK.model_dump(mode="json")}})
    return job.run(config.etl, spark, progress=lambda _: None), config


def _table(output, folder):
    return ds.dataset(output / folder, format="parquet", partitioning="hive").to_table(
    ).to_pylist()


def test_a_group_added_in_yaml_is_in_the_examples_at_each_examples_time(aggregated):
    result, config = aggregated
    rows = _table(result.output, "examples")
    accepted = _table(result.output, "state/events")
    assert len(rows) == len(accepted) == result.metadata["rows"]["accepted"]
    # An example is found by (user, item, time); the rare pairs of events sharing all three
    # (another event type) are left out, not guessed.
    keys = Counter((r["user_id"], r["item_id"], r["ts"]) for r in rows)
    examples = {key: r for r in rows if keys[key := (r["user_id"], r["item_id"], r["ts"])] == 1}
    accepted = [r for r in accepted if (r["user_id"], r["item_id"], r["ts"]) in examples]
    assert len(accepted) >= len(rows) - 4
    described = {f["name"]: f for f in result.metadata["features"]}
    events = [{**row, "ts": _micros(row["ts"])} for row in _table(result.output, "state/events")]
    # Each raw value's id, as the examples hold it.
    ids = {column: {raw[column]: examples[(raw["user_id"], raw["item_id"], raw["ts"])][
        f"{column}_cat"] for raw in accepted} for column in ("item_id", "category")}
    for group in config.aggregations:
        by_key: dict[tuple, list[dict]] = {}
        for event in events:
            by_key.setdefault(tuple(event[k] for k in group.keys), []).append(event)
        for feature in group.outputs():
            differ = []
            for raw in accepted:
                row = examples[(raw["user_id"], raw["item_id"], raw["ts"])]
                event = {**raw, "ts": _micros(raw["ts"])}
                own = by_key[tuple(event[k] for k in group.keys)]
                value = reference(feature, own, event["ts"])
                expected = _as_example(feature, value, ids, described[feature.column_name])
                got = row[feature.column_name]
                if not _same(got, expected):
                    differ.append((row["user_id"], event["ts"], got, expected))
                indicator = f"{feature.column_name}_missing"
                if indicator in row and row[indicator] != float(value is None):
                    differ.append((row["user_id"], event["ts"], "missing", value))
            assert differ == [], (feature.column_name, differ[:5])


def test_derived_features_equal_their_expression_over_the_brute_force(aggregated):
    """Each derived feature of each example equals its expression evaluated by hand over the
    brute-force values of the outputs it reads (at the example's own time) and the event's
    price, through its fitted transform; a missing value (a division by zero, no earlier
    event) is flagged."""
    result, config = aggregated
    rows = _table(result.output, "examples")
    keys = Counter((r["user_id"], r["item_id"], r["ts"]) for r in rows)
    examples = {key: r for r in rows if keys[key := (r["user_id"], r["item_id"], r["ts"])] == 1}
    described = {f["name"]: f for f in result.metadata["features"]}
    outputs = {f.qualified: (group, f) for group in config.aggregations for f in group.outputs()}
    read = ["user_category:positives_1d", "user_category:count_1d", "user_category:price_max_7d",
            "user_activity:latest_7d", "user_activity:count_1h"]
    accepted = _table(result.output, "state/events")
    events = [{**raw, "ts": _micros(raw["ts"])} for raw in accepted]
    by_key: dict[tuple, list[dict]] = {}
    for group in config.aggregations:
        for event in events:
            by_key.setdefault((group.name, *(event[k] for k in group.keys)), []).append(event)
    checked: int = 0
    missing: Counter = Counter()
    for raw, event in zip(accepted, events, strict=True):
        row = examples.get((raw["user_id"], raw["item_id"], raw["ts"]))
        if row is None:
            continue
        values = {"price": event.get("price"), "ts": event["ts"]}
        for name in read:
            group, feature = outputs[name]
            own = by_key[(group.name, *(event[k] for k in group.keys))]
            values[name] = reference(feature, own, event["ts"])
        for name, by_hand in DERIVED.items():
            value = values[name] = by_hand(values)
            expected = float(apply([math.nan if value is None else value],
                                   described[name]["transform"])[0])
            assert row[name] == pytest.approx(expected, rel=1e-5, abs=1e-5), (name, values)
            assert row[f"{name}_missing"] == float(value is None), (name, values)
            missing[name] += value is None
        checked += 1
    assert checked >= 500
    # Some missing where the expression can be: no earlier event in 7 days, no price.
    assert 0 < missing["recency"] < checked and missing["category_rate"] == 0
    assert described["category_rate"]["derived"].startswith("ratio(")


def test_lag_features_activity_is_the_groups_count(aggregated):
    """One implementation of "events in the last hour": lag_features' activity windows (the
    defaults 1h, 24h, 7d) hold, in every example, the value the spec's ``[user_id]`` group
    serves as count_1h, count_1d and count_7d — the same raw counts through the same fitted
    transform."""
    result, _ = aggregated
    rows = _table(result.output, "examples")
    pairs = {"user_events_1h": "user_activity__count_1h",
             "user_events_24h": "user_activity__count_1d",
             "user_events_7d": "user_activity__count_7d"}
    for lag, group in pairs.items():
        assert [r[lag] for r in rows] == [r[group] for r in rows], lag
    # Not all one value: the windows differ between examples and from each other.
    assert len({r["user_events_1h"] for r in rows}) > 3
    assert any(r["user_events_1h"] != r["user_events_24h"] for r in rows)


def _micros(ts) -> int:
    return int(ts.replace(tzinfo=timezone.utc).timestamp() * MICROS)


def _same(got, expected) -> bool:
    if isinstance(expected, float):
        return got == pytest.approx(expected, rel=1e-5, abs=1e-5)
    return got == expected


def _as_example(feature, value, ids, described):
    """The reference's value as the examples hold it: ids for last_k (padded) and a text
    last, the model-ready transform of the number for the rest."""
    op, column = feature.spec.op, feature.spec.column
    if op in ("first", "last", "last_k") and column in ("item_id", "category"):
        if op != "last_k":
            return PADDING_ID if value is None else ids[column][value]
        return [ids[column][v] for v in value] + [PADDING_ID] * (feature.spec.params.k - len(value))
    return float(apply([math.nan if value is None else value], described["transform"])[0])


def test_metadata_and_tfrecords_describe_every_aggregation(aggregated):
    result, config = aggregated
    features = {f["name"]: f for f in result.metadata["features"]}
    outputs = [f for group in config.aggregations for f in group.outputs()]
    assert len(outputs) == 16
    described = features["user_category__price_max_7d"]["aggregation"]
    assert described == {"group": "user_category", "keys": ["user_id", "category"],
                         "feature": "price_max_7d", "op": "max", "column": "price",
                         "filter": None, "k": None, "window": "7d", "window_s": 604_800,
                         "hop_s": 3600}
    assert features["user_activity__item_id_last_k"]["kind"] == "multi_hot"
    assert features["user_activity__item_id_last_k"]["shares"] == "item_id_cat"
    assert features["user_activity__count_1h"]["transform"]["name"] == "log1p_standardize"
    # The TFRecords hold the model-ready values of the examples, row for row.
    train = read_numpy(result.output, "train")
    examples = sorted((r for r in _table(result.output, "examples") if r["split"] == "train"),
                      key=lambda r: (r["user_id"], r["item_id"], r["ts"]))
    assert len(train["user_activity__item_id_last_k"]) == len(examples)
    assert sorted(map(tuple, train["user_activity__item_id_last_k"].tolist())) == sorted(
        tuple(r["user_activity__item_id_last_k"]) for r in examples)
    assert sorted(train["user_category__count_1d"].tolist()) == pytest.approx(sorted(
        r["user_category__count_1d"] for r in examples), rel=1e-6)
    assert len(set(train["user_category__count_1d"].tolist())) > 3


def test_the_outputs_tiles_serve_the_definition_after_the_last_event(aggregated):
    """The job writes each output's tiles as of its last event (tiles/<group>/<feature>,
    described in metadata.json); read back, they give the reference's value at the cut and
    later, for every key of the spec's groups and the model inputs' (users, items, pairs),
    and an idle key's windows decay."""
    from featureline.core.metadata import read_metadata
    from featureline.feature_store.tiles import read_tiles

    result, config = aggregated
    metadata = read_metadata(result.output)
    events = [{**row, "ts": _micros(row["ts"])} for row in _table(result.output, "state/events")]
    assert metadata.tiles.cut_us == max(e["ts"] for e in events) + 1
    # The spec's groups, the model inputs', then the entity tables' (what the stream adds
    # pushed events to).
    groups = metadata.tile_groups()
    inputs = metadata.inputs.groups
    assert [g.name for g in groups] == [*(g.name for g in config.aggregations),
                                        "inputs_user", "inputs_pair", "inputs_item",
                                        "user", "item"]
    served = read_tiles(metadata, [*config.aggregations, *inputs])
    assert groups[-2:] == [entity_group(e, 7) for e in ("user", "item")]
    assert set(metadata.tiles.tables) == {f.qualified for g in groups for f in g.outputs()}
    assert metadata.outputs["tiles"] == "tiles"
    hour = 3600 * MICROS
    differ = []
    for group in [*config.aggregations, *inputs]:
        by_key: dict[tuple, list[dict]] = {}
        for event in events:
            by_key.setdefault(tuple(event[k] for k in group.keys), []).append(event)
        by_key = {k: v for k, v in by_key.items() if None not in k}
        for key, own in sorted(by_key.items()):
            for offset in (0, hour, 2 * hour + 1, 86_400 * MICROS, 9 * 86_400 * MICROS):
                t = metadata.tiles.cut_us + offset
                values = served.values_at(group.name, key, t)
                for feature in group.outputs():
                    expected = reference(feature, own, t)
                    if not _same(values[feature.output], expected):
                        differ.append((feature.qualified, key, offset, values[feature.output],
                                       expected))
    assert differ == [], differ[:5]
    decayed = served.values_at("user_activity", [events[-1]["user_id"]],
                               metadata.tiles.cut_us + hour + 300 * MICROS)
    assert decayed["count_1h"] == 0 and decayed["count_1d"] > 0


def test_publish_encodes_every_keys_tiles_as_the_rows_read_one_by_one(aggregated):
    """stored_tiles (what publish writes: a chunk of keys at a time, by columns) gives every
    key of every group — both spec groups, the [user_id, category] one included, and the
    entity tables' — exactly the bytes of its tiles read row by row and encoded key by key,
    each key once, across chunk boundaries."""
    from featureline.core.metadata import read_metadata
    from featureline.feature_store.tiles import encode_key_tiles, read_tiles, stored_tiles

    result, _ = aggregated
    metadata = read_metadata(result.output)
    for group in metadata.tile_groups():
        features = {feature.output: feature for feature in group.outputs()}
        read = read_tiles(metadata, [group])
        by_key: dict[tuple, dict] = {}
        for feature in features.values():
            for key, tiles in read.by_output[feature.qualified].items():
                by_key.setdefault(key, {})[feature.output] = tiles
        expected = {key: encode_key_tiles(features, {output: own.get(output, {})
                                                     for output in features})
                    for key, own in by_key.items()}
        chunks = list(stored_tiles(metadata, group, chunk=7))
        assert [len(chunk) for chunk in chunks[:-1]] == [7] * (len(chunks) - 1)
        encoded = [pair for chunk in chunks for pair in chunk]
        assert len(encoded) == len(expected) > 7, group.name
        assert dict(encoded) == expected, group.name


def test_the_aggregations_command_prints_a_keys_values_at_a_time(aggregated, tmp_path):
    """`featureline aggregations GROUP KEY… --at T` prints what the tiles give at T; a time
    before the last event, an unknown group or a wrong number of key values is an error
    naming what to fix."""
    from datetime import datetime

    from click.testing import CliRunner

    from featureline.cli import main
    from featureline.core.errors import ConfigError
    from featureline.core.metadata import read_metadata
    from featureline.feature_store.tiles import read_tiles

    result, config = aggregated
    path = tmp_path / "featureline.yaml"
    path.write_text(SPEC + f"etl:\n  output:\n    path: {result.output}\n")
    served = read_tiles(read_metadata(result.output), config.aggregations)
    later = served.cut_us + 3 * 3600 * MICROS
    at = datetime.fromtimestamp(later / MICROS, timezone.utc).isoformat()
    user = _table(result.output, "state/events")[-1]["user_id"]

    def run(*args):
        return CliRunner().invoke(main, ["aggregations", "--config", str(path), *args])

    done = run("user_activity", user, "--at", at, "--json")
    assert done.exit_code == 0, done.output
    printed = json.loads(done.output)
    assert printed["values"] == served.values_at("user_activity", [user], later)
    assert printed["values"]["count_1h"] == 0 and printed["values"]["count_1d"] > 0
    text = run("user_category", user, "c0", "--at", at).output
    expected = served.values_at("user_category", [user, "c0"], later)["count_1d"]
    assert f"user_category:count_1d  {expected}\n" in text
    before = datetime.fromtimestamp(served.cut_us / MICROS - 60, timezone.utc).isoformat()
    for args, field in [(("user_activity", user, "--at", before), "--at"),
                        (("nobody", user), "GROUP"), (("user_category", user), "KEY")]:
        failed = run(*args)  # the console script prints it as one line, exit code 2
        assert isinstance(failed.exception, ConfigError), (args, failed.output)
        assert failed.exception.key == field and failed.exception.exit_code == 2


def test_the_api_serves_the_published_tiles_at_the_request_time(aggregated, tmp_path,
                                                               redis_server):
    """Published, the tiles are one value per key in the served generation; the API merges
    them at the request time into every aggregation of /v1/features (a [user_id, category]
    group included) and of the user's section of /v1/ranking-inputs — equal to the brute-force
    reference at the cut and later, an idle user's 1h count decayed to 0 — and a replace
    leaves only the new generation's tiles."""
    import redis
    from fastapi.testclient import TestClient

    from featureline.api.app import create_app
    from featureline.core.metadata import read_metadata
    from featureline.feature_store.publish import publish
    from featureline.feature_store.repo import open_repo
    from featureline.feature_store.tiles import TILES_PREFIX
    from tests.feast_data import copy_project, fresh_db

    result, config = aggregated
    project = copy_project(tmp_path, ttl="3650d", api={"auth": {"enabled": False}})
    url = fresh_db(redis_server, 12)
    repo = open_repo(project.feature_store, result.output, url=url)
    summary = publish(repo, progress=lambda _: None)
    events = [{**row, "ts": _micros(row["ts"])} for row in _table(result.output, "state/events")]
    keys = {group.name: sorted({tuple(e[k] for k in group.keys) for e in events
                                if None not in (e[k] for k in group.keys)})
            for group in read_metadata(result.output).tile_groups()}
    assert summary.tile_keys == sum(map(len, keys.values()))
    client = redis.Redis.from_url(url)
    stored = set(client.scan_iter(match=f"{TILES_PREFIX}*"))
    assert len(stored) == summary.tile_keys
    assert all(key.split(b":")[3] == str(summary.generation).encode() for key in stored)
    cut = read_metadata(result.output).tiles.cut_us
    hour = 3600 * MICROS
    app = create_app(project.serving(), output=result.output, redis_url=url)
    with TestClient(app) as api:
        reader = app.state.services.reader
        differ = []
        for group in config.aggregations:
            outputs = group.outputs()
            rows = [*keys[group.name], ("nobody",) * len(group.keys)]
            entities = {k: [row[i] for row in rows] for i, k in enumerate(group.keys)}
            for offset in (0, hour, 2 * hour + 1, 9 * 86_400 * MICROS):
                reader.clock = lambda offset=offset: cut + offset
                answer = api.post("/v1/features", json={
                    "features": [f.qualified for f in outputs], "entities": entities}).json()
                assert answer["names"] == [f.qualified for f in outputs]
                for feature in outputs:
                    for row, key in enumerate(rows):
                        own = [e for e in events if tuple(e[k] for k in group.keys) == key]
                        expected = reference(feature, own, cut + offset)
                        got = answer["values"][feature.qualified][row]
                        status = answer["status"][feature.qualified][row]
                        if not _same(got, expected) or status != (
                                "present" if own else "not_found"):
                            differ.append((feature.qualified, key, offset, got, expected,
                                           status))
        assert differ == [], differ[:5]
        user = events[-1]["user_id"]
        reader.clock = lambda: cut + hour + 300 * MICROS
        ranking = api.post("/v1/ranking-inputs", json={
            "user_id": user, "item_ids": [events[-1]["item_id"]]}).json()
        values = ranking["user"]["values"]
        assert values["user_activity:count_1h"] == [0]
        assert values["user_activity:count_1d"][0] > 0
        assert "user_category:count_1d" not in values  # not keyed by the user alone
        assert not any(name.startswith("user_activity:") for name in ranking["items"]["values"])
        missing = api.post("/v1/features", json={"features": ["user_category:count_1d"],
                                                 "entities": {"user_id": [user]}})
        assert missing.status_code == 422 and "category" in missing.json()["message"]
        # Given the item instead, the group reads the item's category from the tiles: the
        # same values as the category sent; an item unknown is not found.
        item = events[-1]["item_id"]
        category = next(e["category"] for e in reversed(events) if e["item_id"] == item)
        by_item = api.post("/v1/features", json={
            "features": ["user_category:count_1d"],
            "entities": {"user_id": [user, user], "item_id": [item, "nobody"]}}).json()
        sent = api.post("/v1/features", json={
            "features": ["user_category:count_1d"],
            "entities": {"user_id": [user], "category": [category]}}).json()
        assert by_item["values"]["user_category:count_1d"][0] == sent["values"][
            "user_category:count_1d"][0]
        assert by_item["status"]["user_category:count_1d"] == ["present", "not_found"]
        assert sent["values"]["user_category:count_1d"][0] > 0
    again = publish(repo, full=True, progress=lambda _: None)
    assert again.tile_keys == summary.tile_keys
    assert {key.split(b":")[3] for key in client.scan_iter(match=f"{TILES_PREFIX}*")} == {
        str(again.generation).encode()}


def test_feast_joins_each_groups_daily_snapshots(aggregated, tmp_path, redis_server):
    """Both groups are Feast views of their own (the [user_id, category] one keyed by two
    entities, ``category`` new): a point-in-time join at any time reads each value as of the
    start of that day — the brute-force reference there ("snapshot accuracy") — and nothing
    before a key's first day; ``training-set``'s ``training`` service joins the user's
    group beside the entity views."""
    import pandas as pd

    from featureline.feature_store.publish import publish
    from featureline.feature_store.repo import open_repo
    from featureline.feature_store.training_set import training_set
    from tests.feast_data import copy_project, fresh_db

    result, config = aggregated
    project = copy_project(tmp_path, ttl="3650d")
    repo = open_repo(project.feature_store, result.output, url=fresh_db(redis_server, 12))
    publish(repo, progress=lambda _: None)
    assert {e.name for e in repo.store.list_entities()} >= {"user", "item", "category"}
    views = {v.name: v for v in repo.store.list_feature_views()}
    assert [e for e in views["user_category"].entities] == ["user", "category"]
    events = [{**row, "ts": _micros(row["ts"])} for row in _table(result.output, "state/events")]
    day = 86_400 * MICROS
    first, last = min(e["ts"] for e in events) // day, max(e["ts"] for e in events) // day
    rng = random.Random(7)
    for group in config.aggregations:
        keyed = [e for e in events if None not in (e[k] for k in group.keys)]
        keys = sorted({tuple(e[k] for k in group.keys) for e in keyed})
        rows = [dict(zip(group.keys, key, strict=True),
                     at=rng.randrange(first * day, (last + 2) * day)) for key in keys
                for _ in range(4)]
        rows += [dict(zip(group.keys, key, strict=True), at=at) for key in keys[:3]
                 for at in (first * day + day, (last + 1) * day, (last + 2) * day - 1)]
        frame = pd.DataFrame(rows)
        frame["event_timestamp"] = pd.to_datetime(frame.pop("at"), unit="us", utc=True)
        joined = repo.store.get_historical_features(
            entity_df=frame, features=[f.qualified for f in group.outputs()]).to_df()
        assert len(joined) == len(frame)
        differ = []
        for row in joined.to_dict("records"):
            key = tuple(row[k] for k in group.keys)
            own = [e for e in keyed if tuple(e[k] for k in group.keys) == key]
            at = int(row["event_timestamp"].timestamp()) * MICROS
            start = at // day * day
            seen = any(e["ts"] < start for e in own)
            for feature in group.outputs():
                expected = reference(feature, own, start) if seen else None
                got = _plain(row[feature.output])
                if not (_same(got, expected) or (got is None and expected is None)):
                    differ.append((feature.qualified, key, at - first * day, got, expected))
        assert differ == [], differ[:5]
    entity_rows = tmp_path / "rows.parquet"
    user = events[-1]["user_id"]
    pd.DataFrame({"user_id": [user], "item_id": [events[-1]["item_id"]],
                  "event_timestamp": [pd.Timestamp((last + 1) * day, unit="us", tz="UTC")]}
                 ).to_parquet(entity_rows)
    summary = training_set(repo, entity_rows, "training", tmp_path / "training.parquet")
    assert "count_1d" in summary.features and "user_events" in summary.features
    (row,) = pd.read_parquet(tmp_path / "training.parquet").to_dict("records")
    own = [e for e in events if e["user_id"] == user]
    (count_7d,) = [f for f in config.aggregations[0].outputs() if f.output == "count_7d"]
    assert row["count_7d"] == reference(count_7d, own, (last + 1) * day) > 0


def _plain(value):
    """A value of a Feast join as the reference writes it: None for a missing one, a list
    for an array."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def test_bench_api_aggregations_smoke(aggregated):
    """bench_api --aggregations on the job's output (no ETL run of its own): both request
    kinds answered without an error, the user group's 12 values in each aggregation answer,
    each step's CPU per request read for the API process and Redis; 100 users' features
    and ranking inputs with the aggregations answered too."""
    from tests.test_benchmarks import _load

    result, _ = aggregated
    report = _load("bench_api").aggregations_cost(result.output, rate=20, seconds=0.5,
                                                  rounds=1)
    json.dumps(report)
    assert report["aggregation_values_per_request"] == 12
    assert report["tile_keys"] > 20  # the users, and the (user, category) pairs
    memory = report["tiles_memory"]["user_activity"]
    assert memory["keys_sampled"] == 20 and memory["bytes_per_key"] > 100
    assert memory["bytes_per_aggregation"] == round(memory["bytes_per_key"] / 12)
    for name, steps in report["steps"].items():
        assert len(steps) == 2, name
        for step in steps:
            assert step["errors"] == 0 and step["p99_ms"] >= step["p50_ms"] > 0
            assert step["api_cpu_ms_per_request"] >= 0 and step["redis_cpu_ms_per_request"] > 0
        # /proc counts in 10 ms ticks: a 10-request step may read 0, two of them not both.
        assert sum(step["api_cpu_ms_per_request"] for step in steps) > 0
    assert set(report["summary"]["aggregations_vs_views"]) == {
        "p99_ms", "api_cpu_ms_per_request", "redis_cpu_ms_per_request"}
    # 100 users' features and a ranking request with the aggregations, two steps each.
    assert {name: [step["errors"] for step in steps]
            for name, steps in report["larger"].items()} == {
        "features, 100 users": [0, 0], "ranking-inputs, 1 + 100": [0, 0],
        "model-inputs, 1 + 100": [0, 0]}


def test_pushed_events_reach_the_served_aggregations_once(aggregated, tmp_path, redis_server):
    """Events pushed through /v1/push and applied by the stream processor are in the API's
    aggregations at the request time — equal to the reference over the batch's events and
    the pushed ones (an exact duplicate once, an event before the cut left to the batch, a
    new user and a new (user, category) pair included); a batch delivered again changes
    nothing; after a replace the processor moves the streamed events to the new generation."""
    from datetime import datetime, timedelta

    from fastapi.testclient import TestClient

    from featureline.api.app import create_app
    from featureline.core.metadata import read_metadata
    from featureline.feature_store.publish import publish
    from featureline.feature_store.repo import open_repo
    from featureline.stream.processor import open_processor
    from tests.feast_data import copy_project, fresh_db

    result, config = aggregated
    output = result.output
    project = copy_project(tmp_path, ttl="3650d", stream={"archive": str(tmp_path / "archive")},
                           api={"auth": {"enabled": False}, "data": str(output),
                                "feature_cache": {"ttl_s": 0}})
    url = fresh_db(redis_server, 13)
    repo = open_repo(project.feature_store, output, url=url)
    publish(repo, progress=lambda _: None)
    processor = open_processor(project.stream, project.feature_store, output, url=url,
                               consumer="aggregations")
    cut = read_metadata(output).tiles.cut_us
    events = [{**row, "ts": _micros(row["ts"])} for row in _table(output, "state/events")]
    user = events[-1]["user_id"]
    at = datetime.fromtimestamp(cut / MICROS, timezone.utc)

    def event(user_id, item, kind, moment, category, price):
        return {"user_id": user_id, "item_id": item, "event_type": kind,
                "ts": moment.isoformat(), "value": 2.0, "category": category,
                "device": "mobile", "price": price}

    pushed = [event(user, "i1", "purchase", at + timedelta(minutes=10), "c1", 5.0),
              event(user, "i2", "view", at + timedelta(minutes=20), "c-new", 7.0),
              event("new-user", "i3", "click", at + timedelta(minutes=30), "c1", 3.0)]
    late = event(user, "i4", "view", at - timedelta(days=2), "c1", 1.0)  # before the cut
    hour = 3600 * MICROS
    app = create_app(project.serving(), output=output, redis_url=url)
    with TestClient(app) as api:
        answer = api.post("/v1/push", json={"events": [*pushed, pushed[0], late]})
        assert answer.json() == {"accepted": 5, "rejected": []}
        processor.refresh_base()
        delivered = processor.log.read(processor.consumer, 100, 0.5)
        assert processor.process(delivered) == 5
        reader = app.state.services.reader
        streamed = [{**e, "ts": _micros(datetime.fromisoformat(e["ts"]))} for e in pushed]

        def check() -> None:
            differ = []
            every = events + streamed
            for group in config.aggregations:
                outputs = group.outputs()
                rows = [(user,), ("new-user",)] if group.keys == ["user_id"] else [
                    (user, "c1"), (user, "c-new"), ("new-user", "c1")]
                entities = {k: [row[i] for row in rows] for i, k in enumerate(group.keys)}
                for offset in (hour, 2 * hour, 3 * 86_400 * MICROS):
                    reader.clock = lambda offset=offset: cut + offset
                    values = api.post("/v1/features", json={
                        "features": [f.qualified for f in outputs],
                        "entities": entities}).json()["values"]
                    for feature in outputs:
                        for row, key in enumerate(rows):
                            own = [e for e in every if tuple(e[k] for k in group.keys) == key]
                            expected = reference(feature, own, cut + offset)
                            got = values[feature.qualified][row]
                            if not _same(got, expected):
                                differ.append((feature.qualified, key, offset, got, expected))
            assert differ == [], differ[:5]

        check()
        reader.clock = lambda: cut + hour
        counted = api.post("/v1/features", json={"features": ["user_activity:count_1d"],
                                                 "entities": {"user_id": [user]}}).json()
        assert processor.process(delivered) == 5  # delivered again: added once
        check()
        reader.clock = lambda: cut + hour
        assert api.post("/v1/features", json={"features": ["user_activity:count_1d"],
                                              "entities": {"user_id": [user]}}).json(
                                                  ) == counted
        replaced = publish(repo, full=True, progress=lambda _: None)
        assert processor.refresh_base()  # the new generation: streamed keys moved to it
        assert reader.generation != replaced.generation
        check()
        assert reader.generation == replaced.generation


def test_consistency_checks_the_served_aggregations_against_the_definition(
        aggregated, tmp_path, redis_server):
    """The API logs the aggregations of the user group (/v1/features and ranking inputs,
    each at its request time); `featureline consistency` recomputes each row's values from
    the output's events and the stream's archive — the pushed events applied before the row
    only — and finds every one equal (rows read before and after the push, keys that had no
    events); without the archive the rows after the push differ."""
    import time
    from datetime import datetime, timedelta

    from fastapi.testclient import TestClient

    from featureline.api.app import create_app
    from featureline.feature_store.consistency import check_consistency
    from featureline.feature_store.publish import publish
    from featureline.feature_store.repo import open_repo
    from featureline.stream.expected import ArchivedStream
    from featureline.stream.processor import open_processor
    from tests.feast_data import copy_project, fresh_db

    result, config = aggregated
    output, log, archive = result.output, tmp_path / "log", tmp_path / "archive"
    project = copy_project(tmp_path, ttl="3650d", stream={"archive": str(archive)},
                           api={"auth": {"enabled": False}, "data": str(output),
                                "feature_cache": {"ttl_s": 0},
                                "feature_logging": {"path": str(log), "roll_s": 0.2}})
    url = fresh_db(redis_server, 12)
    publish(open_repo(project.feature_store, output, url=url), progress=lambda _: None)
    processor = open_processor(project.stream, project.feature_store, output, url=url,
                               consumer="consistency")
    events = _table(output, "state/events")
    users = sorted({e["user_id"] for e in events})[:3]
    now = datetime.now(timezone.utc)
    pushed = [{"user_id": user, "item_id": f"i{n}", "event_type": "purchase",
               "ts": (now - timedelta(minutes=5 + n)).isoformat(), "value": 1.5 + n,
               "category": "c1", "device": "mobile", "price": 4.0}
              for n, user in enumerate([*users[:2], "new-user"])]
    features = [f.qualified for f in config.aggregations[0].outputs()]
    asked = {"features": features, "entities": {"user_id": [*users, "new-user", "nobody"]}}
    # The [user_id, category] group: the pushed pair, a pair of the log, new pairs.
    logged_pair = next((e["user_id"], e["category"]) for e in events
                       if e["user_id"] == users[0] and e["category"] not in (None, "c1"))
    pairs = [(users[0], "c1"), logged_pair, ("new-user", "c1"), (users[1], "no-such-category")]
    by_pair = [f.qualified for f in config.aggregations[1].outputs()]
    asked_pairs = {"features": by_pair, "entities": {
        "user_id": [u for u, _ in pairs], "category": [c for _, c in pairs]}}
    app = create_app(project.serving(), output=output, redis_url=url)
    with TestClient(app) as api:
        before = api.post("/v1/features", json=asked).json()
        assert api.post("/v1/features", json=asked_pairs).status_code == 200
        assert api.post("/v1/push", json={"events": pushed}).json()["accepted"] == 3
        processor.refresh_base()
        assert processor.process(processor.log.read(processor.consumer, 100, 0.5)) == 3
        time.sleep(0.01)  # the requests after the batch was applied
        after = api.post("/v1/features", json=asked).json()
        pairs_after = api.post("/v1/features", json=asked_pairs).json()
        ranking = api.post("/v1/ranking-inputs", json={"user_id": users[0],
                                                        "item_ids": ["i1"]})
        assert ranking.status_code == 200
    assert after["values"]["user_activity:count_1h"][:3] == [1, 1, 0]
    assert before["values"]["user_activity:count_1h"][:3] == [0, 0, 0]
    report = check_consistency(log, output, project.feature_store,
                               expected=ArchivedStream(archive, output))
    checked = {f.feature: f for f in report.features if f.feature in features}
    assert set(checked) == set(features)
    for feature in checked.values():
        # Both requests of 5 users, and the ranking request's user row.
        assert feature.compared == 11 and feature.unsettled == 0, feature
        assert feature.mismatch == feature.missing == feature.extra == 0, feature
        # Every row of a key the stream touched: 3 before the push, 3 after, the ranking one.
        assert feature.streamed == 7, feature
    # The pairs' group: 4 rows before the push and 4 after, every one equal; the pushed
    # pairs (users[0], c1) and (new-user, c1) were streamed.
    assert pairs_after["values"]["user_category:count_1d"][2] == 1
    for name in by_pair:
        feature = {f.feature: f for f in report.features}[name]
        assert (feature.compared, feature.unsettled, feature.streamed) == (8, 0, 4), feature
        assert feature.mismatch == feature.missing == feature.extra == 0, feature
    unarchived = {f.feature: f for f in check_consistency(
        log, output, project.feature_store).features}
    # Without the archive, the 4 rows served after the push differ from the batch alone.
    assert unarchived["user_activity:count_1h"].mismatch == 4
    assert unarchived["user_activity:value_sum_all"].mismatch == 4
    # ... and the 2 pairs' rows after it; the report names a pair by its values.
    missed = unarchived["user_category:count_1d"]
    assert missed.mismatch == 2, missed
    assert {entry["entity"] for entry in missed.top} == {
        json.dumps([users[0], "c1"], separators=(",", ":")),
        json.dumps(["new-user", "c1"], separators=(",", ":"))}
