"""Publishing at scale: the user view of ``featureline publish`` written by one process and by
Spark tasks (``publish --spark``, ``local[2]``), against redis-py writing the same number of
hashes in pipelines (the raw floor) and Feast's own Spark materialization engine, in one run.

Entity tables as in ``bench_feast.py`` (one snapshot per entity, five features). Each path
writes into an emptied database of one embedded Redis server; keys/s of the user view.

    python benchmarks/bench_publish.py --entities 1000000,10000000
    python benchmarks/bench_publish.py --smoke
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
from datetime import timedelta
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import redis
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_feast import SNAPSHOT, _project, raw_hset, write_output

from featureline.config import parse_config
from featureline.etl.config import SparkSettings
from featureline.etl.session import build_session
from featureline.feature_store.online_store import open_online_store
from featureline.feature_store.redis_server import EmbeddedRedis
from featureline.feature_store.repo import open_repo
from featureline.feature_store.spark_writer import write_with_spark
from featureline.feature_store.writer import Layout, latest_snapshots

BENCH_SPARK = SparkSettings(master="local[2]", properties={
    "spark.sql.shuffle.partitions": "8", "spark.driver.memory": "6g",
    "spark.ui.enabled": "false"})
VIEW = "user_features"
# Feast's engine writes ~10k keys/s here: measured up to this size.
FEAST_ENGINE_MAX = 1_000_000


def _feast_spark_engine(root: Path, output: Path, url: str, window: tuple[Any, Any],
                        entities: int) -> dict[str, Any]:
    """Feast's Spark compute engine materializing the user view (its Spark offline store)."""
    repo_dir = root / "feature_store"
    spec = yaml.safe_load((Path(__file__).resolve().parent.parent / "feature_store" /
                           "feast_repo" / "feature_store.spark.yaml").read_text())
    spec["offline_store"]["spark_conf"]["spark.master"] = "local[2]"
    spec["batch_engine"] = {"type": "spark.engine", "partitions": 8}
    (repo_dir / "feature_store.spark.yaml").write_text(yaml.safe_dump(spec))
    config = parse_config({"feature_store": {"repo": str(repo_dir), "offline_store": "spark"}})
    try:
        repo = open_repo(config.feature_store, output, url=url)
        repo.store.apply(repo.definitions.objects())
        start = time.perf_counter()
        with contextlib.redirect_stdout(sys.stderr):
            repo.store.materialize(*window, feature_views=[VIEW])
        seconds = time.perf_counter() - start
        written = sum(1 for _ in redis.Redis.from_url(url).scan_iter(count=10_000))
        return {"keys_per_s": round(entities / seconds), "seconds": round(seconds, 2),
                "keys_in_redis": written}
    except Exception as error:
        return {"error": f"{type(error).__name__}: {str(error)[:300]}"}


def measure(spark: Any, server: EmbeddedRedis, root: Path, entities: int,
            feast_engine: bool) -> dict[str, Any]:
    output = write_output(root, entities)
    repo = open_repo(_project(root).feature_store, output, url=server.url)
    repo.store.apply(repo.definitions.objects())
    store = repo.store
    layout = Layout.of(store.get_feature_view(VIEW), "user_id",
                       repo.definitions.entities["user"].value_type, store.project,
                       store.config.entity_key_serialization_version)
    window = (SNAPSHOT - timedelta(seconds=1), SNAPSHOT + timedelta(seconds=1))
    path = repo.definitions.snapshot_path("user")
    client = redis.Redis.from_url(server.url)

    client.flushdb()
    start = time.perf_counter()
    rows = latest_snapshots(ds.dataset(path, format="parquet"), "user_id",
                            layout.timestamp_field, *window)
    single = open_online_store("redis", server.url).write_view(rows, layout)
    single_s = time.perf_counter() - start

    client.flushdb()
    start = time.perf_counter()
    parallel = write_with_spark(spark, path, layout, *window, "redis", server.url,
                                keys_needed=False)
    spark_s = time.perf_counter() - start
    assert parallel.keys == single.keys == entities

    client.flushdb()
    raw = raw_hset(server.url, entities, len(layout.features) + 1)
    result = {"entities": entities,
              "single_process_keys_per_s": round(entities / single_s),
              "spark_local2_keys_per_s": round(entities / spark_s),
              "raw_hset_keys_per_s": round(raw),
              "single_vs_raw": round(entities / single_s / raw, 3),
              "spark_vs_raw": round(entities / spark_s / raw, 3),
              "spark_vs_single": round(single_s / spark_s, 3)}
    if feast_engine and entities <= FEAST_ENGINE_MAX:
        client.flushdb()
        result["feast_spark_engine"] = _feast_spark_engine(root, output, server.url, window,
                                                           entities)
    client.flushdb()
    return result


def run(sizes: list[int], spark: Any = None, feast_engine: bool = True) -> dict[str, Any]:
    spark = spark or build_session(BENCH_SPARK)
    runs = []
    with tempfile.TemporaryDirectory() as tmp, EmbeddedRedis(Path(tmp) / "redis") as server:
        for entities in sizes:
            runs.append(measure(spark, server, Path(tmp) / f"n{entities}", entities,
                                feast_engine))
            print(json.dumps(runs[-1]), file=sys.stderr, flush=True)  # kept if a later size fails
    return {"benchmark": "publish",
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                        "python": platform.python_version(),
                        "spark_master": spark.sparkContext.master},
            "runs": runs}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entities", default="1000000,10000000")
    parser.add_argument("--no-feast-engine", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="tiny run for CI")
    args = parser.parse_args(argv)
    sizes = [2000] if args.smoke else [int(n) for n in args.entities.split(",")]
    print(json.dumps(run(sizes, feast_engine=not args.no_feast_engine), indent=2))


if __name__ == "__main__":
    main()
