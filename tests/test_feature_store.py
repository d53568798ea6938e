"""Feast over the ETL's entity tables, with a real Redis server and real Feast (DuckDB offline
store): apply, materialize, online reads, point-in-time training sets, Feast's own CLI."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from datetime import datetime
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
import redis
from click.testing import CliRunner

from featureline.cli import main
from featureline.config import parse_config
from featureline.core.errors import ConfigError, MetadataNotFoundError
from featureline.feature_store.errors import (
    EntityRowsError,
    OnlineStoreUnavailableError,
    UnknownFeatureServiceError,
)
from featureline.feature_store.publication import KEY_PREFIX
from featureline.feature_store.publish import publish
from featureline.feature_store.redis_server import free_port
from featureline.feature_store.repo import feast_connection_string, open_repo
from featureline.feature_store.tiles import TILES_PREFIX
from featureline.feature_store.training_set import training_set
from featureline.feature_store.writer import VECTOR_PREFIX, latest_snapshots
from tests.feast_data import REPO, copy_project, fresh_db, write_handmade_output

BIN = Path(sys.executable).parent


def _utc(text: str) -> datetime:
    return pd.Timestamp(text, tz="UTC").to_pydatetime()


@pytest.fixture
def handmade_output(tmp_path) -> Path:
    return write_handmade_output(tmp_path / "output")


@pytest.fixture
def online_url(redis_server) -> str:
    return fresh_db(redis_server, 3)


def _online(repo, rows: list[dict]) -> dict:
    service = repo.store.get_feature_service("ranking")
    return repo.store.get_online_features(features=service, entity_rows=rows).to_dict()


def _redis_dump(url: str, vectors: bool = True) -> dict:
    """Every key and value, less the publication stamp and the generations' counter (a
    replace moves them); entity vectors and tiles (unless not ``vectors``) without their
    generation."""
    client = redis.Redis.from_url(url)
    dump = {}
    for key in client.scan_iter():
        prefix = next((p for p in (VECTOR_PREFIX, TILES_PREFIX) if key.startswith(p.encode())),
                      None)
        if prefix is not None:
            if not vectors:
                continue
            project, _, rest = key[len(prefix):].split(b":", 2)
            dump[(prefix, project, rest)] = client.get(key)
        elif not key.startswith((KEY_PREFIX.encode(), b"featureline:generations:")):
            dump[key] = client.hgetall(key)
    return dump


def test_publish_then_online_values_are_the_latest_snapshots(tmp_path, handmade_output,
                                                              online_url):
    repo = open_repo(copy_project(tmp_path).feature_store, handmade_output, url=online_url)
    summary = publish(repo, progress=lambda _: None)
    assert {v.name: v.keys for v in summary.views} == {"user_features": 2, "item_features": 2}
    values = _online(repo, [{"user_id": "u1", "item_id": "i2"},
                            {"user_id": "u2", "item_id": "i1"},
                            {"user_id": "nobody", "item_id": "nothing"}])
    assert values["user_events"] == [7, 2, None]
    assert values["user_id_cat"] == [3, 4, None]
    assert values["user_positive_rate"] == [0.7, 0.2, None]
    assert values["item_events"] == [9, 5, None]
    assert values["item_id_cat"] == [4, 3, None]


def test_materialization_is_incremental_and_idempotent(tmp_path, handmade_output, online_url):
    repo = open_repo(copy_project(tmp_path).feature_store, handmade_output, url=online_url)
    first = publish(repo, end=_utc("2026-01-06"), progress=lambda _: None)
    assert first.keys == 2 + 2
    assert _online(repo, [{"user_id": "u1", "item_id": "i2"}])["user_events"] == [3]
    second = publish(repo, progress=lambda _: None)
    # Only what was stamped after the first run's end: u1's 01-10 snapshot (i2's 01-06
    # snapshot lies on the boundary, which both ranges include).
    assert {v.name: v.start for v in second.views} == {
        "user_features": _utc("2026-01-06"), "item_features": _utc("2026-01-06")}
    assert {v.name: v.keys for v in second.views} == {"user_features": 1, "item_features": 1}
    assert _online(repo, [{"user_id": "u1", "item_id": "i2"}])["user_events"] == [7]
    before = _redis_dump(online_url)
    publish(repo, full=True, progress=lambda _: None)
    publish(repo, progress=lambda _: None)
    assert _redis_dump(online_url) == before


def test_publish_the_real_etl_output(tmp_path, job_output, redis_server):
    url = fresh_db(redis_server, 4)
    repo = open_repo(copy_project(tmp_path, ttl="30d").feature_store, job_output.output, url=url)
    summary = publish(repo, progress=lambda _: None)
    for entity, view in (("user", "user_features"), ("item", "item_features")):
        snapshots = pq.read_table(job_output.output / "entities" / entity).to_pandas()
        key = f"{entity}_id"
        latest = snapshots.sort_values("event_timestamp").groupby(key).tail(1).set_index(key)
        assert {v.name: v.keys for v in summary.views}[view] == len(latest)
        sample = latest.index[:25].tolist()
        values = repo.store.get_online_features(
            features=[f"{view}:{c}" for c in latest.columns if c != "event_timestamp"],
            entity_rows=[{key: k} for k in sample]).to_dict()
        for column in latest.columns.drop("event_timestamp"):
            assert values[column] == pytest.approx(latest.loc[sample, column].tolist()), column


def test_training_set_is_point_in_time_correct_and_keeps_every_row(tmp_path, handmade_output,
                                                                   online_url):
    repo = open_repo(copy_project(tmp_path, ttl="3d").feature_store, handmade_output,
                     url=online_url)
    publish(repo, progress=lambda _: None)
    times = ["2026-01-01", "2026-01-02", "2026-01-04 23:59", "2026-01-05", "2026-01-09 12:00",
             "2026-01-10", "2026-01-05", "2026-01-05"]
    users = ["u1", "u1", "u1", "u1", "u1", "u1", "nobody", "u1"]
    rows = pd.DataFrame({"user_id": users, "item_id": ["i1"] * len(users),
                         "event_timestamp": pd.to_datetime(times, utc=True, format="ISO8601"),
                         "label": range(len(users))})
    rows.to_parquet(tmp_path / "rows.parquet")
    summary = training_set(repo, tmp_path / "rows.parquet", "training", tmp_path / "ts.parquet")
    result = pq.read_table(tmp_path / "ts.parquet")
    assert summary.rows == result.num_rows == len(rows)
    assert result["label"].to_pylist() == list(range(len(users)))  # input order
    assert result.schema.field("user_events").type == pa.int64()
    # before any snapshot; exactly at one; just before the next; at the next; 4.5 days after
    # the latest (beyond the 3-day ttl); at the newest; unknown user; a duplicate row.
    assert result["user_events"].to_pylist() == [None, 1, 1, 3, None, 7, None, 3]
    # i1's only snapshot (01-02) is within 3 days of 01-02 .. 01-05 only.
    assert result["item_events"].to_pylist() == [None, 5, 5, 5, None, None, 5, 5]
    assert summary.coverage["user_events"] == pytest.approx(5 / 8)


def test_training_set_errors_name_the_problem(tmp_path, handmade_output, online_url):
    repo = open_repo(copy_project(tmp_path).feature_store, handmade_output, url=online_url)
    publish(repo, progress=lambda _: None)
    pd.DataFrame({"user_id": ["u1"], "event_timestamp": [pd.Timestamp("2026-01-05", tz="UTC")]}
                 ).to_parquet(tmp_path / "no_item.parquet")
    with pytest.raises(EntityRowsError, match=r"missing column.*item_id"):
        training_set(repo, tmp_path / "no_item.parquet", "training", tmp_path / "out.parquet")
    with pytest.raises(UnknownFeatureServiceError, match=r"'scoring'.*ranking, training"):
        training_set(repo, tmp_path / "no_item.parquet", "scoring", tmp_path / "out.parquet")
    with pytest.raises(EntityRowsError, match="no such file"):
        training_set(repo, tmp_path / "absent.parquet", "training", tmp_path / "out.parquet")
    assert not (tmp_path / "out.parquet").exists()


def test_redis_down_is_a_clear_error(tmp_path, handmade_output):
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    repo = open_repo(copy_project(tmp_path).feature_store, handmade_output, url=url)
    with pytest.raises(OnlineStoreUnavailableError, match=f"{url} is unavailable"):
        publish(repo, progress=lambda _: None)


def test_no_etl_output_is_a_clear_error(tmp_path):
    with pytest.raises(MetadataNotFoundError, match=r"nothing: no metadata\.json") as error:
        open_repo(copy_project(tmp_path).feature_store, tmp_path / "nothing", url="redis://127.0.0.1:1/0")
    assert "featureline etl run" in error.value.hint


def test_connection_string_and_config_checks():
    assert feast_connection_string("redis://127.0.0.1:6390/2").startswith("127.0.0.1:6390,db=2,")
    secure = feast_connection_string("rediss://app:s%40cret@cache.internal:6380/0")
    assert secure.startswith("cache.internal:6380,db=0,username=app,password=s@cret,ssl=true")
    cluster = feast_connection_string("redis://node-1:7000/0", "redis_cluster")
    assert cluster.startswith("node-1:7000,socket")  # a cluster has no db index
    with pytest.raises(ConfigError, match="REDIS_URL"):
        feast_connection_string("localhost:6379")
    with pytest.raises(ConfigError, match=r"feature_store\.ttl"):
        parse_config({"feature_store": {"ttl": "forever"}})
    with pytest.raises(ConfigError, match=r"feature_store\.redis_type"):
        parse_config({"feature_store": {"redis_type": "memcached"}})


def test_feast_imports_only_the_definitions_file():
    from feast.repo_operations import get_repo_files

    files = get_repo_files(REPO / "feature_store" / "feast_repo")
    assert [f.name for f in files] == ["featureline_repo.py"]


def test_feast_cli_apply_and_materialize(tmp_path, handmade_output, redis_server):
    """`cd feature_store && feast apply`, then a first load and an increment, as a Feast user.

    (Feast's materialize-incremental on a never-materialized view starts at end - ttl, so a
    first load names its range.)"""
    config = copy_project(tmp_path)
    repo = Path(config.feature_store.repo)
    url = fresh_db(redis_server, 5)
    env = {**os.environ, "FEATURELINE_OUTPUT": str(handmade_output),
           "FEAST_REDIS_CONNECTION": feast_connection_string(url)}
    for command in (["apply"], ["materialize", "2026-01-01T00:00:00", "2026-01-06T00:00:00"],
                    ["materialize-incremental", "2026-02-01T00:00:00"]):
        done = subprocess.run([str(BIN / "feast"), *command], cwd=repo, env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
    assert (repo / "data" / "registry.db").is_file()
    # What the CLI registered and materialized is what our own code reads back.
    feature_repo = open_repo(config.feature_store, handmade_output, url=url)
    assert _online(feature_repo, [{"user_id": "u1", "item_id": "i1"}])["user_events"] == [7]


def test_cli_publish_training_set_and_redis_commands(spark, tmp_path, handmade_output,
                                                    redis_server):
    config = copy_project(tmp_path)
    config_file = tmp_path / "featureline.yaml"
    config_file.write_text(json.dumps(config.model_dump(mode="json")))
    runner = CliRunner()
    url = fresh_db(redis_server, 6)
    published = runner.invoke(main, ["publish", "--config", str(config_file), "--data",
                                     str(handmade_output)], env={"REDIS_URL": url})
    assert published.exit_code == 0, published.output
    assert json.loads(published.stdout.splitlines()[-1])["keys_written"] == 4
    # Again from Spark tasks (the test run's session), the whole dataset: nothing changed.
    again = runner.invoke(main, ["publish", "--config", str(config_file), "--data",
                                 str(handmade_output), "--spark", "--full"],
                          env={"REDIS_URL": url})
    assert again.exit_code == 0, again.output
    assert {k: v for k, v in json.loads(again.stdout.splitlines()[-1]).items()
            if k in ("keys_written", "keys_changed", "keys_removed")} == {
        "keys_written": 4, "keys_changed": 0, "keys_removed": 0}
    pd.DataFrame({"user_id": ["u1", "u2"], "item_id": ["i1", "i9"],
                  "event_timestamp": pd.to_datetime(["2026-01-05", "2026-01-04"], utc=True)}
                 ).to_parquet(tmp_path / "rows.parquet")
    made = runner.invoke(main, ["training-set", "--config", str(config_file), "--data",
                                str(handmade_output), "--entities", str(tmp_path / "rows.parquet"),
                                "--out", str(tmp_path / "ts.parquet")], env={"REDIS_URL": url})
    assert made.exit_code == 0, made.output
    assert pq.read_table(tmp_path / "ts.parquet")["user_events"].to_pylist() == [3, 2]

    # The embedded daemon: start (twice: found running), status, env, stop.
    env = {"REDIS_URL": ""}
    started = runner.invoke(main, ["redis", "start", "--config", str(config_file)], env=env)
    assert started.exit_code == 0, started.output
    try:
        daemon = started.stdout.strip()
        assert redis.Redis.from_url(daemon).ping()
        again = runner.invoke(main, ["redis", "start", "--config", str(config_file)], env=env)
        assert again.stdout.strip() == daemon
        status = runner.invoke(main, ["redis", "status", "--config", str(config_file)], env=env)
        assert json.loads(status.stdout)["url"] == daemon
        exports = runner.invoke(main, ["redis", "env", "--config", str(config_file)], env=env)
        port = daemon.rsplit(":", 1)[1].split("/")[0]
        assert f"export FEAST_REDIS_CONNECTION='127.0.0.1:{port},db=0," in exports.stdout
    finally:
        stopped = runner.invoke(main, ["redis", "stop", "--config", str(config_file)], env=env)
    assert stopped.stdout.strip() == "stopped"
    with pytest.raises(redis.ConnectionError):
        redis.Redis.from_url(daemon, socket_connect_timeout=1).ping()
    status = runner.invoke(main, ["redis", "status", "--config", str(config_file)], env=env)
    assert status.exit_code == 1 and json.loads(status.stdout) == {"running": False}
    # On a port of one's choosing; a port in use is refused, naming it.
    chosen = free_port()
    on_port = runner.invoke(main, ["redis", "start", "--config", str(config_file), "--port",
                                   str(chosen)], env=env)
    try:
        assert on_port.stdout.strip() == f"redis://127.0.0.1:{chosen}/0"
        other = runner.invoke(main, ["redis", "start", "--config", str(config_file), "--port",
                                     str(free_port())], env=env)
        assert other.exit_code != 0 and "already runs at" in str(other.exception)
    finally:
        runner.invoke(main, ["redis", "stop", "--config", str(config_file)], env=env)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        taken = busy.getsockname()[1]
        refused = runner.invoke(main, ["redis", "start", "--config", str(config_file),
                                       "--port", str(taken)], env=env)
    assert f"port {taken} on 127.0.0.1 is in use" in str(refused.exception)



def test_spark_offline_store_gives_the_same_training_set(spark, tmp_path, handmade_output,
                                                          online_url):
    """Feast's Spark offline store (the one for scale) on the shared local session."""
    duckdb_repo = open_repo(copy_project(tmp_path / "duckdb").feature_store, handmade_output,
                            url=online_url)
    config = copy_project(tmp_path / "spark")
    config = parse_config({"feature_store": {**config.feature_store.model_dump(),
                                             "offline_store": "spark"}})
    spark_repo = open_repo(config.feature_store, handmade_output, url=online_url)
    rows = pd.DataFrame({"user_id": ["u1", "u1", "u2", "nobody", "u1"],
                         "item_id": ["i1", "i2", "i1", "i2", "i2"],
                         "event_timestamp": pd.to_datetime(
                             ["2026-01-02", "2026-01-07", "2026-01-04", "2026-01-07",
                              "2026-01-30"], utc=True),
                         "label": [1, 0, 1, 0, 1]})
    rows.to_parquet(tmp_path / "rows.parquet")
    try:
        for repo in (duckdb_repo, spark_repo):
            repo.store.apply(repo.definitions.objects())
            training_set(repo, tmp_path / "rows.parquet", "training",
                         tmp_path / f"{repo.settings.offline_store}.parquet")
    finally:
        # Feast's Spark store switches this on in the session it borrows; the ETL tests
        # share that session.
        spark.conf.unset("spark.sql.parser.quotedRegexColumnNames")
    by_duckdb = pq.read_table(tmp_path / "duckdb.parquet")
    by_spark = pq.read_table(tmp_path / "spark.parquet")
    assert by_spark.num_rows == len(rows)
    assert by_spark["user_events"].to_pylist() == [1, 3, 2, None, None]
    for column in by_duckdb.column_names:
        assert by_spark[column].to_pylist() == by_duckdb[column].to_pylist(), column


