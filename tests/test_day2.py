"""Day 2: the job run again on a grown log keeps every id it gave, extends the vocabularies
and records their lineage; a refit starts a new one."""

from __future__ import annotations

import json
import shutil
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import redis
import yaml
from fastapi.testclient import TestClient

from featureline.api.app import create_app
from featureline.core.metadata import compatible
from featureline.etl import job
from featureline.feature_store.online import OnlineReader
from featureline.feature_store.publication import STORE_LAYOUT, publication_key
from featureline.feature_store.publish import publish
from featureline.feature_store.repo import open_repo
from featureline.hps.formats import write_hugectr
from tests.feast_data import copy_project, fresh_db, write_handmade_output
from tests.job_config import make_config


def _vocabulary(output: Path, column: str) -> dict[str, int]:
    table = pd.read_parquet(output / "artifacts" / "categorify" / column)
    return dict(zip(table["value"], table["id"], strict=True))


def _time(line: str) -> pd.Timestamp | None:
    """An event's time as the log holds it (ISO text or epoch s/ms); None when unreadable."""
    try:
        ts = json.loads(line).get("ts")
        if isinstance(ts, int | float):
            return pd.Timestamp(ts, unit="ms" if ts > 1e11 else "s", tz="UTC")
        return pd.Timestamp(ts).tz_convert("UTC") if ts else None
    except (ValueError, TypeError, AttributeError):
        return None


def _first_days(log: Path, target: Path, days: int) -> Path:
    """The log's events of its first ``days`` days, and its unreadable lines."""
    lines = log.read_text().splitlines()
    times = [_time(line) for line in lines]
    first = min(t for t in times if t is not None and t.year >= 2020).normalize()
    cutoff = first + pd.Timedelta(days=days)
    target.write_text("\n".join(line for line, t in zip(lines, times, strict=True)
                                if t is None or t < cutoff) + "\n")
    return target


@pytest.fixture(scope="session")
def day2(spark, small_log, tmp_path_factory):
    """Day 1 on the log's first four days, day 2 on all six into the same output; day 1's
    output copied aside before day 2 replaced it."""
    root = tmp_path_factory.mktemp("day2")
    config = make_config(root, _first_days(small_log, root / "day1.jsonl", days=4))
    first = job.run(config, spark, progress=lambda _: None)
    kept = root / "day1-output"
    shutil.copytree(first.output, kept)
    grown = make_config(root, small_log)
    second = job.run(grown, spark, progress=lambda _: None)
    return kept, second.output, grown


def test_day_two_keeps_every_id_and_numbers_new_values_after_them(day2):
    day1, day2_output, _ = day2
    for column in ("user_id", "item_id", "category"):
        before, after = _vocabulary(day1, column), _vocabulary(day2_output, column)
        assert {value: after[value] for value in before} == before
        new = set(after) - set(before)
        assert new or column == "category", f"the grown log brings new {column} values"
        assert sorted(after[v] for v in new) == list(range(max(before.values()) + 1,
                                                           max(after.values()) + 1))
        assert new or after == before
        # Contiguous from 2: the embedding plan's cardinality is the table size.
        assert sorted(after.values()) == list(range(2, len(after) + 2))


def test_examples_and_entities_use_the_extended_ids(day2):
    _, output, _ = day2
    users = _vocabulary(output, "user_id")
    examples = pd.read_parquet(output / "examples")
    assert (examples["user_id"].map(users).fillna(1) == examples["user_id_cat"]).all()
    snapshots = pd.read_parquet(output / "entities" / "user")
    assert (snapshots["user_id"].map(users).fillna(1) == snapshots["user_id_cat"]).all()
    metadata = json.loads((output / "metadata.json").read_text())
    plan = metadata["embedding_plan"]["features"]["user_id_cat"]
    assert plan["cardinality"] == len(users) + 2


