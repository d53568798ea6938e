"""Feature logging and online/offline consistency: the API's logged rows equal its answers,
`featureline consistency` finds exactly what differs between the served values and the ETL
output (an offline value altered, a value changed in Redis behind the API's back), the
sample keeps all requests of its entities, a killed API leaves only whole files, and a
training set built from the log holds the served values. Real Redis, Feast, DuckDB and API
processes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import httpx
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
import redis
import yaml
from click.testing import CliRunner
from fastapi.testclient import TestClient

from featureline.api.app import create_app
from featureline.api.feature_log import sampled
from featureline.cli import main
from featureline.core.aggregations import GroupSpec
from featureline.core.metadata import read_metadata
from featureline.feature_store.consistency import check_consistency
from featureline.feature_store.definitions import build
from featureline.feature_store.feature_log import feature_types, log_schema
from featureline.feature_store.online_store import open_online_store
from featureline.feature_store.publish import publish
from featureline.feature_store.redis_server import free_port
from featureline.feature_store.repo import open_repo
from featureline.feature_store.tiles import (
    decode_key_tiles,
    encode_key_tiles,
    tile_key,
    tiles_prefix,
)
from featureline.feature_store.training_set import training_set_from_log
from tests.feast_data import copy_project, fresh_db

BIN = Path(sys.executable).parent


def _ids(output: Path, entity: str, key: str) -> list[str]:
    table = read_metadata(output).entities[entity]
    return sorted(set(ds.dataset(output / table.path).to_table(columns=[key])[key]
                      .to_pylist()))


def _log_rows(log: Path) -> list[dict]:
    files = sorted(log.rglob("*.parquet"), key=lambda p: p.name.rsplit("-", 2)[-2:])
    return [row for f in files for row in pq.read_table(f).to_pylist()]


def _settings(root: Path, output: Path, log: Path, **logging) -> dict:
    return {"auth": {"enabled": False}, "data": str(output), "feature_cache": {"ttl_s": 0},
            "feature_logging": {"path": str(log), "roll_s": 0.2, **logging}}


@pytest.fixture(scope="module")
def served(tmp_path_factory, redis_server, job_output):
    """Requests answered by an API that logs them; one user's user_events changed in Redis
    (its tiles) behind the API's back first."""
    root = tmp_path_factory.mktemp("consistency")
    output = job_output.output
    log = root / "log"
    config = copy_project(root, ttl="3650d", api=_settings(root, output, log))
    url = fresh_db(redis_server, 13)
    repo = open_repo(config.feature_store, output, url=url)
    publish(repo, progress=lambda _: None)
    users, items = _ids(output, "user", "user_id")[:12], _ids(output, "item", "item_id")[:12]
    changed = users[1]
    # Its lifetime count in its tiles, which the API merges at the request time.
    group = read_metadata(output).entities["user"].group
    assert group is not None
    features_of = {f.output: f for f in GroupSpec.model_validate(group).outputs()}
    store = open_online_store(config.feature_store.redis_type, url)
    key = tiles_prefix(repo.store.project, store.publication(repo.store.project).generation,
                       "user") + tile_key([changed])
    client = redis.Redis.from_url(url)
    tiles = decode_key_tiles(features_of, client.get(key))
    tiles["user_events"] = {0: tiles["user_events"][0] + 100}
    client.set(key, encode_key_tiles(features_of, tiles))
    client.close()
    store.close()
    with TestClient(create_app(config.serving(), output=output, redis_url=url)) as client:
        features = client.post("/v1/features", json={
            "service": "ranking", "entities": {"user_id": [*users, "nobody"],
                                               "item_id": [*items, "nothing"]}})
        assert features.status_code == 200, features.text
        ranking = [client.post("/v1/ranking-inputs", json={"user_id": user,
                                                           "item_ids": items[:4]})
                   for user in users[:3]]
        assert all(r.status_code == 200 for r in ranking), ranking[0].text
    # Leaving the client stopped the app, which wrote what it had queued.
    return {"root": root, "log": log, "output": output, "config": config, "users": users,
            "items": items, "changed": changed, "features": features.json(),
            "ranking": [r.json() for r in ranking]}


def test_logged_rows_equal_what_the_client_got(served):
    rows = _log_rows(served["log"])
    by_request: dict[str, list[dict]] = {}
    for row in rows:
        by_request.setdefault(row["request_id"], []).append(row)
    features, *ranking = by_request.values()
    answer = served["features"]
    assert [r["user_id"] for r in features] == [*served["users"], "nobody"]
    assert [r["item_id"] for r in features] == [*served["items"], "nothing"]
    for name in answer["names"]:
        assert [r[name] for r in features] == answer["values"][name], name
        assert [r[f"{name}__status"] for r in features] == answer["status"][name], name
    assert {r["endpoint"] for r in features} == {"features"}
    assert {r["dataset_version"] for r in rows} == {read_metadata(served["output"])
                                                    .dataset_version}
    assert len(ranking) == 3
    for logged, answer in zip(ranking, served["ranking"], strict=True):
        user, *candidates = logged
        assert user["item_id"] is None and user["user_id"] == answer["user"]["ids"][0]
        for name, values in answer["user"]["values"].items():
            assert user[name] == values[0], name
            assert all(c[name] is None for c in candidates)
        assert [c["item_id"] for c in candidates] == answer["items"]["ids"]
        assert {c["user_id"] for c in candidates} == {user["user_id"]}
        for name, values in answer["items"]["values"].items():
            assert [c[name] for c in candidates] == values, name
            assert [c[f"{name}__status"] for c in candidates] == answer["items"]["status"][name]