def test_redis_cluster_online_store(tmp_path, handmade_output, redis_cluster):
    """feature_store.redis_type: redis_cluster — publish and read through a real cluster."""
    from redis.cluster import RedisCluster

    from featureline.feature_store.online import OnlineFeatures, OnlineReader

    RedisCluster.from_url(redis_cluster.url).flushall()
    config = copy_project(tmp_path)
    config = parse_config({"feature_store": {**config.feature_store.model_dump(),
                                             "redis_type": "redis_cluster"}})
    repo = open_repo(config.feature_store, handmade_output, url=redis_cluster.url)
    summary = publish(repo, progress=lambda _: None)
    assert summary.keys == 4
    rows = {"user_id": ["u1", "u2", "zz"], "item_id": ["i1", "i2", "i2"]}
    values = _online(repo, [dict(zip(rows, r, strict=True)) for r in zip(*rows.values(),
                                                                           strict=True)])
    assert values["user_events"] == [7, 2, None]
    reader = OnlineReader.from_store(repo.store, redis_cluster.url)
    result = reader.read(reader.references("ranking"), rows)
    for name in result.names:
        assert result.values[name] == values[name], name
    # The API's reads: the asyncio client, the same answer.

    async def read_async() -> OnlineFeatures:
        try:
            return await reader.read_async(reader.references("ranking"), rows)
        finally:
            await reader.store.close_async()

    assert asyncio.run(read_async()) == result


