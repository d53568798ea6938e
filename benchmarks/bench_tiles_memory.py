"""Redis memory of the aggregations' tiles at a million keys: what a key costs once the
server holds many of them (its hash table, allocator and key overhead included).

Each key of the user group of ``benchmarks/aggregations.yaml`` (9 values over 5 windows)
holds the events of one user of the sample log generator (``etl.datagen``: Zipf-active
users in sessions, ``--events`` per user over the ``--days`` before the cut, as ``bench_api.py
--aggregations`` generates them), folded into its tiles by the engine
(``core.aggregations.tiles``), only the tiles a window can still reach at the cut kept, and
written as publish writes them (one string per key, ``feature_store/tiles.py``) into an
embedded Redis, pipelined. Reported: the server's ``used_memory`` grown per key and per
aggregation at the full count (the figure to size a server by) beside ``MEMORY USAGE`` of a
sample of keys (the key's own bytes), and the growth per key after the first ``--small``
keys: the overhead that only shows at scale.

    python benchmarks/bench_tiles_memory.py                  # 1,000,000 keys
    python benchmarks/bench_tiles_memory.py --entity-table   # the user table's group instead
    python benchmarks/bench_tiles_memory.py --model-inputs inputs_pair   # the (user, item) pairs
    python benchmarks/bench_tiles_memory.py --keys 20000 --distinct 2000   # the smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from featureline.config import parse_config
from featureline.core.aggregations import (
    MICROS,
    GroupSpec,
    entity_group,
    event_filter,
    event_value,
    tiles,
)
from featureline.core.events import labeler, micros_of, parse_timestamp
from featureline.etl.config import EntitiesConfig
from featureline.etl.datagen import generate_events
from featureline.feature_store.redis_server import EmbeddedRedis
from featureline.feature_store.tiles import encode_key_tiles, tile_key, tiles_prefix

SPEC = Path(__file__).with_name("aggregations.yaml")
# Users generated at a time (about half have events: a key each).
BATCH_USERS = 10_000
# Keys per pipelined write.
WRITE_BATCH = 10_000


def _group(entity_table: bool = False, model_inputs: str | None = None) -> GroupSpec:
    """The spec's user group, the user table's (its four features), or one of the model
    inputs' groups of the default features (``inputs_user``, ``inputs_pair``, ``inputs_item``)."""
    if entity_table:
        return entity_group("user", EntitiesConfig().recent_days)
    if model_inputs:
        from featureline.etl.features.pipeline import FeaturePipeline

        inputs = FeaturePipeline(parse_config({}).etl).inputs()
        return next(g for g in inputs.groups if g.name == model_inputs)
    groups = yaml.safe_load(SPEC.read_text())["aggregations"]
    return GroupSpec.model_validate(next(g for g in groups if g["keys"] == ["user_id"]))


def _key_tiles(group: GroupSpec, keeps: dict[str, Any], events: list[tuple[int, dict]],
               cut: int) -> bytes:
    features = {f.output: f for f in group.outputs()}
    by_output = {}
    for output, feature in features.items():
        kept = [(ts, event_value(feature.spec, event)) for ts, event in events
                if keeps[output] is None or keeps[output](event)]
        held = tiles(feature.operation(), feature.window, kept)
        start = feature.window.start(cut)
        by_output[output] = {tile: partial for tile, partial in held.items()
                             if start is None or tile >= start}
    return encode_key_tiles(features, by_output)


def _key(group: GroupSpec, n: int) -> bytes:
    """The ``n``-th key of the group, as publish names it (``u<n>``, ``i<n>``)."""
    return tile_key([f"{key[0]}{n}" for key in group.keys])


def _used(client: Any) -> int:
    return int(client.info("memory")["used_memory"])


