"""A hand-made ETL output (metadata.json, entities/, vocabularies) and a copy of the Feast
repository, for the feature store and API tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import redis

from featureline.config import FeaturelineConfig, parse_config
from featureline.feature_store.repo import copy_packaged_repo

REPO = Path(__file__).resolve().parent.parent

# Hand-made snapshots: (key, snapshot time, events). A snapshot at D counts events before D.
USER_SNAPSHOTS = [("u1", "2026-01-02", 1), ("u1", "2026-01-05", 3), ("u1", "2026-01-10", 7),
                  ("u2", "2026-01-03", 2)]
ITEM_SNAPSHOTS = [("i1", "2026-01-02", 5), ("i2", "2026-01-06", 9)]


def encoded_id(raw: str) -> int:
    """The vocabulary of the hand-made output: u1 → 3, i2 → 4 (ids 0 and 1 are reserved)."""
    return 2 + int(raw[1:])


def _write_entity(output: Path, entity: str, rows: list[tuple[str, str, int]]) -> dict:
    key = f"{entity}_id"
    table = pa.table({
        key: [r[0] for r in rows],
        "event_timestamp": pa.array([pd.Timestamp(r[1]) for r in rows], pa.timestamp("us")),
        f"{key}_cat": pa.array([encoded_id(r[0]) for r in rows], pa.int64()),
        f"{entity}_events": pa.array([r[2] for r in rows], pa.int64()),
        f"{entity}_positive_rate": pa.array([r[2] / 10 for r in rows], pa.float64()),
    })
    (output / "entities" / entity).mkdir(parents=True)
    pq.write_table(table, output / "entities" / entity / "part-00000.parquet")
    raw = sorted({r[0] for r in rows})
    vocabulary = pa.table({"value": raw, "id": pa.array([encoded_id(v) for v in raw],
                                                        pa.int64())})
    (output / "artifacts" / "categorify" / key).mkdir(parents=True)
    pq.write_table(vocabulary, output / "artifacts" / "categorify" / key / "part-0.parquet")
    return {"path": f"entities/{entity}", "join_key": key, "join_key_dtype": "string",
            "timestamp_field": "event_timestamp",
            "features": [{"name": f"{key}_cat", "dtype": "bigint"},
                         {"name": f"{entity}_events", "dtype": "bigint"},
                         {"name": f"{entity}_positive_rate", "dtype": "double"}]}


def write_handmade_output(output: Path) -> Path:
    """An ETL output folder written by hand: metadata.json, entities/ and vocabularies."""
    entities = {"user": _write_entity(output, "user", USER_SNAPSHOTS),
                "item": _write_entity(output, "item", ITEM_SNAPSHOTS)}
    (output / "metadata.json").write_text(json.dumps({"entities": entities,
                                                      "config_hash": "test"}))
    return output


def copy_project(root: Path, ttl: str = "3d", redis_type: str = "redis",
                 **sections: Any) -> FeaturelineConfig:
    """A copy of the Feast repository under root (its registry lands there too)."""
    repo = copy_packaged_repo(root / "project" / "feature_store")
    return parse_config({"feature_store": {"repo": str(repo), "ttl": ttl,
                                           "redis_dir": str(root / "redis"),
                                           "redis_type": redis_type}, **sections})


def fresh_db(server: Any, db: int) -> str:
    """A Redis database of the shared test server, emptied: each test its own."""
    url = server.url.rsplit("/", 1)[0] + f"/{db}"
    redis.Redis.from_url(url).flushdb()
    return url