def test_the_online_reader_refuses_feast_settings_it_does_not_implement(tmp_path,
                                                                       handmade_output,
                                                                       online_url):
    from featureline.feature_store.online import OnlineReader

    repo = open_repo(copy_project(tmp_path).feature_store, handmade_output, url=online_url)
    publish(repo, progress=lambda _: None)
    assert OnlineReader.from_store(repo.store, online_url).views  # as configured: it reads
    repo.store.config.registry.enable_online_feature_view_versioning = True
    with pytest.raises(ConfigError, match="enable_online_feature_view_versioning"):
        OnlineReader.from_store(repo.store, online_url)


def test_publish_writes_the_bytes_feasts_materialization_writes(tmp_path, job_output,
                                                                redis_server, monkeypatch):
    """Our writer against Feast's own materialize of the same output into another database:
    every key, field and value byte for byte (the view timestamps included)."""
    from featureline.feature_store import redis_store, writer

    # Many script calls and round trips, even on the small output.
    monkeypatch.setattr(redis_store, "CHUNK", 7)
    monkeypatch.setattr(redis_store, "BATCH", 30)
    monkeypatch.setattr(writer, "SLICE", 50)
    ours, feasts = fresh_db(redis_server, 8), fresh_db(redis_server, 9)
    project = copy_project(tmp_path, ttl="30d").feature_store
    repo = open_repo(project, job_output.output, url=ours)
    summary = publish(repo, end=_utc("2100-01-01"), progress=lambda _: None)
    reference = open_repo(project, job_output.output, url=feasts)
    reference.store.apply(reference.definitions.objects())
    for view in summary.views:
        reference.store.materialize(view.start, view.end, feature_views=[view.name])
    written, expected = _redis_dump(ours, vectors=False), _redis_dump(feasts)
    assert len(written) == summary.keys == len(expected)
    assert written == expected
    # And one vector per view and entity, the tiles of each entity of the output and of the
    # model inputs' groups: each user, item and (user, item) pair.
    pairs = ds.dataset(job_output.output / "state" / "events", format="parquet",
                       partitioning="hive").to_table(columns=["user_id", "item_id"])
    pairs = len(set(zip(*(pairs[c].to_pylist() for c in ("user_id", "item_id")), strict=True)))
    assert summary.tile_keys == 2 * summary.keys + pairs
    assert len(_redis_dump(ours)) == 2 * summary.keys + summary.tile_keys