def _reports(log: Path, output: Path, config) -> dict:
    report = check_consistency(log, output, config.feature_store, top=10)
    return {f.feature: f for f in report.features}


def test_consistency_reports_only_the_value_changed_in_redis(served):
    reports = _reports(served["log"], served["output"], served["config"])
    changed = served["changed"]
    for name, report in reports.items():
        assert report.compared > 0, name
        assert report.missing == report.extra == report.streamed == 0, name
        if name != "user_events":
            assert report.mismatch == 0, (name, report.top)
    events = reports["user_events"]
    # Its row of /v1/features and its user row of /v1/ranking-inputs.
    assert events.mismatch == 2
    assert [(t["entity"], t["rows"], t["served"] - t["offline"]) for t in events.top] == [
        (changed, 2, 100)]
    assert events.smape > 0


def test_consistency_reports_exactly_the_entities_altered_offline(served, tmp_path):
    """An encoded id altered in the item table's snapshots: exactly those items' rows."""
    altered = tmp_path / "output"
    shutil.copytree(served["output"], altered)
    table = read_metadata(altered).entities["item"]
    targets = served["items"][2:4]
    for path in (altered / table.path).rglob("*.parquet"):
        rows = pq.read_table(path)
        hit = pc.is_in(rows["item_id"], pa.array(targets))
        ids = pc.if_else(hit, pc.add(rows["item_id_cat"], 7), rows["item_id_cat"])
        rows = rows.set_column(rows.schema.get_field_index("item_id_cat"), "item_id_cat", ids)
        pq.write_table(rows, path)
    reports = _reports(served["log"], altered, served["config"])
    item_ids = reports["item_id_cat"]
    # Each candidate of the features request once, and of the three ranking requests.
    assert sorted(t["entity"] for t in item_ids.top) == sorted(targets)
    assert item_ids.mismatch == 2 * 4 and {t["rows"] for t in item_ids.top} == {4}
    assert {t["served"] - t["offline"] for t in item_ids.top} == {-7}
    assert all(r.mismatch == 0 for n, r in reports.items()
               if n not in ("item_id_cat", "user_events"))


def test_the_consistency_command_gates_and_exports_metrics(served, tmp_path):
    config_file = tmp_path / "featureline.yaml"
    config_file.write_text(yaml.safe_dump(served["config"].model_dump(mode="json",
                                                                       exclude={"etl"})))
    metrics = tmp_path / "consistency.prom"
    run = CliRunner().invoke(main, [
        "consistency", "--config", str(config_file), "--log", str(served["log"]), "--data",
        str(served["output"]), "--json", "--metrics-file", str(metrics)])
    assert run.exit_code == 1, run.output  # the value changed in Redis
    report = json.loads(run.output)
    assert report["passed"] is False
    assert {f["feature"]: f["mismatch"] for f in report["features"]}["user_events"] == 2
    text = metrics.read_text()
    assert "featureline_consistency_passed 0" in text
    assert 'featureline_consistency_rows{feature="user_events",kind="mismatch"} 2' in text
    lenient = CliRunner().invoke(main, [
        "consistency", "--config", str(config_file), "--log", str(served["log"]), "--data",
        str(served["output"]), "--max-mismatch", "0.5"])
    assert lenient.exit_code == 0, lenient.output
    assert lenient.output.splitlines()[-1].startswith("PASSED")
    missing = CliRunner().invoke(main, ["consistency", "--config", str(config_file), "--log",
                                        str(tmp_path / "nowhere"), "--data",
                                        str(served["output"])])
    assert missing.exit_code != 0 and "no such file or folder" in str(missing.exception or
                                                                      missing.output)