def test_metadata_records_versions_and_their_lineage(day2):
    day1, output, _ = day2
    first = json.loads((day1 / "metadata.json").read_text())
    second = json.loads((output / "metadata.json").read_text())
    for column, entry in second["vocabularies"].items():
        parent = first["vocabularies"][column]
        assert entry["parent"] in (parent["version"], parent["parent"])
        assert entry["lineage"][:len(parent["lineage"])] == parent["lineage"]
        assert compatible(entry["lineage"], parent["lineage"])
    assert second["vocabularies"]["user_id"]["parent"] == first["vocabularies"]["user_id"][
        "version"]
    assert second["dataset"]["version"] != first["dataset"]["version"]
    assert second["dataset"]["vocabularies"] == {
        c: v["version"] for c, v in second["vocabularies"].items()}
    assert first["dataset"]["extends"] is None
    assert second["dataset"]["extends"] == str(Path(output).resolve())
    created = datetime.fromisoformat(second["created_at"])
    assert created <= datetime.now(timezone.utc)


def test_a_refit_starts_a_new_lineage(spark, day2, tmp_path):
    _, output, grown = day2
    refit = job.run(grown.model_copy(update={
        "output": grown.output.model_copy(update={"path": str(tmp_path / "refit")}),
        "vocabulary": grown.vocabulary.model_copy(update={"refit": True})}),
        spark, progress=lambda _: None)
    extended = json.loads((output / "metadata.json").read_text())["vocabularies"]["user_id"]
    fresh = refit.metadata["vocabularies"]["user_id"]
    assert fresh["parent"] is None and fresh["lineage"] == [fresh["version"]]
    assert not compatible(fresh["lineage"], extended["lineage"])
    # Fitted afresh on all six days: ids by descending frequency again, not day 1's.
    assert _vocabulary(tmp_path / "refit", "user_id") != _vocabulary(output, "user_id")


def test_vocabulary_from_extends_another_output(spark, day2, tmp_path):
    day1, _, grown = day2
    other = job.run(grown.model_copy(update={
        "output": grown.output.model_copy(update={"path": str(tmp_path / "other")}),
        "vocabulary": grown.vocabulary.model_copy(update={"previous": str(day1)})}),
        spark, progress=lambda _: None)
    before = _vocabulary(day1, "item_id")
    after = _vocabulary(other.output, "item_id")
    assert {value: after[value] for value in before} == before
    assert other.metadata["dataset"]["extends"] == str(day1.resolve())


# --- day 2 served: the online store, the embedding tables and the API agree ---------------

EMBEDDED = {"user_id": "user", "item_id": "item"}
DIM = 4


def _embedding_tables(output: Path, root: Path) -> Path:
    """Tables whose row k starts with k, tagged with the output's vocabulary versions, and an
    hps.yaml over them (its own RocksDB folder)."""
    metadata = json.loads((output / "metadata.json").read_text())
    tables = []
    for column, name in EMBEDDED.items():
        rows = metadata["embedding_plan"]["features"][f"{column}_cat"]["cardinality"]
        vectors = np.zeros((rows, DIM), dtype=np.float32)
        vectors[:, 0] = np.arange(rows)
        write_hugectr(root / "tables" / name, np.arange(rows, dtype=np.int64), vectors)
        tables.append({"name": name, "dim": DIM, "source": str(root / "tables" / name),
                       "vocabulary_version": metadata["vocabularies"][column]["version"],
                       "fit_version": metadata["fit"]["version"]})
    hps_yaml = root / "hps.yaml"
    hps_yaml.write_text(yaml.safe_dump({"models": [{"name": "ranker", "tables": tables}],
                                        "persistent_db": {"path": str(root / "rocksdb")},
                                        "cache_device": "cpu"}))
    return hps_yaml


def _client(config, output: Path, hps_yaml: Path, url: str) -> TestClient:
    settings = config.serving().model_copy(update={"api": config.api.model_copy(update={
        "hps": str(hps_yaml), "auth": config.api.auth.model_copy(update={"enabled": False})})})
    return TestClient(create_app(settings, output=output, redis_url=url))