def _shifted_output(output: Path, root: Path, by: int) -> Path:
    """A copy of ``output`` whose event counts are ``by`` higher: another dataset."""
    copy = root / f"output+{by}"
    shutil.copytree(output, copy)
    for entity in ("user", "item"):
        path = copy / "entities" / entity / "part-00000.parquet"
        table = pq.read_table(path)
        column = f"{entity}_events"
        table = table.set_column(table.schema.get_field_index(column), column,
                                 pc.add(table[column], by))
        pq.write_table(table, path)
    return copy


def test_readers_never_see_two_datasets_in_one_answer(tmp_path, handmade_output, online_url,
                                                       monkeypatch):
    """Publishes replacing dataset A with B and back, while a reader reads every entity of
    both views: each answer is wholly A's or wholly B's (a replace writes Feast's layout in
    place, view after view: read that way, answers mix) — read in turns blocking and on an
    event loop (the API's ``read_async``)."""
    from featureline.feature_store import redis_store
    from featureline.feature_store.online import OnlineReader

    monkeypatch.setattr(redis_store, "CHUNK", 1)  # one entity per call: longer replaces
    project = copy_project(tmp_path).feature_store
    outputs = [handmade_output, _shifted_output(handmade_output, tmp_path, 1000)]
    repos = [open_repo(project, output, url=online_url) for output in outputs]
    publish(repos[0], progress=lambda _: None)
    reader = OnlineReader.from_store(repos[0].store, online_url)
    references = reader.references("ranking")
    rows = {"user_id": ["u1", "u2"], "item_id": ["i1", "i2"]}
    datasets = {(7, 2, 5, 9): "A", (1007, 1002, 1005, 1009): "B"}
    seen: list[str] = []
    stop = threading.Event()
    errors: list[BaseException] = []

    by_driver: dict[str, set[str]] = {"read": set(), "read_async": set()}

    async def read() -> None:
        while not stop.is_set():
            for driver in by_driver:
                result = (reader.read(references, rows) if driver == "read"
                          else await reader.read_async(references, rows))
                answer = (*result.values["user_events"], *result.values["item_events"])
                seen.append(datasets.get(answer, f"mixed: {answer}"))
                by_driver[driver].add(seen[-1])
        await reader.store.close_async()

    def reading() -> None:
        try:
            asyncio.run(read())
        except BaseException as error:  # reported by the test's thread
            errors.append(error)

    thread = threading.Thread(target=reading)
    thread.start()
    try:
        for round_ in range(8):
            summary = publish(repos[(round_ + 1) % 2], full=True, progress=lambda _: None)
            assert summary.generation == round_ + 2
            assert summary.vectors_removed == 4  # the replaced generation's
    finally:
        stop.set()
        thread.join()
    assert not errors, errors
    assert [answer for answer in seen if answer.startswith("mixed")] == []
    assert {"A", "B"} <= set(seen) and len(seen) > 100
    assert by_driver == {"read": {"A", "B"}, "read_async": {"A", "B"}}
    # A read after the last publish serves its generation (the thread may have stopped
    # before reading it), wholly A's.
    values = reader.read(references, rows).values
    assert (*values["user_events"], *values["item_events"]) == (7, 2, 5, 9)
    assert reader.generation == 9
    # Only the served generation is left, and Feast's SDK reads the last dataset (A's).
    client = redis.Redis.from_url(online_url)
    assert {key.split(b":")[3] for key in client.scan_iter(match=f"{VECTOR_PREFIX}*")} == {
        b"9"}
    assert _online(repos[0], [{"user_id": "u1", "item_id": "i2"}])["user_events"] == [7]