def test_a_sample_keeps_every_request_of_a_tenth_of_the_users(tmp_path, redis_server,
                                                              job_output):
    output = job_output.output
    log = tmp_path / "log"
    config = copy_project(tmp_path, ttl="3650d", api=_settings(tmp_path, output, log,
                                                               sample=0.1))
    url = fresh_db(redis_server, 14)
    publish(open_repo(config.feature_store, output, url=url), progress=lambda _: None)
    users = [f"visitor-{n}" for n in range(400)]
    with TestClient(create_app(config.serving(), output=output, redis_url=url)) as client:
        for _ in range(2):  # every request of a sampled user is kept
            assert client.post("/v1/features", json={
                "features": ["user_features:user_events"],
                "entities": {"user_id": users}}).status_code == 200
        for user in users[:60]:
            assert client.post("/v1/ranking-inputs", json={
                "user_id": user, "item_ids": ["i1"]}).status_code == 200
    rows = _log_rows(log)
    chosen = {u for u in users if sampled(u, 0.1)}
    assert 20 <= len(chosen) <= 60
    features = [r["user_id"] for r in rows if r["endpoint"] == "features"]
    assert sorted(features) == sorted([*chosen, *chosen])
    ranked = {r["user_id"] for r in rows if r["endpoint"] == "ranking-inputs"}
    assert ranked == chosen & set(users[:60])


def test_a_killed_api_leaves_only_whole_log_files_one_set_per_worker(tmp_path, redis_server,
                                                                     job_output):
    output = job_output.output
    log = tmp_path / "log"
    config = copy_project(tmp_path, ttl="3650d", api=_settings(tmp_path, output, log))
    url = fresh_db(redis_server, 15)
    publish(open_repo(config.feature_store, output, url=url), progress=lambda _: None)
    port = free_port()
    settings = config.model_dump(mode="json", exclude={"etl"})
    settings["api"]["port"] = port
    config_file = tmp_path / "featureline.yaml"
    config_file.write_text(yaml.safe_dump(settings))
    server = subprocess.Popen([str(BIN / "featureline"), "serve", "--config", str(config_file),
                               "--workers", "2", "--no-stream"],
                              env={**os.environ, "REDIS_URL": url}, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    users = _ids(output, "user", "user_id")[:50]
    stop = threading.Event()

    def load() -> None:
        with httpx.Client(base_url=base, timeout=10) as client:
            n = 0
            while not stop.is_set():
                n += 1
                try:
                    client.post("/v1/features", json={"service": "ranking", "entities": {
                        "user_id": users, "item_id": ["i1"] * len(users)}}, headers={
                            "Connection": "close" if n % 2 else "keep-alive"})
                except httpx.HTTPError:
                    time.sleep(0.1)

    def workers() -> set[str]:
        return {p.name.split("-")[-3] for p in log.rglob("*.parquet")}

    threads = [threading.Thread(target=load) for _ in range(4)]
    try:
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 120
        while len(workers()) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(0.5)  # files being written now
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(timeout=30)
        stop.set()
        for thread in threads:
            thread.join()
    assert len(workers()) == 2
    files = list(log.rglob("*.parquet"))
    for path in files:  # every published file reads whole
        table = pq.read_table(path)
        assert table.num_rows % len(users) == 0 and table.num_rows > 0
    assert all(p.name.startswith(".") for p in log.rglob("*") if p.is_file()
               and p not in files)


def test_a_training_set_from_the_log_holds_the_served_values(tmp_path, job_output):
    output = job_output.output
    metadata = read_metadata(output)
    examples = ds.dataset(output / "examples", partitioning="hive").to_table(
        columns=["user_id", "item_id", "ts", metadata.label.name]).to_pylist()
    chosen = sorted(examples, key=lambda e: (e["ts"], e["user_id"], e["item_id"]))[:4]
    types = feature_types(build(output, copy_project(tmp_path).feature_store).views)
    schema = log_schema(types)
    rows = []
    for n, example in enumerate(chosen):
        at = example["ts"] - timedelta(seconds=30)
        user = {"request_id": f"r{n}", "request_time": at, "endpoint": "ranking-inputs",
                "user_id": example["user_id"], "user_events": 100 + n,
                "user_events__status": "present"}
        candidate = {"request_id": f"r{n}", "request_time": at, "endpoint": "ranking-inputs",
                     "user_id": example["user_id"], "item_id": example["item_id"],
                     "item_events": 200 + n, "item_events__status": "present"}
        rows += [user, candidate]
    # Served after the pair's last event: no label follows, left out.
    last = max((e for e in examples if (e["user_id"], e["item_id"]) ==
                (chosen[0]["user_id"], chosen[0]["item_id"])), key=lambda e: e["ts"])
    rows.append({"request_id": "late", "request_time": last["ts"] + timedelta(seconds=1),
                 "endpoint": "features", "user_id": last["user_id"],
                 "item_id": last["item_id"], "user_events": 1, "user_events__status": "present"})
    log = tmp_path / "log" / "date=2026-01-01"
    log.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), log / "features-a.parquet")
    summary = training_set_from_log(tmp_path / "log", output, tmp_path / "train.parquet",
                                    label_window_s=60)
    got = pq.read_table(tmp_path / "train.parquet").to_pylist()
    assert summary.rows == len(got) == len(chosen)
    label = metadata.label.name
    for n, (row, example) in enumerate(zip(got, chosen, strict=True)):
        assert (row["user_id"], row["item_id"], row[label]) == (
            example["user_id"], example["item_id"], example[label])
        assert (row["user_events"], row["item_events"]) == (100 + n, 200 + n)
