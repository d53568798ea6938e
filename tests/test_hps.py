"""The parameter server on real RocksDB: exactness, the cascade, eviction, files."""

from __future__ import annotations

import json
import sys
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from featureline.core.errors import ConfigError
from featureline.hps import ParameterServer
from featureline.hps.cache import GpuCache, HostCache, gpu_available
from featureline.hps.config import HpsConfig, load_hps_config
from featureline.hps.errors import (
    PersistentStoreError,
    TableFileError,
    UnknownModelError,
    UnknownTableError,
)
from featureline.hps.formats import read_hugectr, read_npy, read_parquet, write_hugectr
from featureline.hps.slots import SlotIndex

DIM = 8


def _table(n: int = 1000, dim: int = DIM, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    keys = rng.choice(10**12, size=n, replace=False).astype(np.int64)
    return keys, rng.standard_normal((n, dim)).astype(np.float32)


def _server(tmp_path, keys, vectors, **overrides) -> ParameterServer:
    write_hugectr(tmp_path / "model" / "items", keys, vectors)
    model = {"name": "ranker", "cache_fraction": overrides.pop("cache_fraction", 0.5),
             "tables": [{"name": "items", "dim": DIM, "source": str(tmp_path / "model" / "items"),
                         "default_value": 0.5}]}
    config = {"models": [model], "persistent_db": {"path": str(tmp_path / "rocks")},
              "cache_device": "cpu", **overrides}
    return ParameterServer(HpsConfig.model_validate(config))


def test_every_vector_equals_its_source_row_and_unknown_keys_get_the_default(tmp_path):
    keys, vectors = _table()
    server = _server(tmp_path, keys, vectors)
    order = np.random.default_rng(1).permutation(len(keys))
    request = np.concatenate([keys[order], keys[:10], [-5, 7]])  # duplicates and unknowns
    for _ in range(2):  # cold (from RocksDB), then warm (from the caches)
        got = server.lookup("ranker", "items", request)
        np.testing.assert_array_equal(got[: len(keys)], vectors[order])
        np.testing.assert_array_equal(got[len(keys):-2], vectors[:10])
        assert (got[-2:] == 0.5).all()
    server.close()


def test_the_cascade_with_small_tiers(tmp_path):
    keys, vectors = _table(n=400)
    server = _server(tmp_path, keys, vectors, cache_fraction=0.05,
                     volatile_db={"capacity": 100, "overflow_policy": "evict_oldest"})
    table = server.table("ranker", "items")
    assert table.cache.capacity == 20
    first = keys[:20]
    server.lookup("ranker", "items", first)
    assert table.stats.answered == {"l1": 0, "l2": 0, "l3": 20, "default": 0}
    server.lookup("ranker", "items", first)
    assert table.stats.answered["l1"] == 20
    # 200 more keys: the cache and the hash map overflow, the answers stay exact.
    got = server.lookup("ranker", "items", keys[20:220])
    np.testing.assert_array_equal(got, vectors[20:220])
    assert len(table.cache) == 20 and server.volatile.size(table.cache_key) == 100
    # The first keys were evicted from L1 and L2 (oldest first): back from RocksDB.
    before = table.stats.answered["l3"]
    np.testing.assert_array_equal(server.lookup("ranker", "items", first), vectors[:20])
    assert table.stats.answered["l3"] == before + 20
    stats = server.stats()["ranker"]["items"]
    assert stats["keys"] == 400 and sum(stats["latency_counts"]) == stats["lookups"] == 4
    server.close()


def test_initial_cache_rate_fills_the_volatile_store(tmp_path):
    keys, vectors = _table(n=100)
    server = _server(tmp_path, keys, vectors, volatile_db={"initial_cache_rate": 0.3})
    table = server.table("ranker", "items")
    assert server.volatile.size(table.cache_key) == 30
    server.lookup("ranker", "items", keys[:30])
    assert table.stats.answered["l2"] == 30
    server.close()


def test_rocksdb_keeps_the_tables_across_restarts(tmp_path):
    keys, vectors = _table(n=50)
    _server(tmp_path, keys, vectors).close()
    config = HpsConfig.model_validate({
        "models": [{"name": "ranker", "tables": [{"name": "items", "dim": DIM}]}],
        "persistent_db": {"path": str(tmp_path / "rocks")}, "cache_device": "cpu"})
    server = ParameterServer(config)
    np.testing.assert_array_equal(server.lookup("ranker", "items", keys), vectors)
    server.close()


def test_unknown_model_and_table(tmp_path):
    keys, vectors = _table(n=10)
    server = _server(tmp_path, keys, vectors)
    with pytest.raises(UnknownModelError, match="'nope'"):
        server.lookup("nope", "items", keys)
    with pytest.raises(UnknownTableError, match="no table 'users'"):
        server.lookup("ranker", "users", keys)
    server.close()


def test_concurrent_lookups_never_mix_vectors(tmp_path):
    keys, vectors = _table(n=2000)
    server = _server(tmp_path, keys, vectors, cache_fraction=0.05,
                     volatile_db={"capacity": 300})
    errors: list[str] = []

    def reader(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(30):
            pick = rng.integers(0, len(keys), 256)
            if not np.array_equal(server.lookup("ranker", "items", keys[pick]), vectors[pick]):
                errors.append(f"thread {seed}")

    threads = [threading.Thread(target=reader, args=(s,)) for s in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    server.close()


def test_hugectr_round_trip_and_other_formats(tmp_path):
    keys, vectors = _table(n=30)
    write_hugectr(tmp_path / "sparse", keys, vectors)
    assert (tmp_path / "sparse" / "key").stat().st_size == 30 * 8
    got_keys, got_vectors = read_hugectr(tmp_path / "sparse", DIM)
    np.testing.assert_array_equal(got_keys, keys)
    np.testing.assert_array_equal(got_vectors, vectors)
    np.save(tmp_path / "k.npy", keys)
    np.save(tmp_path / "v.npy", vectors)
    np.testing.assert_array_equal(read_npy(tmp_path / "k.npy", tmp_path / "v.npy", DIM)[1],
                                  vectors)
    pq.write_table(pa.table({"key": keys, "vector": list(vectors)}), tmp_path / "t.parquet")
    np.testing.assert_array_equal(read_parquet(tmp_path / "t.parquet", DIM)[0], keys)



def test_a_failed_or_killed_hugectr_export_leaves_nothing_behind(tmp_path):
    keys, vectors = _table(n=10)
    folder = tmp_path / "items"
    write_hugectr(folder, keys, vectors)
    (tmp_path / ".items.staging-0123456789ab").mkdir()  # what a killed export left
    with pytest.raises(ValueError):  # fails after the keys file is written
        write_hugectr(folder, keys[::-1], np.array([["not a number"]] * 10))
    assert sorted(p.name for p in tmp_path.iterdir()) == [".items.lock", "items"]
    got_keys, got_vectors = read_hugectr(folder, DIM)  # the previous table, whole
    np.testing.assert_array_equal(got_keys, keys)
    np.testing.assert_array_equal(got_vectors, vectors)

def test_bad_files_name_the_file(tmp_path):
    keys, vectors = _table(n=10)
    folder = tmp_path / "sparse"
    write_hugectr(folder, keys, vectors)
    with pytest.raises(TableFileError, match=r"emb_vector: .* is not a whole number"):
        read_hugectr(folder, 7)
    with pytest.raises(TableFileError, match="10 keys but 5 vectors"):
        read_hugectr(folder, 16)
    (folder / "key").write_bytes((folder / "key").read_bytes()[:-3])
    with pytest.raises(TableFileError, match="key: 77 bytes"):
        read_hugectr(folder, DIM)
    write_hugectr(folder, np.array([1, 1, 2]), np.zeros((3, DIM), np.float32))
    with pytest.raises(TableFileError, match=r"duplicate keys, e.g. \[1\]"):
        read_hugectr(folder, DIM)
    write_hugectr(folder, np.array([], np.int64), np.zeros((0, DIM), np.float32))
    with pytest.raises(TableFileError, match="empty"):
        read_hugectr(folder, DIM)
    with pytest.raises(TableFileError, match="missing"):
        read_hugectr(tmp_path / "nowhere", DIM)


@pytest.mark.parametrize(("policy", "survivor"), [("evict_oldest", 3), ("evict_least_used", 1)])
def test_overflow_policies(policy, survivor):
    index = SlotIndex(3, policy)
    index.assign(np.array([1, 2, 3]))
    for _ in range(3):
        index.find(np.array([1]))  # key 1 is the most used
    index.assign(np.array([4, 5]))  # two must go
    held = {k for k in (1, 2, 3, 4, 5) if index.find(np.array([k]))[0] >= 0}
    assert {4, 5} <= held and survivor in held and len(held) == 3


def test_slots_are_handed_out_in_order_and_reused_last_freed_first():
    index = SlotIndex(10_000_000)  # the default L2 capacity: no per-slot Python objects
    assert index.assign(np.array([7, 8, 9])).tolist() == [0, 1, 2]
    assert sum(sys.getsizeof(v) for v in vars(index).values()
               if not isinstance(v, np.ndarray)) < 10_000
    small = SlotIndex(3)
    small.assign(np.array([1, 2, 3]))
    assert small.assign(np.array([4])).tolist() == [0]  # the oldest (1) gave its slot
    assert small.assign(np.array([5, 6])).tolist() == [2, 1]  # 2 and 3 gave theirs, last first
    assert small.find(np.array([1, 2, 3, 4, 5, 6])).tolist() == [-1, -1, -1, 0, 2, 1]


def test_config_file_and_errors(tmp_path):
    path = tmp_path / "hps.yaml"
    path.write_text("hps:\n  models:\n    - name: m\n      tables: [{name: t, dim: 4}]\n")
    assert load_hps_config(path).models[0].tables[0].dim == 4
    path.write_text("hps:\n  models:\n    - name: m\n      tables: [{name: t, dim: 0}]\n")
    with pytest.raises(Exception, match=r"hps\.models\[0\]\.tables\[0\]\.dim"):
        load_hps_config(path)


def test_host_cache_is_the_fallback_without_a_gpu():
    assert isinstance(HostCache(4, 2), HostCache)
    if not gpu_available():
        from featureline.hps.cache import make_cache

        assert make_cache(4, 2).device == "cpu"


@pytest.mark.gpu
def test_gpu_cache_matches_host_cache():
    keys, vectors = _table(n=500)
    gpu, host = GpuCache(200, DIM), HostCache(200, DIM)
    for cache in (gpu, host):
        cache.insert(keys[:300], vectors[:300])
    for (hit_a, got_a), (hit_b, got_b) in [(gpu.lookup(keys), host.lookup(keys))]:
        np.testing.assert_array_equal(hit_a, hit_b)
        np.testing.assert_array_equal(got_a, got_b)
        assert 0 < hit_a.sum() < len(keys)  # both hits and misses (zero rows) were compared
        assert not got_a[~hit_a].any()
    held = keys[:300][host.lookup(keys[:300])[0]]
    for cache in (gpu, host):
        cache.refresh(held[:50], -vectors[:50])
    hit, got = gpu.lookup(held)
    assert hit.all()
    np.testing.assert_array_equal(got, host.lookup(held)[1])
    np.testing.assert_array_equal(got[:50], -vectors[:50])
    np.testing.assert_array_equal(gpu.lookup(keys[:0])[1].shape, (0, DIM))


@pytest.mark.parametrize(("threshold", "mode"), [(1.0, "sync"), (0.0, "async")])
def test_sync_and_async_insertion(tmp_path, threshold, mode):
    keys, vectors = _table(n=100)
    write_hugectr(tmp_path / "items", keys, vectors)
    server = ParameterServer(HpsConfig.model_validate({
        "models": [{"name": "m", "hit_rate_threshold": threshold,
                    "tables": [{"name": "items", "dim": DIM, "source": str(tmp_path / "items")}]}],
        "persistent_db": {"path": str(tmp_path / "rocks")}, "cache_device": "cpu"}))
    table = server.table("m", "items")
    # The request is answered from RocksDB either way; only when the upper tiers fill differs.
    np.testing.assert_array_equal(server.lookup("m", "items", keys[:10]), vectors[:10])
    assert table.stats.insertions == {"sync": int(mode == "sync"), "async": int(mode == "async")}
    server.wait_for_insertions()
    np.testing.assert_array_equal(server.lookup("m", "items", keys[:10]), vectors[:10])
    assert table.stats.answered["l1"] == 10
    server.close()


def test_hugectr_ps_json(tmp_path, caplog):
    import json

    from featureline.core.errors import ConfigError

    keys, vectors = _table(n=20)
    write_hugectr(tmp_path / "wdl0_sparse_2000.model", keys, vectors)
    ps = {
        "supportlonglong": True,
        "volatile_db": {"type": "parallel_hash_map", "initial_cache_rate": 0.5,
                        "overflow_policy": "evict_random", "num_partitions": 8},
        "persistent_db": {"type": "rocks_db", "path": str(tmp_path / "rocks")},
        "models": [{"model": "wdl", "sparse_files": [str(tmp_path / "wdl0_sparse_2000.model")],
                    "embedding_table_names": ["sparse_embedding1"],
                    "embedding_vecsize_per_table": [DIM], "default_value_for_each_table": [0.25],
                    "gpucacheper": 0.3, "hit_rate_threshold": 0.8, "max_batch_size": 64,
                    "deployed_device_list": [0]}],
    }
    path = tmp_path / "ps.json"
    path.write_text(json.dumps(ps))
    with caplog.at_level("WARNING", logger="featureline.hps"):
        config = load_hps_config(path)
    assert "models[0].max_batch_size: configures HugeCTR's inference engine" in caplog.text
    assert "volatile_db.num_partitions: unknown field" in caplog.text
    model = config.models[0]
    assert (model.name, model.cache_fraction, model.hit_rate_threshold) == ("wdl", 0.3, 0.8)
    assert config.volatile_db.overflow_policy == "evict_random"
    server = ParameterServer(config)
    got = server.lookup("wdl", "sparse_embedding1", [keys[3], 12345])
    np.testing.assert_array_equal(got[0], vectors[3])
    assert (got[1] == 0.25).all()
    server.close()
    ps["volatile_db"] = {"type": "redis_cluster", "address": "10.0.0.1:7000,10.0.0.2:7000"}
    path.write_text(json.dumps(ps))
    volatile = load_hps_config(path).volatile_db
    assert (volatile.type, volatile.url) == ("redis_cluster", "redis://10.0.0.1:7000")
    ps["volatile_db"]["type"] = "multi_process_hash_map"
    path.write_text(json.dumps(ps))
    with pytest.raises(ConfigError) as info:
        load_hps_config(path)
    assert info.value.key == "volatile_db.type"


def _redis_server_config(tmp_path, url, kind="redis", **volatile):
    keys, vectors = _table(n=300)
    write_hugectr(tmp_path / "items", keys, vectors)
    config = HpsConfig.model_validate({
        "models": [{"name": "m", "cache_fraction": 0.05,
                    "tables": [{"name": "items", "dim": DIM, "source": str(tmp_path / "items")}]}],
        "volatile_db": {"type": kind, "url": url, **volatile},
        "persistent_db": {"path": str(tmp_path / "rocks")}, "cache_device": "cpu"})
    return keys, vectors, config


@pytest.mark.parametrize("policy", ["evict_oldest", "evict_random", "evict_least_used"])
def test_redis_cluster_volatile_store(tmp_path, redis_cluster, policy):
    """The L2 in a real 3-node Redis Cluster: keys spread over every node, exact vectors,
    the capacity kept."""
    from redis.cluster import RedisCluster

    client = RedisCluster.from_url(redis_cluster.url)
    client.flushall()
    keys, vectors, config = _redis_server_config(
        tmp_path, redis_cluster.url, kind="redis_cluster", capacity=120,
        overflow_policy=policy, initial_cache_rate=0.2)
    server = ParameterServer(config)
    table = server.table("m", "items")
    assert server.volatile.size(table.cache_key) == 60
    np.testing.assert_array_equal(server.lookup("m", "items", keys[:60]), vectors[:60])
    assert table.stats.answered["l2"] == 60
    np.testing.assert_array_equal(server.lookup("m", "items", keys), vectors)  # overflow
    assert server.volatile.size(table.cache_key) == 120
    stored = client.keys(f"hps:{table.cache_key}:*", target_nodes=RedisCluster.ALL_NODES)
    assert len(stored) == 120
    per_node = [node.redis_connection.dbsize() for node in client.get_primaries()]
    assert len(per_node) == 3 and min(per_node) > 0, per_node
    server.close()


@pytest.mark.parametrize("policy", ["evict_oldest", "evict_random", "evict_least_used"])
def test_redis_volatile_store(tmp_path, redis_server, policy):
    import redis

    redis.Redis.from_url(redis_server.url).flushdb()
    keys, vectors, config = _redis_server_config(
        tmp_path, redis_server.url, capacity=50, overflow_policy=policy,
        initial_cache_rate=0.1)
    server = ParameterServer(config)
    table = server.table("m", "items")
    assert server.volatile.size(table.cache_key) == 30
    np.testing.assert_array_equal(server.lookup("m", "items", keys[:30]), vectors[:30])
    assert table.stats.answered["l2"] == 30
    np.testing.assert_array_equal(server.lookup("m", "items", keys), vectors)  # overflow
    assert server.volatile.size(table.cache_key) == 50
    client = redis.Redis.from_url(redis_server.url)
    assert len(client.keys(f"hps:{table.cache_key}:*")) == 50  # the vectors only
    assert client.zcard(f"hps:{table.cache_key}#order") == 50
    server.close()



def test_two_widths_of_a_table_share_one_l2_without_mixing(tmp_path, redis_server):
    """A rollout after the embedding plan widened a table: processes on the old and the new
    width share the L2 Redis, each reading its own vectors from it."""
    servers, tables = [], []
    for width in (DIM, 2 * DIM):
        keys, vectors = _table(n=100)[0], _table(n=100, dim=width, seed=width)[1]
        write_hugectr(tmp_path / f"items{width}", keys, vectors)
        config = HpsConfig.model_validate({
            "models": [{"name": f"m-{tmp_path.name}", "cache_fraction": 0.05, "tables": [
                {"name": "items", "dim": width, "source": str(tmp_path / f"items{width}")}]}],
            "volatile_db": {"type": "redis", "url": redis_server.url,
                            "initial_cache_rate": 1.0},
            "persistent_db": {"path": str(tmp_path / f"rocks{width}")}, "cache_device": "cpu"})
        servers.append(ParameterServer(config))
        tables.append((keys, vectors))
    for server, (keys, vectors) in zip(servers, tables, strict=True):
        np.testing.assert_array_equal(server.lookup(f"m-{tmp_path.name}", "items", keys),
                                      vectors)
        assert server.table(f"m-{tmp_path.name}", "items").stats.answered["l2"] == 100
        server.close()

def test_redis_down_falls_through_to_rocksdb(tmp_path):
    from featureline.feature_store.redis_server import EmbeddedRedis

    with EmbeddedRedis(tmp_path / "redis") as redis_server:
        keys, vectors, config = _redis_server_config(tmp_path, redis_server.url)
        server = ParameterServer(config)
        server.lookup("m", "items", keys[:5])
    # The server is gone: answers still come, from RocksDB, and the outage is counted.
    np.testing.assert_array_equal(server.lookup("m", "items", keys[100:110]), vectors[100:110])
    assert server.volatile.unavailable > 0
    server.close()


def _updatable_server(tmp_path, n=200):
    keys, vectors = _table(n=n)
    write_hugectr(tmp_path / "items", keys, vectors)
    config = HpsConfig.model_validate({
        "models": [{"name": "m", "cache_fraction": 0.5,
                    "tables": [{"name": "items", "dim": DIM, "source": str(tmp_path / "items")}]}],
        "persistent_db": {"path": str(tmp_path / "rocks")}, "cache_device": "cpu"})
    return keys, vectors, ParameterServer(config)


def _server_with_own_stream(tmp_path, n=200):
    """An updatable server whose model has a name (so an update stream) of this test's own."""
    keys, vectors, server = _updatable_server(tmp_path, n=n)
    model = f"m-{tmp_path.name}"
    server.tables[model] = server.tables.pop("m")
    return keys, vectors, server, model


def test_published_updates_reach_every_tier(tmp_path, redis_server):
    from featureline.hps.updates import UpdateConsumer, publish

    keys, vectors, server, model = _server_with_own_stream(tmp_path)
    server.lookup(model, "items", keys[:50])  # cached in L1 and L2 now
    consumer = UpdateConsumer(server, model, url=redis_server.url, block_ms=100)
    fresh = np.full((5, DIM), 7.0, dtype=np.float32)
    publish(model, "items", keys[:5], fresh, url=redis_server.url)
    new_key = np.array([123456789], dtype=np.int64)
    publish(model, "items", new_key, np.ones((1, DIM), np.float32), url=redis_server.url)
    assert consumer.poll() == 0  # the backlog of this consumer is empty
    assert consumer.poll() == 2
    got = server.lookup(model, "items", np.concatenate([keys[:6], new_key]))
    np.testing.assert_array_equal(got[:5], fresh)  # refreshed in L1
    np.testing.assert_array_equal(got[5], vectors[5])
    np.testing.assert_array_equal(got[6], np.ones(DIM))
    found, from_disk = server.persistent.lookup(server.table(model, "items").key, keys[:5], DIM)
    assert found.all() and (from_disk == 7.0).all()
    server.close()


def test_a_restarted_consumer_resumes_after_its_last_acknowledged_message(
        tmp_path, redis_server, monkeypatch):
    from featureline.hps.updates import UpdateConsumer, publish

    keys, _, server, model = _server_with_own_stream(tmp_path)
    first = UpdateConsumer(server, model, url=redis_server.url, block_ms=100)
    publish(model, "items", keys[:1], np.full((1, DIM), 1.0, np.float32), url=redis_server.url)
    first.poll()
    first.poll()
    assert first.applied == 1
    # The next message crashes the consumer half-way: read, not applied, not acknowledged.
    publish(model, "items", keys[1:2], np.full((1, DIM), 2.0, np.float32), url=redis_server.url)
    original = server.apply_update

    def crash(*args, **kwargs):
        raise RuntimeError("killed")

    monkeypatch.setattr(server, "apply_update", crash)
    with pytest.raises(RuntimeError):
        first.poll()
    monkeypatch.setattr(server, "apply_update", original)
    publish(model, "items", keys[2:3], np.full((1, DIM), 3.0, np.float32), url=redis_server.url)
    # A new consumer under the same name: the unacknowledged message first, then the new one;
    # the first, acknowledged message is not applied again.
    second = UpdateConsumer(server, model, url=redis_server.url, block_ms=100)
    applied = []
    monkeypatch.setattr(server, "apply_update",
                        lambda m, t, k, v: (applied.append(float(v[0, 0])), original(m, t, k, v)))
    while second.poll():
        pass
    second.poll()
    assert applied == [2.0, 3.0]
    np.testing.assert_array_equal(server.lookup(model, "items", keys[:3])[:, 0], [1.0, 2.0, 3.0])
    server.close()


def test_updates_since_the_sources_were_written_are_replayed_after_a_rebuild(
        tmp_path, redis_server):
    import redis

    from featureline.hps.updates import UpdateConsumer, encode_update, publish, stream_name

    written_ms = int(time.time() * 1000)
    keys, vectors, server, model = _server_with_own_stream(tmp_path, n=20_000)
    # An update made a minute before the sources were written: the tables already hold it,
    # and applying it now would put an older vector over the trained one.
    redis.Redis.from_url(redis_server.url).xadd(
        stream_name(model), {"u": encode_update("items", keys[5:6], np.full((1, DIM), 9.0,
                                                                              np.float32))},
        id=f"{written_ms - 60_000}-0")
    consumer = UpdateConsumer(server, model, url=redis_server.url, block_ms=100)
    fresh = np.full((5, DIM), 7.0, np.float32)
    publish(model, "items", keys[:5], fresh, url=redis_server.url)
    while consumer.poll():
        pass
    consumer.poll()
    assert consumer.applied == 1  # the new replica's group starts after the old update
    table = server.table(model, "items")
    _damage_largest_table_file(tmp_path / "rocks")
    with pytest.raises(PersistentStoreError):  # and the server starts rebuilding L3
        server.lookup(model, "items", keys)
    deadline = time.monotonic() + 60
    while server.repairing and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.rebuilds == 1
    found, from_disk = server.persistent.lookup(table.key, keys[:6], DIM)
    assert found.all() and not (from_disk[:5] == 7.0).any()  # the sources' vectors again
    while consumer.poll():
        pass
    assert consumer.applied == 2  # replayed: the update since the sources, not the old one
    found, from_disk = server.persistent.lookup(table.key, keys[:6], DIM)
    np.testing.assert_array_equal(from_disk[:5], fresh)
    np.testing.assert_array_equal(from_disk[5], vectors[5])
    server.close()



def test_trimming_a_stream_keeps_what_the_sources_do_not_hold(tmp_path, redis_server,
                                                               monkeypatch):
    import redis
    import yaml
    from click.testing import CliRunner

    from featureline.cli import main
    from featureline.hps.updates import UpdateConsumer, encode_update, publish, stream_name

    keys, vectors, server, model = _server_with_own_stream(tmp_path)
    unsourced = f"{model}-unsourced"
    hps_file = tmp_path / "hps.yaml"
    hps_file.write_text(yaml.safe_dump({"models": [
        {"name": model, "tables": [{"name": "items", "dim": DIM,
                                    "source": str(tmp_path / "items")}]},
        {"name": unsourced, "tables": [{"name": "items", "dim": DIM}]}]}))
    client = redis.Redis.from_url(redis_server.url)
    written_ms = int(server.sources_written(model) * 1000)
    # Made a minute before the sources were written, read by a replica that then died.
    client.xadd(stream_name(model), {"u": encode_update("items", keys[:1], np.full(
        (1, DIM), 9.0, np.float32))}, id=f"{written_ms - 60_000}-0")
    consumer = UpdateConsumer(server, model, url=redis_server.url, block_ms=100)
    client.xgroup_setid(stream_name(model), consumer.group, "0")
    read = client.xreadgroup(consumer.group, consumer.name, {stream_name(model): ">"})
    assert len(read[0][1]) == 1
    fresh = np.full((1, DIM), 7.0, np.float32)
    publish(model, "items", keys[1:2], fresh, url=redis_server.url)
    publish(unsourced, "items", keys[:1], fresh, url=redis_server.url)

    monkeypatch.setenv("REDIS_URL", redis_server.url)
    result = CliRunner().invoke(main, ["hps", "trim-updates", "--hps", str(hps_file)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == {"removed": {model: 1, unsourced: 0}}
    assert client.xlen(stream_name(model)) == 1 and client.xlen(stream_name(unsourced)) == 1

    # The trimmed message, still pending, is acknowledged, not applied nor dead-lettered.
    while consumer.poll():  # the backlog
        pass
    consumer.poll()  # the new message
    assert (consumer.applied, consumer.dead_lettered) == (1, 0)
    assert client.xpending(stream_name(model), consumer.group)["pending"] == 0
    got = server.lookup(model, "items", keys[:2])
    np.testing.assert_array_equal(got, np.vstack([vectors[:1], fresh]))
    server.close()

def test_a_consumer_thread_outlives_a_tier_failure_and_applies_the_message_later(
        tmp_path, redis_server, monkeypatch):
    from featureline.hps.updates import UpdateConsumer, publish

    keys, _, server, model = _server_with_own_stream(tmp_path)
    original = server.apply_update
    failures = []

    def fail_once(*args):
        if not failures:
            failures.append(args)
            raise PersistentStoreError("m/items", "simulated write failure")
        original(*args)

    monkeypatch.setattr(server, "apply_update", fail_once)
    consumer = UpdateConsumer(server, model, url=redis_server.url, block_ms=100).start()
    try:
        publish(model, "items", keys[:1], np.full((1, DIM), 4.0, np.float32),
                url=redis_server.url)
        deadline = time.monotonic() + 20
        while consumer.applied == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        consumer.stop()
    assert failures and consumer.applied == 1
    np.testing.assert_array_equal(server.lookup(model, "items", keys[:1]), [[4.0] * DIM])
    server.close()


def test_lookups_while_updates_apply_never_see_a_mixed_vector(tmp_path):
    keys, vectors, server = _updatable_server(tmp_path, n=500)
    stop = threading.Event()
    bad: list[int] = []

    def writer() -> None:
        version = 1.0
        while not stop.is_set():
            server.apply_update("m", "items", keys, np.full((len(keys), DIM), version, np.float32))
            version += 1.0

    def reader() -> None:
        for _ in range(200):
            got = server.lookup("m", "items", keys[:64])
            # Every row is one whole vector: the original, or all elements of one version.
            for row, original in zip(got, vectors[:64], strict=True):
                if not (np.array_equal(row, original) or (row == row[0]).all()):
                    bad.append(1)

    threads = [threading.Thread(target=writer)] + [threading.Thread(target=reader)
                                                    for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads[1:]:
        thread.join()
    stop.set()
    threads[0].join()
    assert bad == []
    server.close()


def test_update_messages_round_trip_and_reject_garbage():
    from featureline.hps.updates import UpdateFormatError, decode_update, encode_update

    keys, vectors = _table(n=3)
    update = decode_update(encode_update("items", keys, vectors))
    assert update.table == "items"
    np.testing.assert_array_equal(update.keys, keys)
    np.testing.assert_array_equal(update.vectors, vectors)
    with pytest.raises(UpdateFormatError):
        decode_update(b"nonsense")
    with pytest.raises(UpdateFormatError):
        decode_update(encode_update("items", keys, vectors)[:-5])


def test_hash_index_agrees_with_a_dict_through_many_evictions():
    from featureline.hps.hash_index import HashIndex

    rng = np.random.default_rng(3)
    index = HashIndex(64)
    model: dict[int, int] = {}
    for _ in range(300):  # thousands of insertions into 64 slots: tombstones and rebuilds
        batch = np.unique(rng.integers(-500, 500, rng.integers(1, 40)))
        slots = index.assign(batch)
        assert (slots >= 0).all() and len(set(slots.tolist())) == len(batch)
        for key, slot in zip(batch.tolist(), slots.tolist(), strict=True):
            model = {k: s for k, s in model.items() if s != slot}  # the slot's old key is gone
            model[key] = slot
        probe = np.arange(-500, 500)
        found = index.find(probe)
        expected = np.array([model.get(k, -1) for k in probe.tolist()])
        np.testing.assert_array_equal(found, expected)
        assert len(index) == len(model) <= 64


def test_hash_index_evicts_the_least_used():
    from featureline.hps.hash_index import HashIndex

    index = HashIndex(4)
    index.assign(np.array([1, 2, 3, 4]))
    for _ in range(3):
        index.find(np.array([1, 3]))
    index.assign(np.array([5, 6]))
    held = {k for k in range(1, 7) if index.find(np.array([k]))[0] >= 0}
    assert held == {1, 3, 5, 6}


def test_a_background_insertion_never_writes_an_older_value_over_an_update(tmp_path):
    keys, vectors = _table()
    server = _server(tmp_path, keys, vectors)
    server.tables["ranker"]["items"].hit_rate_threshold = 0.0  # every insertion in background
    gate = threading.Event()
    server._background.submit(gate.wait)  # holds the insertion queued behind it
    key = keys[:1]
    before = server.lookup("ranker", "items", key)  # from RocksDB; insertion queued
    np.testing.assert_array_equal(before, vectors[:1])
    newer = np.full((1, DIM), 9.0, dtype=np.float32)
    server.apply_update("ranker", "items", key, newer)
    gate.set()
    server.wait_for_insertions()
    np.testing.assert_array_equal(server.lookup("ranker", "items", key), newer)
    hit, cached = server.volatile.lookup(server.table("ranker", "items").cache_key, key, DIM)
    assert not hit.any() or (cached[hit] == 9.0).all()
    server.close()


def test_a_table_published_while_it_is_read_is_read_whole(tmp_path, monkeypatch):
    from featureline.hps import formats

    folder = tmp_path / "items"
    old_keys = np.arange(4, dtype=np.int64)
    write_hugectr(folder, old_keys, np.zeros((4, DIM), dtype=np.float32))
    new_keys = np.arange(10, 16, dtype=np.int64)
    real_fromfile = np.fromfile
    published = []

    def fromfile_then_publish(handle, dtype):
        array = real_fromfile(handle, dtype=dtype)
        if not published:  # between the two files, a new version replaces the folder
            published.append(True)
            write_hugectr(folder, new_keys, np.ones((6, DIM), dtype=np.float32))
        return array

    monkeypatch.setattr(formats.np, "fromfile", fromfile_then_publish)
    keys, vectors = formats.read_hugectr(folder, DIM)
    monkeypatch.undo()
    np.testing.assert_array_equal(keys, old_keys)  # the version it started with, whole
    assert (vectors == 0).all()
    keys, vectors = formats.read_hugectr(folder, DIM)
    np.testing.assert_array_equal(keys, new_keys)
    assert (vectors == 1).all()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".items.lock", "items"]


def test_an_import_cut_short_or_a_changed_source_is_imported_again(tmp_path):
    from featureline.hps.persistent import RocksDBStore

    keys, vectors = _table()
    # A crash mid-import: some rows of the table in RocksDB, no mark of a finished import.
    partial = RocksDBStore(tmp_path / "rocks")
    partial.insert("ranker/items", keys[:10], vectors[:10])
    partial.close()
    server = _server(tmp_path, keys, vectors)
    assert server.tables["ranker"]["items"].size == len(keys)
    np.testing.assert_array_equal(server.lookup("ranker", "items", keys), vectors)
    server.close()
    # A newer source (fewer keys, new values): imported again at the next start.
    write_hugectr(tmp_path / "model" / "items", keys[:20], vectors[:20] + 1)
    server = ParameterServer(HpsConfig.model_validate({
        "models": [{"name": "ranker", "tables": [
            {"name": "items", "dim": DIM, "source": str(tmp_path / "model" / "items"),
             "default_value": 0.5}]}],
        "persistent_db": {"path": str(tmp_path / "rocks")}, "cache_device": "cpu"}))
    assert server.tables["ranker"]["items"].size == 20
    np.testing.assert_array_equal(server.lookup("ranker", "items", keys[:20]), vectors[:20] + 1)
    assert (server.lookup("ranker", "items", keys[20:21]) == 0.5).all()  # left the source
    server.close()


def test_a_reload_with_an_unreadable_source_changes_no_table(tmp_path):
    keys, vectors = _table()
    write_hugectr(tmp_path / "model" / "users", keys, vectors)
    config = {"models": [{"name": "ranker", "tables": [
        {"name": "items", "dim": DIM, "source": str(tmp_path / "model" / "items")},
        {"name": "users", "dim": DIM, "source": str(tmp_path / "model" / "users")}]}],
        "persistent_db": {"path": str(tmp_path / "rocks")}, "cache_device": "cpu"}
    write_hugectr(tmp_path / "model" / "items", keys, vectors)
    server = ParameterServer(HpsConfig.model_validate(config))
    write_hugectr(tmp_path / "model" / "items", keys, vectors + 7)   # retrained, readable
    (tmp_path / "model" / "users" / "emb_vector").write_bytes(b"\0" * 5)  # broken
    with pytest.raises(TableFileError):
        server.reload("ranker")
    np.testing.assert_array_equal(server.lookup("ranker", "items", keys[:5]), vectors[:5])
    server.close()


def test_a_blackholed_l2_costs_one_timeout_then_lookups_skip_it(tmp_path):
    import socket
    import time

    from featureline.hps.volatile import RedisStore

    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(16)  # the kernel completes connections; nothing ever answers
    keys, vectors = _table()
    write_hugectr(tmp_path / "model" / "items", keys, vectors)
    config = HpsConfig.model_validate({
        "models": [{"name": "ranker", "cache_fraction": 0.01, "tables": [
            {"name": "items", "dim": DIM, "source": str(tmp_path / "model" / "items")}]}],
        "persistent_db": {"path": str(tmp_path / "rocks")}, "cache_device": "cpu"})
    volatile = RedisStore(f"redis://127.0.0.1:{hole.getsockname()[1]}/0", capacity=100,
                          timeout_s=0.5, retry_after_s=60)
    server = ParameterServer(config, volatile=volatile)
    try:
        np.testing.assert_array_equal(server.lookup("ranker", "items", keys[:5]), vectors[:5])
        assert not volatile.available and volatile.unavailable >= 1
        for start in range(5, 50, 5):  # misses every time: each goes below L1
            began = time.perf_counter()
            got = server.lookup("ranker", "items", keys[start:start + 5])
            assert time.perf_counter() - began < 0.25  # no socket timeout waited
            np.testing.assert_array_equal(got, vectors[start:start + 5])
        assert volatile.skipped >= 9
        assert server.health() == {"l2": False, "l3": True}
    finally:
        server.close()
        hole.close()


def _damage_largest_table_file(folder) -> None:
    table_file = max(folder.glob("*.sst"), key=lambda p: p.stat().st_size)
    with table_file.open("r+b") as handle:
        handle.seek(table_file.stat().st_size // 4)
        handle.write(bytes(range(256)) * 64)  # 16 KiB over data blocks: checksums fail


def test_a_damaged_rocksdb_file_is_answered_503_then_rebuilt_from_the_source(tmp_path):
    keys, vectors = _table(n=20_000)
    server = _server(tmp_path, keys, vectors, cache_fraction=0.001,
                     volatile_db={"capacity": 10})
    _damage_largest_table_file(tmp_path / "rocks")
    with pytest.raises(PersistentStoreError, match="rebuilding it") as raised:
        server.lookup("ranker", "items", keys)
    assert raised.value.http_status == 503 and raised.value.retry_after
    deadline = time.monotonic() + 60
    while server.repairing and time.monotonic() < deadline:
        assert server.health()["l3"] is False
        time.sleep(0.05)
    assert server.health() == {"l2": True, "l3": True}
    np.testing.assert_array_equal(server.lookup("ranker", "items", keys), vectors)
    assert not (tmp_path / "rocks.damaged").exists()
    assert not (tmp_path / "rocks.rebuild").exists()
    server.close()
    # The rebuilt replica is whole and marked: a restart reads it without importing again.
    again = _server(tmp_path, keys, vectors, cache_fraction=0.001)
    np.testing.assert_array_equal(again.lookup("ranker", "items", keys[::-1]), vectors[::-1])
    again.close()


def test_a_replica_found_damaged_at_start_is_imported_again(tmp_path):
    keys, vectors = _table(n=20_000)
    _server(tmp_path, keys, vectors).close()
    _damage_largest_table_file(tmp_path / "rocks")
    server = _server(tmp_path, keys, vectors, cache_fraction=0.001)
    np.testing.assert_array_equal(server.lookup("ranker", "items", keys), vectors)
    assert server.health()["l3"] is True
    server.close()


def test_a_new_server_has_the_cache_index_compiled_before_its_first_lookup(tmp_path):
    # In a fresh process (this one may have run lookups already): loading the compiled code
    # is ~0.3 s that the first ranking request used to pay.
    import subprocess

    keys, vectors = _table(100)
    write_hugectr(tmp_path / "items", keys, vectors)
    config = {"models": [{"name": "ranker", "tables": [
                  {"name": "items", "dim": DIM, "source": str(tmp_path / "items")}]}],
              "persistent_db": {"path": str(tmp_path / "rocks")}, "cache_device": "cpu"}
    script = f"""
from featureline.hps import ParameterServer, hash_index
from featureline.hps.config import HpsConfig
jitted = (hash_index._find, hash_index._find_gather, hash_index._insert, hash_index._delete)
assert not any(f.signatures for f in jitted)
ParameterServer(HpsConfig.model_validate({config!r}))
assert all(f.signatures for f in jitted), [f.signatures for f in jitted]
"""
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)


def _write_config(path, tables, rocks):
    path.write_text(json.dumps({"hps": {
        "models": [{"name": "ranker", "tables": tables}],
        "persistent_db": {"path": str(rocks)}, "cache_device": "cpu"}}))


def test_a_reload_serves_the_tables_the_configuration_file_now_lists(tmp_path):
    # The daily chain's train step rewrites hps.yaml: items widened 8 → 12 with a new
    # vocabulary version, users added, tags removed; one reload serves all of it.
    keys, vectors = _table(300)
    wide_keys, wide = _table(400, dim=12, seed=1)
    for name, (k, v) in {"items": (keys, vectors), "tags": (keys[:10], vectors[:10]),
                         "items12": (wide_keys, wide), "users": (keys[:50], vectors[:50] * 2)
                         }.items():
        write_hugectr(tmp_path / name, k, v)
    path, rocks = tmp_path / "hps.yaml", tmp_path / "rocks"
    _write_config(path, [
        {"name": "items", "dim": DIM, "source": str(tmp_path / "items"),
         "vocabulary_version": "v1"},
        {"name": "tags", "dim": DIM, "source": str(tmp_path / "tags")}], rocks)
    server = ParameterServer.from_config(path)
    np.testing.assert_array_equal(server.lookup("ranker", "items", keys[:5]), vectors[:5])
    _write_config(path, [
        {"name": "items", "dim": 12, "source": str(tmp_path / "items12"),
         "vocabulary_version": "v2", "default_value": 0.25},
        {"name": "users", "dim": DIM, "source": str(tmp_path / "users")}], rocks)
    assert server.reload("ranker") == {"items": 400, "users": 50}
    np.testing.assert_array_equal(server.lookup("ranker", "items", wide_keys), wide)
    assert (server.lookup("ranker", "items", keys[:3]) == 0.25).all()  # left with the old width
    np.testing.assert_array_equal(server.lookup("ranker", "users", keys[:50]), vectors[:50] * 2)
    with pytest.raises(UnknownTableError):
        server.lookup("ranker", "tags", keys[:1])
    stats = server.stats()["ranker"]
    assert (stats["items"]["dim"], stats["items"]["vocabulary_version"]) == (12, "v2")
    server.close()
    # A restart on the same replica serves what the reload imported, without importing again.
    restarted = ParameterServer.from_config(path)
    np.testing.assert_array_equal(restarted.lookup("ranker", "items", wide_keys[:7]), wide[:7])
    restarted.close()


def test_a_reload_of_a_configuration_that_cannot_apply_changes_no_table(tmp_path):
    keys, vectors = _table(100)
    write_hugectr(tmp_path / "items", keys, vectors)
    path, rocks = tmp_path / "hps.yaml", tmp_path / "rocks"
    items = {"name": "items", "dim": DIM, "source": str(tmp_path / "items")}
    _write_config(path, [items, {"name": "seen", "dim": 4}], rocks)
    server = ParameterServer.from_config(path)
    path.write_text("hps: {models: []}")  # does not load
    with pytest.raises(ConfigError, match=r"hps\.models"):
        server.reload("ranker")
    _write_config(path, [items, {"name": "seen", "dim": 6}], rocks)  # unsourced, wider
    with pytest.raises(ConfigError, match=r"tables\.seen"):
        server.reload("ranker")
    write_hugectr(tmp_path / "items16", keys, np.ones((100, 16), dtype=np.float32))
    _write_config(path, [{**items, "dim": 16, "source": str(tmp_path / "items16")},
                         {"name": "seen", "dim": 4}, {"name": "new", "dim": 4,
                                                      "source": str(tmp_path / "missing")}],
                  rocks)
    with pytest.raises(TableFileError):  # one source unreadable: nothing applied
        server.reload("ranker")
    np.testing.assert_array_equal(server.lookup("ranker", "items", keys[:5]), vectors[:5])
    assert sorted(server.tables["ranker"]) == ["items", "seen"]
    server.close()


def test_a_lookup_waiting_on_a_replaced_table_reads_the_new_one(tmp_path):
    keys, vectors = _table(100)
    write_hugectr(tmp_path / "items", keys, vectors)
    write_hugectr(tmp_path / "items4", keys, np.full((100, 4), 3.0, dtype=np.float32))
    path, rocks = tmp_path / "hps.yaml", tmp_path / "rocks"
    _write_config(path, [{"name": "items", "dim": DIM, "source": str(tmp_path / "items")}],
                  rocks)
    server = ParameterServer.from_config(path)
    old = server.tables["ranker"]["items"]
    _write_config(path, [{"name": "items", "dim": 4, "source": str(tmp_path / "items4")}], rocks)
    got = []
    with old.lock:  # a lookup arrives while the old entry is busy, then the reload replaces it
        reader = threading.Thread(target=lambda: got.append(
            server.lookup("ranker", "items", keys[:2])))
        reader.start()
        time.sleep(0.2)
        old.retired = True
        server.tables["ranker"]["items"] = server._entry(
            "ranker", load_hps_config(path).models[0].tables[0], 100, 0.5, 0.9)
        server.persistent.drop("ranker/items")
        server.persistent.insert("ranker/items", keys, np.full((100, 4), 3.0, np.float32))
    reader.join(5)
    assert got and got[0].shape == (2, 4) and (got[0] == 3.0).all()
    server.close()