def test_a_killed_replace_is_never_served_nor_written_into(tmp_path, handmade_output,
                                                          online_url):
    """A replace that died after writing part of its generation: the next replace takes
    another number, and drops what the dead one left."""
    from feast.value_type import ValueType

    from featureline.feature_store.online import OnlineReader
    from featureline.feature_store.online_store import open_online_store
    from featureline.feature_store.writer import entity_keys, vector_prefix

    repo = open_repo(copy_project(tmp_path).feature_store, handmade_output, url=online_url)
    assert publish(repo, progress=lambda _: None).generation == 1
    project = repo.store.project
    store = open_online_store("redis", online_url)
    dead = store.next_generation(project, 1)
    (ghost,) = entity_keys("user_id", ["ghost"], ValueType.STRING, project, 3)
    client = redis.Redis.from_url(online_url)
    client.set(vector_prefix(project, dead, "user_features") + ghost, b"[0, 1, 1, 0.5]")
    summary = publish(repo, full=True, progress=lambda _: None)
    assert (dead, summary.generation, summary.vectors_removed) == (2, 3, 4 + 1)
    reader = OnlineReader.from_store(repo.store, online_url)
    values = reader.read(reader.references(features=["user_features:user_events"]),
                         {"user_id": ["u1", "ghost"]}).values
    assert values == {"user_events": [7, None]}
    assert not list(client.scan_iter(match=vector_prefix(project, dead).decode() + "*"))
    store.close()


