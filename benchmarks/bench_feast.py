"""Feast into Redis: materialization throughput and ``get_online_features`` latency, against
the raw Redis floor measured in the same run.

Entity tables shaped like the ETL's (``user_id`` → five features; ``item_id`` likewise) with
one snapshot per entity. Materialization: Feast's ``materialize`` of the user view, keys/s,
against redis-py writing the same number of hashes of the same size in pipelines of 10,000
(``raw_hset``), and ``featureline publish`` of both views (the user view's write alone, and
the whole command: into an empty store, then replacing what it wrote). Online: the
``ranking`` service (every user and item feature) for 1 and 100 (user, item) rows through
the Feast SDK, p50/p99, against one pipelined HMGET of the same fields in Feast's own key
layout (``raw_hmget``: the network and Redis floor, no decoding), and one MGET of the same
rows' entity vectors, decoded (``vectors``: what the API's reader reads).

    python benchmarks/bench_feast.py --entities 100000,1000000
    python benchmarks/bench_feast.py --smoke
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import redis
from feast.infra.key_encoding_utils import serialize_entity_key
from feast.infra.online_stores.helpers import _mmh3
from feast.protos.feast.types.EntityKey_pb2 import EntityKey
from feast.protos.feast.types.Value_pb2 import Value

from featureline.config import parse_config
from featureline.feature_store.publication import publication_key
from featureline.feature_store.publish import publish
from featureline.feature_store.redis_server import EmbeddedRedis
from featureline.feature_store.repo import open_repo
from featureline.feature_store.writer import vector_prefix

REPO = Path(__file__).resolve().parent.parent / "feature_store" / "feast_repo"
SNAPSHOT = datetime(2026, 1, 10, tzinfo=timezone.utc)
FEATURES = (("{e}_id_cat", "bigint"), ("{e}_events", "bigint"), ("{e}_events_7d", "bigint"),
            ("{e}_positives", "bigint"), ("{e}_positive_rate", "double"))


def write_output(root: Path, entities: int, seed: int = 0) -> Path:
    """An ETL-shaped output folder: metadata.json, one snapshot per user and per item, and
    the vocabularies of their ids."""
    rng = np.random.default_rng(seed)
    output = root / "output"
    section = {}
    for entity in ("user", "item"):
        key = f"{entity}_id"
        events = rng.integers(1, 500, entities)
        positives = rng.binomial(events, 0.2)
        columns = [events, rng.integers(0, 100, entities), positives, positives / events]
        table = pa.table({
            key: [f"{entity[0]}{i}" for i in range(entities)],
            "event_timestamp": pa.array([SNAPSHOT.replace(tzinfo=None)] * entities,
                                        pa.timestamp("us")),
            FEATURES[0][0].format(e=entity): np.arange(2, entities + 2, dtype=np.int64),
            **{name.format(e=entity): values
               for (name, _), values in zip(FEATURES[1:], columns, strict=True)},
        })
        (output / "entities" / entity).mkdir(parents=True)
        pq.write_table(table, output / "entities" / entity / "part-00000.parquet")
        vocabulary = output / "artifacts" / "categorify" / key
        vocabulary.mkdir(parents=True)
        pq.write_table(table.select([key, FEATURES[0][0].format(e=entity)])
                       .rename_columns(["value", "id"]), vocabulary / "part-00000.parquet")
        section[entity] = {
            "path": f"entities/{entity}", "join_key": key, "join_key_dtype": "string",
            "timestamp_field": "event_timestamp",
            "features": [{"name": n.format(e=entity), "dtype": t} for n, t in FEATURES]}
    (output / "metadata.json").write_text(json.dumps({"entities": section}))
    return output


def _project(root: Path) -> Any:
    repo = root / "feature_store"
    repo.mkdir(parents=True)
    (repo / "feature_store.yaml").write_text((REPO / "feature_store.yaml").read_text())
    return parse_config({"feature_store": {"repo": str(repo)}})


def _percentiles(seconds: list[float]) -> dict[str, float]:
    return {"p50_ms": round(float(np.percentile(seconds, 50)) * 1000, 3),
            "p99_ms": round(float(np.percentile(seconds, 99)) * 1000, 3)}


def raw_hset(url: str, entities: int, fields: int, batch: int = 10_000) -> float:
    """keys/s of redis-py writing ``entities`` hashes of ``fields`` serialized values."""
    client = redis.Redis.from_url(url)
    value = Value(int64_val=123).SerializeToString()
    mapping = {f"f{i}".encode(): value for i in range(fields)}
    start = time.perf_counter()
    for first in range(0, entities, batch):
        pipe = client.pipeline(transaction=False)
        for i in range(first, min(first + batch, entities)):
            pipe.hset(f"raw:{i}".encode(), mapping=mapping)
        pipe.execute()
    seconds = time.perf_counter() - start
    client.flushdb()
    return entities / seconds


def _entity_key(join_key: str, value: str) -> bytes:
    proto = EntityKey(join_keys=[join_key], entity_values=[Value(string_val=value)])
    return serialize_entity_key(proto, entity_key_serialization_version=3) + b"featureline"


def online_latency(repo: Any, entities: int, rows: int, requests: int,
                   rng: np.random.Generator) -> dict[str, Any]:
    store = repo.store
    service = store.get_feature_service("ranking")
    fields = {view.name: [_mmh3(f"{view.name}:{f.name}") for f in view.features]
              + [f"_ts:{view.name}".encode()] for view in repo.definitions.views.values()}
    client = redis.Redis.from_url(repo.redis_url)
    generation = int(client.hget(publication_key(store.project), "generation") or 0)
    sdk, raw, vectors = [], [], []
    for _ in range(requests + 1):
        ids = rng.integers(0, entities, rows)
        entity_rows = [{"user_id": f"u{i}", "item_id": f"i{j}"}
                       for i, j in zip(ids, rng.integers(0, entities, rows), strict=True)]
        start = time.perf_counter()
        store.get_online_features(features=service, entity_rows=entity_rows).to_dict()
        sdk.append(time.perf_counter() - start)
        start = time.perf_counter()
        pipe = client.pipeline(transaction=False)
        for row in entity_rows:
            pipe.hmget(_entity_key("user_id", row["user_id"]), fields["user_features"])
            pipe.hmget(_entity_key("item_id", row["item_id"]), fields["item_features"])
        answers = pipe.execute()
        raw.append(time.perf_counter() - start)
        assert all(all(v is not None for v in answer) for answer in answers)
        if generation:
            keys = [vector_prefix(store.project, generation, f"{entity}_features")
                    + _entity_key(f"{entity}_id", row[f"{entity}_id"])
                    for row in entity_rows for entity in ("user", "item")]
            start = time.perf_counter()
            decoded = [orjson.loads(vector) for vector in client.mget(keys)]
            vectors.append(time.perf_counter() - start)
            assert len(decoded) == 2 * rows
    sdk, raw = sdk[1:], raw[1:]  # the first request warms connections and caches
    features = sum(len(view.features) for view in repo.definitions.views.values())
    return {"rows": rows, "features_per_row": features, "feast_sdk": _percentiles(sdk),
            "raw_hmget": _percentiles(raw),
            "feast_p99_vs_raw": round(float(np.percentile(sdk, 99) / np.percentile(raw, 99)), 1),
            **({"vectors": _percentiles(vectors[1:]),
                "vectors_p99_vs_raw_hmget": round(float(np.percentile(vectors[1:], 99)
                                                        / np.percentile(raw, 99)), 2)}
               if vectors else {})}


def _publish(repo: Any, end: datetime) -> dict[str, Any]:
    """``featureline publish`` of both views (apply, scans, writes, stamp), timed whole and
    for the user view's write alone (what Feast's figure covers)."""
    start = time.perf_counter()
    summary = publish(repo, full=True, end=end, progress=lambda _: None)
    seconds = time.perf_counter() - start
    view = next(v for v in summary.views if v.name == "user_features")
    return {"keys": summary.keys, "seconds": round(seconds, 3),
            "keys_per_s": round(summary.keys / seconds),
            "view_keys_per_s": round(view.keys / view.seconds),
            "keys_changed": summary.keys_changed}


def run(sizes: list[int], requests: int = 200, seed: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    report: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                                          "python": platform.python_version()},
                              "materialize": [], "online": []}
    with tempfile.TemporaryDirectory() as tmp, EmbeddedRedis(Path(tmp) / "redis") as server:
        for entities in sizes:
            root = Path(tmp) / f"n{entities}"
            repo = open_repo(_project(root).feature_store, write_output(root, entities, seed),
                             url=server.url)
            repo.store.apply(repo.definitions.objects())
            window = (SNAPSHOT - timedelta(seconds=1), SNAPSHOT + timedelta(seconds=1))
            with contextlib.redirect_stdout(sys.stderr):  # Feast's progress lines
                start = time.perf_counter()
                repo.store.materialize(*window, feature_views=["user_features"])
                feast_keys_per_s = entities / (time.perf_counter() - start)
                repo.store.materialize(*window, feature_views=["item_features"])
            fields = len(FEATURES) + 1  # and the view's timestamp
            redis.Redis.from_url(server.url).flushdb()
            ours = _publish(repo, window[1])  # into an empty store
            again = _publish(repo, window[1])  # replacing it: every key compared and set
            # The same bytes as Feast's materialization (tested), and the entity vectors.
            online = [online_latency(repo, entities, rows, requests, rng) for rows in (1, 100)]
            redis.Redis.from_url(server.url).flushdb()
            raw = raw_hset(server.url, entities, fields)
            report["materialize"].append({
                "entities": entities, "feast_keys_per_s": round(feast_keys_per_s),
                "raw_hset_keys_per_s": round(raw),
                "feast_vs_raw": round(feast_keys_per_s / raw, 3),
                "publish": {"empty_store": ours, "replacing": again,
                            "view_vs_raw": round(ours["view_keys_per_s"] / raw, 3),
                            "whole_vs_raw": round(ours["keys_per_s"] / raw, 3),
                            "replacing_whole_vs_raw": round(again["keys_per_s"] / raw, 3)}})
            report["online"].append({"entities": entities, "requests": requests,
                                     "latency": online})
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entities", default="100000,1000000",
                        help="comma-separated entity counts")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--smoke", action="store_true", help="tiny run for CI")
    args = parser.parse_args(argv)
    if args.smoke:
        report = run([500], requests=5)
    else:
        report = run([int(n) for n in args.entities.split(",")], requests=args.requests)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