def run(keys: int = 1_000_000, small: int = 10_000, events: int = 20, days: int = 30,
        distinct: int = 50_000, sample: int = 2_000, seed: int = 1,
        entity_table: bool = False, model_inputs: str | None = None) -> dict[str, Any]:
    """``distinct``: keys whose tiles are folded; the others repeat their values in turn
    (Redis's memory depends on the values' sizes, which that sample spreads as the
    generator does)."""
    import redis as redis_py

    group = _group(entity_table, model_inputs)
    contract = parse_config({}).etl.event_contract()
    label = labeler(contract)
    keeps = {f.output: event_filter(f.spec, contract) for f in group.outputs()}
    values = len(group.outputs())
    cut = int(time.time()) * MICROS
    start = datetime.fromtimestamp(cut / MICROS - days * 86_400, timezone.utc)
    prefix = tiles_prefix("bench", 1, group.name)
    report: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version()},
        "group": group.name, "aggregations": values, "events_per_user": events,
        "days": days}
    blobs: list[bytes] = []
    batch, events_seen = 0, 0
    started = time.perf_counter()
    while len(blobs) < min(keys, distinct):
        # The generator's Zipf-active users: about half of them have events.
        log = generate_events(BATCH_USERS * events, BATCH_USERS, BATCH_USERS // 4, days,
                              seed=seed + batch, start=start)
        by_key: dict[tuple[str, ...], list[tuple[int, dict[str, Any]]]] = {}
        for event in log.to_dict("records"):
            moment = parse_timestamp(event["ts"], "auto")
            key = group.key_of(event)
            assert moment is not None and key is not None
            by_key.setdefault(key, []).append(
                (micros_of(moment), {**event, "label": int(label(event))}))
        # By id, which the generator draws apart from how active a key is.
        for key in sorted(by_key)[:min(keys, distinct) - len(blobs)]:
            own = by_key[key]
            blobs.append(_key_tiles(group, keeps, own, cut))
            events_seen += len(own)
        batch += 1
    report["fold_s"] = round(time.perf_counter() - started, 1)
    with tempfile.TemporaryDirectory() as tmp, EmbeddedRedis(Path(tmp) / "redis") as redis:
        client = redis_py.Redis.from_url(redis.url)
        before = _used(client)
        started = time.perf_counter()
        blob_bytes = 0
        for low in range(0, keys, WRITE_BATCH):
            pipe = client.pipeline(transaction=False)
            for n in range(low, min(keys, low + WRITE_BATCH)):
                blob = blobs[n % len(blobs)]
                blob_bytes += len(blob)
                pipe.set(prefix + _key(group, n), blob)
            pipe.execute()
            if low + WRITE_BATCH == small:
                report["small"] = {"keys": small, "used_memory_per_key": round(
                    (_used(client) - before) / small)}
        report["write_s"] = round(time.perf_counter() - started, 1)
        grown = _used(client) - before
        per_key = grown / keys
        assert client.dbsize() == keys
        # Keys of distinct values (the first ones: each holds another key's tiles).
        usage = [client.memory_usage(prefix + _key(group, n), samples=0) or 0
                 for n in range(min(sample, len(blobs)))]
        report["full"] = {
            "keys": keys, "distinct_values": len(blobs),
            "events_per_key": round(events_seen / len(blobs), 1),
            "used_memory_bytes": grown, "used_memory_per_key": round(per_key),
            "used_memory_per_aggregation": round(per_key / values),
            "memory_usage_per_key": round(float(np.mean(usage))),
            "memory_usage_per_key_p99": round(float(np.percentile(usage, 99))),
            "value_bytes_per_key": round(blob_bytes / keys)}
        client.close()
    if "small" in report:
        report["full_vs_small_per_key"] = round(
            report["full"]["used_memory_per_key"] / report["small"]["used_memory_per_key"], 3)
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--small", type=int, default=10_000,
                        help="also report the growth per key after this many keys "
                             "(a multiple of 10,000)")
    parser.add_argument("--distinct", type=int, default=50_000,
                        help="keys whose tiles are folded; the others repeat their values")
    parser.add_argument("--events", type=int, default=20, help="events per key")
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--entity-table", action="store_true",
                        help="the user table's group (what the stream keeps) instead")
    parser.add_argument("--model-inputs", choices=["inputs_user", "inputs_pair", "inputs_item"],
                        help="one of the model inputs' groups of the default features")
    args = parser.parse_args(argv)
    print(json.dumps(run(args.keys, args.small, args.events, args.days, args.distinct,
                         entity_table=args.entity_table, model_inputs=args.model_inputs),
                     indent=2))


if __name__ == "__main__":
    main()