def test_the_reader_returns_what_feasts_sdk_returns_on_the_real_output(tmp_path, job_output,
                                                                     redis_server):
    """Every feature of the real ETL output, known and unknown entities: the entity vectors
    our reader reads decode to exactly the values Feast's SDK decodes from its layout."""
    from featureline.feature_store.online import OnlineReader

    url = fresh_db(redis_server, 10)
    repo = open_repo(copy_project(tmp_path, ttl="3650d").feature_store, job_output.output,
                     url=url)
    publish(repo, progress=lambda _: None)
    users = pq.read_table(job_output.output / "entities" / "user")["user_id"].unique()
    items = pq.read_table(job_output.output / "entities" / "item")["item_id"].unique()
    rows = {"user_id": [*users.to_pylist()[:40], "nobody"],
            "item_id": [*items.to_pylist()[:40], "nothing"]}
    reader = OnlineReader.from_store(repo.store, url)
    ours = reader.read(reader.references("ranking"), rows)
    sdk = _online(repo, [dict(zip(rows, row, strict=True)) for row in zip(*rows.values(),
                                                                         strict=True)])
    assert set(ours.names) == set(sdk) - {"user_id", "item_id"}
    for name in ours.names:
        assert ours.values[name] == sdk[name], name
        assert ours.values[name][-1] is None
    assert any(isinstance(v, float) for name in ours.names for v in ours.values[name])


def test_publish_counts_changed_and_removed_entities(tmp_path, handmade_output, online_url):
    repo = open_repo(copy_project(tmp_path).feature_store, handmade_output, url=online_url)
    client = redis.Redis.from_url(online_url)
    first = publish(repo, progress=lambda _: None)
    assert (first.keys_changed, first.keys_removed) == (first.keys, 0)  # all new
    # The same values again: nothing changed. A value altered in Redis: one entity changed.
    again = publish(repo, full=True, progress=lambda _: None)
    assert (again.keys_changed, again.keys_removed) == (0, 0)
    key = next(k for k in client.scan_iter() if client.type(k) == b"hash"
               and client.hexists(k, "_ts:user_features"))
    field = next(f for f in client.hkeys(key) if not f.startswith(b"_ts:"))
    client.hset(key, field, b"stale")
    assert publish(repo, full=True, progress=lambda _: None).keys_changed == 1
    assert client.hget(key, field) != b"stale"


def test_a_store_loads_its_script_again_when_the_server_lost_it(tmp_path, handmade_output,
                                                               online_url):
    """A store loads its write script once, not per write; a server that lost it (restarted,
    flushed) is given it again and the write lands, as counted."""
    import pyarrow.dataset as ds

    from featureline.feature_store.online_store import open_online_store
    from featureline.feature_store.writer import Layout

    repo = open_repo(copy_project(tmp_path).feature_store, handmade_output, url=online_url)
    publish(repo, progress=lambda _: None)
    store = open_online_store("redis", online_url)
    view = repo.definitions.views["user"]
    layout = Layout.of(view, "user_id", repo.definitions.entities["user"].value_type,
                       repo.store.project, 3)
    rows = latest_snapshots(ds.dataset(repo.definitions.snapshot_path("user")), "user_id",
                            layout.timestamp_field, datetime(2000, 1, 1), datetime(2100, 1, 1))
    assert store.write_view(rows, layout).changed == 0  # as published
    client = redis.Redis.from_url(online_url)
    key = next(k for k in client.scan_iter() if client.type(k) == b"hash"
               and client.hexists(k, "_ts:user_features"))
    field = next(f for f in client.hkeys(key) if not f.startswith(b"_ts:"))
    client.hset(key, field, b"stale")
    client.script_flush()
    assert store.write_view(rows, layout).changed == 1
    assert client.hget(key, field) != b"stale"
    store.close()