@pytest.fixture(scope="module")
def served(day2, redis_server, tmp_path_factory):
    """Day 1 published and served, then day 2 published into the same store."""
    day1, output, _ = day2
    root = tmp_path_factory.mktemp("served")
    config = copy_project(root, ttl="3650d")
    url = fresh_db(redis_server, 11)
    first = publish(open_repo(config.feature_store, day1, url=url), progress=lambda _: None)
    second = publish(open_repo(config.feature_store, output, url=url), progress=lambda _: None)
    return config, url, first, second, root


def test_day_two_publish_replaces_the_dataset_and_stamps_the_store(day2, served):
    _, output, _ = day2
    config, url, first, second, _ = served
    metadata = json.loads((output / "metadata.json").read_text())
    assert first.mode == "replace" and first.replaced is None
    assert second.mode == "replace" and second.replaced == first.dataset_version
    assert second.dataset_version == metadata["dataset"]["version"]
    assert second.keys_changed > 0
    reader = OnlineReader.from_store(open_repo(config.feature_store, output, url=url).store,
                                     url)
    stamp = reader.publication()
    assert stamp.dataset_version == second.dataset_version
    assert stamp.vocabularies["user_id"] == metadata["vocabularies"]["user_id"]["lineage"]
    # Online values are day 2's latest snapshot of every user.
    snapshots = pd.read_parquet(output / "entities" / "user").sort_values("event_timestamp")
    latest = snapshots.groupby("user_id").last()
    online = reader.read(reader.references(features=["user_features:user_events",
                                                     "user_features:user_id_cat"]),
                         {"user_id": list(latest.index)})
    assert online.values["user_events"] == latest["user_events"].tolist()
    assert online.values["user_id_cat"] == latest["user_id_cat"].tolist()