def test_the_writer_encodes_values_and_keys_as_feast_does():
    from feast.infra.online_stores.helpers import _redis_key
    from feast.protos.feast.types.EntityKey_pb2 import EntityKey
    from feast.protos.feast.types.Value_pb2 import Value
    from feast.type_map import python_values_to_proto_values
    from feast.value_type import ValueType

    from featureline.feature_store.writer import encode_values, entity_keys

    columns = [
        (ValueType.DOUBLE, pa.array([0.0, -1.5, 1e300, 0.1, None, float("inf"), float("nan")],
                                    pa.float64())),
        (ValueType.FLOAT, pa.array([0.0, -1.5, 3.25, None, float("nan")], pa.float32())),
        # With a null, Feast's path goes through float64: its int64s are exact to 2**53.
        (ValueType.INT64, pa.array([0, 1, -1, 2**50, None, 300, 127, 128, 16383, 16384,
                                    2**53, -(2**53), -300], pa.int64())),
        (ValueType.INT64, pa.array([2**63 - 1, -(2**63) + 1, 0], pa.int64())),
        (ValueType.INT32, pa.array([0, -7, 2**31 - 1, -(2**31), None, 128], pa.int32())),
        (ValueType.STRING, pa.array(["a", "", "ünï", None])),
        (ValueType.BOOL, pa.array([True, False, None])),
    ]
    for value_type, column in columns:
        # Feast's materialization: the Arrow column to NumPy, then its converter.
        expected = [p.SerializeToString() for p in python_values_to_proto_values(
            column.to_numpy(zero_copy_only=False), value_type)]
        assert encode_values(column, value_type) == expected, value_type
    for key_type, values, field in ((ValueType.STRING, ["u1", "", "ü"], "string_val"),
                                    (ValueType.INT64, [0, -3, 2**40], "int64_val")):
        expected = [_redis_key("proj", EntityKey(join_keys=["user_id"],
                                                 entity_values=[Value(**{field: v})]))
                    for v in values]
        assert entity_keys("user_id", pa.array(values), key_type, "proj", 3) == expected



def test_the_online_reader_makes_feasts_keys():
    from feast.value_type import ValueType

    from featureline.feature_store.online import OnlineReader, ViewLayout, _feast_keys

    cases = {"users": (ValueType.STRING, ["u1", "", "ünïcode", "x" * 300]),
             "items": (ValueType.INT64, [0, -3, 2**40, 2**63 - 1]),
             "days": (ValueType.INT32, [0, 7, -1])}  # no assembled form: Feast's functions
    views = {name: ViewLayout(name, f"{name}_id", value_type, ("f",), None)
             for name, (value_type, _) in cases.items()}
    reader = OnlineReader(None, "proj", 3, views, {}, "redis://unused")
    for name, (value_type, ids) in cases.items():
        expected = _feast_keys("proj", f"{name}_id", value_type, 3, ids)
        assert reader._redis_keys(views[name], ids) == expected, name
        assert reader._redis_keys(views[name], ids[:1]) == expected[:1], name  # cached
    # Ids of the wrong type or range take Feast's path: its keys, or its error.
    def outcome(make):
        try:
            return make()
        except Exception as error:  # the error's type is what is compared
            return type(error)

    for ids in (["7"], [2**64], [True]):
        ours = outcome(lambda: reader._redis_keys(views["items"], ids))  # noqa: B023
        feasts = outcome(lambda: _feast_keys("proj", "items_id", ValueType.INT64, 3, ids))  # noqa: B023
        assert ours == feasts, ids

def test_publishing_from_spark_writes_the_same_store(spark, tmp_path, job_output, redis_server):
    """Spark tasks writing their partitions: the same keys and bytes as one process, the same
    counts; over the store a second time, nothing changed."""
    single, parallel = fresh_db(redis_server, 10), fresh_db(redis_server, 11)
    project = copy_project(tmp_path, ttl="30d").feature_store
    end = _utc("2100-01-01")
    expected = publish(open_repo(project, job_output.output, url=single), end=end,
                       progress=lambda _: None)
    repo = open_repo(project, job_output.output, url=parallel)
    summary = publish(repo, end=end, spark=spark, progress=lambda _: None)
    assert _redis_dump(parallel) == _redis_dump(single)
    assert ({v.name: v.keys for v in summary.views}
            == {v.name: v.keys for v in expected.views})
    assert summary.keys_changed == expected.keys_changed == summary.keys
    again = publish(repo, full=True, end=end, spark=spark, progress=lambda _: None)
    assert (again.keys_changed, again.keys_removed) == (0, 0)