def test_the_api_the_store_and_the_embeddings_agree_on_every_id(day2, served):
    _, output, _ = day2
    config, url, _, _, root = served
    users = _vocabulary(output, "user_id")
    items = _vocabulary(output, "item_id")
    sample_users = sorted(users)[::max(1, len(users) // 15)]
    with _client(config, output, _embedding_tables(output, root / "day2"), url) as client:
        ready = client.get("/readyz")
        assert ready.status_code == 200, ready.json()
        assert ready.headers["X-Featureline-Dataset-Version"] == ready.json()[
            "versions"]["dataset_version"]
        candidates = sorted(items)[:5]
        for user in sample_users:
            body = client.post("/v1/ranking-inputs",
                               json={"user_id": user, "item_ids": candidates}).json()
            (encoded,) = body["user"]["encoded_ids"]
            assert encoded == users[user]
            assert body["user"]["values"]["user_id_cat"] == [encoded]
            assert body["embeddings"]["user_id_cat"]["vectors"][0][0] == encoded
            assert body["items"]["encoded_ids"] == [items[i] for i in candidates]
            assert [v[0] for v in body["embeddings"]["item_id_cat"]["vectors"]] == [
                items[i] for i in candidates]


def test_a_value_changed_under_the_same_snapshot_time_is_republished(tmp_path, redis_server):
    output = write_handmade_output(tmp_path / "output")
    metadata = json.loads((output / "metadata.json").read_text())
    metadata["dataset"] = {"version": "run-1"}
    (output / "metadata.json").write_text(json.dumps(metadata))
    config = copy_project(tmp_path, ttl="3650d")
    url = fresh_db(redis_server, 12)
    publish(open_repo(config.feature_store, output, url=url), progress=lambda _: None)
    path = next((output / "entities" / "user").glob("*.parquet"))
    table = pd.read_parquet(path)
    table.loc[table["user_id"] == "u2", "user_events"] = 42  # same event_timestamp
    table.to_parquet(path, index=False)
    metadata["dataset"] = {"version": "run-2"}
    (output / "metadata.json").write_text(json.dumps(metadata))
    repo = open_repo(config.feature_store, output, url=url)
    summary = publish(repo, progress=lambda _: None)
    assert summary.mode == "replace" and summary.keys_changed == 1
    reader = OnlineReader.from_store(repo.store, url)
    online = reader.read(reader.references(features=["user_features:user_events"]),
                         {"user_id": ["u1", "u2"]})
    assert online.values["user_events"] == [7, 42]
    # The same dataset again: incremental, nothing rewritten.
    again = publish(repo, progress=lambda _: None)
    assert again.mode == "incremental" and again.replaced is None
    # A stamp of an older key layout (written before the field existed): the same dataset is
    # written again whole, under the names read now, in a new generation.
    stamp = redis.Redis.from_url(url)
    stamp.hdel(publication_key(repo.store.project), "layout")
    rewritten = publish(repo, progress=lambda _: None)
    assert rewritten.mode == "replace" and rewritten.generation > again.generation
    assert int(stamp.hget(publication_key(repo.store.project), "layout")) == STORE_LAYOUT
    assert publish(repo, progress=lambda _: None).mode == "incremental"


def test_tables_trained_on_another_fit_are_not_ready_until_trained_again(day2, served,
                                                                         tmp_path):
    """Day 1's tables over day 2's output: the ids agree (day 2 extends day 1's
    vocabularies), but day 2 fitted its statistics anew, so the model those tables belong to
    learned from inputs day 2 no longer writes."""
    day1, output, _ = day2
    config, url, _, _, _ = served
    fits = [json.loads((path / "metadata.json").read_text())["fit"]["version"]
            for path in (day1, output)]
    assert fits[0] != fits[1]
    with _client(config, output, _embedding_tables(day1, tmp_path / "day1-tables"),
                 url) as client:
        ready = client.get("/readyz")
        assert ready.status_code == 503
        versions = ready.json()["versions"]
        assert versions["fit"] == fits[1]
        assert versions["embedding_fits"] == {"ranker/item": fits[0], "ranker/user": fits[0]}
        assert versions["problems"] == [
            f"embeddings ranker/{name}: trained on examples of fit {fits[0]}; the API's "
            f"dataset {versions['dataset_version']} is of fit {fits[1]}: train on it and "
            "reload the model" for name in ("item", "user")]


def _skew_count(client: TestClient) -> float:
    """``featureline_version_skew_total`` as /metrics exports it."""
    (line,) = [line for line in client.get("/metrics").text.splitlines()
               if line.startswith("featureline_version_skew_total ")]
    return float(line.split()[1])


def test_a_refit_is_not_ready_until_store_and_embeddings_follow_it(day2, served, spark,
                                                                  tmp_path):
    _, output, grown = day2
    config, url, _, _, _ = served
    refit = job.run(grown.model_copy(update={
        "output": grown.output.model_copy(update={"path": str(tmp_path / "refit")}),
        "vocabulary": grown.vocabulary.model_copy(update={"refit": True})}),
        spark, progress=lambda _: None).output
    day2_tables = _embedding_tables(output, tmp_path / "day2-tables")
    with _client(config, refit, day2_tables, url) as client:
        skewed = _skew_count(client)
        ready = client.get("/readyz")
        assert ready.status_code == 503
        problems = ready.json()["versions"]["problems"]
        assert any(p.startswith("online store: user_id") for p in problems)
        assert any(p.startswith("embeddings ranker/user") for p in problems)
        assert _skew_count(client) == skewed + 1
    publish(open_repo(config.feature_store, refit, url=url), progress=lambda _: None)
    refit_tables = _embedding_tables(refit, tmp_path / "refit-tables")
    with _client(config, refit, refit_tables, url) as client:
        ready = client.get("/readyz")
        assert ready.status_code == 200, ready.json()
        assert ready.json()["versions"]["problems"] == []