def _wait_for(url: str, process: subprocess.Popen, timeout_s: float = 120) -> None:
    import time
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, process.stdout.read() if process.stdout else ""
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except (urllib.error.URLError, ConnectionError):
            time.sleep(0.5)
    raise AssertionError(f"{url} did not answer in {timeout_s:.0f}s")


def test_feast_ui_and_feast_serve_on_our_repository(tmp_path, handmade_output, redis_server):
    """The guide's one-liners (docs/feature-store.md): `feast ui` lists our feature views,
    `feast serve` answers
    with the values `featureline publish` wrote."""
    import urllib.request

    config = copy_project(tmp_path)
    repo = Path(config.feature_store.repo)
    url = fresh_db(redis_server, 12)
    publish(open_repo(config.feature_store, handmade_output, url=url), progress=lambda _: None)
    env = {**os.environ, "FEATURELINE_OUTPUT": str(handmade_output),
           "FEAST_REDIS_CONNECTION": feast_connection_string(url)}
    ui_port, serve_port = free_port(), free_port()
    servers = [subprocess.Popen([str(BIN / "feast"), *command], cwd=repo, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
               for command in (["ui", "-h", "127.0.0.1", "-p", str(ui_port)],
                               ["serve", "-h", "127.0.0.1", "-p", str(serve_port)])]
    try:
        base = f"http://127.0.0.1:{ui_port}"
        _wait_for(f"{base}/health", servers[0])
        with urllib.request.urlopen(f"{base}/api/v1/feature_views?project=featureline",
                                    timeout=30) as answer:
            views = {v["spec"]["name"] for v in json.load(answer)["featureViews"]}
        assert views == {"user_features", "item_features"}
        serve = f"http://127.0.0.1:{serve_port}"
        _wait_for(f"{serve}/health", servers[1])
        body = json.dumps({"feature_service": "ranking",
                           "entities": {"user_id": ["u1", "u2"], "item_id": ["i2", "i1"]}})
        request = urllib.request.Request(f"{serve}/get-online-features", data=body.encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as answer:
            served = json.load(answer)
        names = served["metadata"]["feature_names"]
        values = {n: r["values"] for n, r in zip(names, served["results"], strict=True)}
        assert values["user_events"] == [7, 2] and values["item_events"] == [9, 5]
    finally:
        for server in servers:
            server.terminate()
            server.wait(timeout=30)


def test_entity_vectors_decode_to_what_feast_decodes_for_every_type():
    """Each feature type of metadata.json, missing values and NaN included: the entity
    vector the writer encodes, decoded by the reader, equals Feast's decoding of the value
    Feast's converter stores."""
    from datetime import datetime, timezone

    from feast.protos.feast.types.Value_pb2 import Value
    from feast.type_map import feast_value_type_to_python_type
    from feast.value_type import ValueType

    from featureline.feature_store.online import OnlineReader, ViewLayout
    from featureline.feature_store.writer import Layout, encode_values, encode_vectors

    stamp = datetime(2026, 1, 5, 12, 30, 15, 250_000, tzinfo=timezone.utc)
    columns = {
        "a_int": (ValueType.INT64, pa.array([3, None, -(2**40)], pa.int64())),
        "a_int32": (ValueType.INT32, pa.array([-7, 0, None], pa.int32())),
        "a_double": (ValueType.DOUBLE, pa.array([0.1, None, float("nan")], pa.float64())),
        "a_float": (ValueType.FLOAT, pa.array([0.3, float("nan"), None], pa.float32())),
        "a_string": (ValueType.STRING, pa.array(["x", None, "ünï"], pa.string())),
        "a_bool": (ValueType.BOOL, pa.array([True, False, None], pa.bool_())),
        "a_time": (ValueType.UNIX_TIMESTAMP, pa.array([stamp, None, stamp],
                                                      pa.timestamp("us", tz="UTC"))),
    }
    rows = pa.table({"id": ["e1", "e2", "e3"],
                     "event_timestamp": pa.array([stamp] * 3, pa.timestamp("us", tz="UTC")),
                     **{name: values for name, (_, values) in columns.items()}})
    layout = Layout("v", "id", ValueType.STRING,
                    tuple((name, kind) for name, (kind, _) in columns.items()),
                    "event_timestamp", "proj", 3)
    view = ViewLayout("v", "id", ValueType.STRING, tuple(columns), None,
                      timestamps=(list(columns).index("a_time"),))
    decoded = [OnlineReader._decode(view, vector) for vector in encode_vectors(rows, layout)]
    for index, (name, (kind, values)) in enumerate(columns.items()):
        feasts = [None if not raw else feast_value_type_to_python_type(Value.FromString(raw))
                  for raw in encode_values(values, kind)]
        assert [values_[index] for values_, _ in decoded] == feasts, name
    assert {seconds for _, seconds in decoded} == {int(stamp.timestamp())}
