"""The ranking API with a real Redis server, real Feast data, a real parameter server
(RocksDB) and the ETL's vocabularies; fuzzed through its OpenAPI document."""

from __future__ import annotations

import json
import time

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from featureline.api.app import create_app
from featureline.api.models import FeaturesResponse, RankingInputsResponse
from featureline.config import parse_config
from featureline.core import redis as redis_clients
from featureline.feature_store.online import OnlineReader, ValueCache
from featureline.feature_store.publication import publication_key
from featureline.feature_store.publish import publish
from featureline.feature_store.redis_server import EmbeddedRedis
from featureline.feature_store.repo import open_repo
from featureline.feature_store.writer import vector_prefix
from featureline.hps.formats import write_hugectr
from tests.feast_data import copy_project, encoded_id, fresh_db, write_handmade_output

READ = {"Authorization": "Bearer reader-key"}
ADMIN = {"Authorization": "Bearer admin-key"}
DIM = 8
TABLE_ROWS = 6  # encoded ids 0 .. 5 (padding, out of vocabulary, then the known ids)


def table_vectors(table: str) -> np.ndarray:
    """Row k of table ``table``: recognisable per table and per key."""
    offset = {"user": 100.0, "item": 200.0}[table]
    return (offset + np.arange(TABLE_ROWS)[:, None] * 10 + np.arange(DIM)).astype(np.float32)


@pytest.fixture(scope="module")
def api_setup(tmp_path_factory, redis_server):
    root = tmp_path_factory.mktemp("api")
    output = write_handmade_output(root / "output")
    for table in ("user", "item"):
        write_hugectr(root / "tables" / table, np.arange(TABLE_ROWS, dtype=np.int64),
                      table_vectors(table))
    hps_yaml = root / "hps.yaml"
    hps_yaml.write_text(f"""
models:
  - name: ranker
    cache_fraction: 0.5
    tables:
      - {{name: user, dim: {DIM}, source: {root / "tables" / "user"}}}
      - {{name: item, dim: {DIM}, source: {root / "tables" / "item"}, default_value: -1.0}}
persistent_db: {{path: {root / "rocksdb"}}}
cache_device: cpu
""")
    keys = root / "api-keys"
    keys.write_text("# key scope\nreader-key read\nadmin-key admin\n")
    config = copy_project(root, ttl="3650d", api={
        "hps": str(hps_yaml), "auth": {"keys_file": str(keys)},
        "limits": {"max_entities": 5, "max_keys": 50, "max_body_bytes": 4096,
                   "max_response_values": 200}})
    url = fresh_db(redis_server, 8)
    repo = open_repo(config.feature_store, output, url=url)
    publish(repo, progress=lambda _: None)
    return {"config": config, "output": output, "url": url, "repo": repo, "root": root}


@pytest.fixture(scope="module")
def client(api_setup):
    application = create_app(api_setup["config"].serving(), output=api_setup["output"],
                             redis_url=api_setup["url"])
    # Runs the lifespan (services open), and every request on one event loop, as a server
    # does (the online store's asyncio connections belong to it).
    with TestClient(application) as test_client:
        yield test_client


@pytest.fixture(scope="module")
def app(client):
    return client.app


def test_features_equal_what_feasts_sdk_returns(client, api_setup):
    users, items = ["u1", "u2", "nobody"], ["i2", "i1", "i1"]
    response = client.post("/v1/features", headers=READ, json={
        "service": "ranking", "entities": {"user_id": users, "item_id": items}})
    assert response.status_code == 200, response.text
    body = response.json()
    FeaturesResponse.model_validate(body)  # the documented shape
    store = api_setup["repo"].store
    sdk = store.get_online_features(
        features=store.get_feature_service("ranking"),
        entity_rows=[{"user_id": u, "item_id": i} for u, i in zip(users, items, strict=True)],
    ).to_dict()
    assert set(body["names"]) == set(sdk) - {"user_id", "item_id"}
    for name in body["names"]:
        assert body["values"][name] == sdk[name], name
    assert body["values"]["user_events"] == [7, 2, None]
    assert body["status"]["user_events"] == ["present", "present", "not_found"]
    assert body["status"]["item_events"] == ["present"] * 3


def test_features_at_a_time_of_the_log(client):
    """``at`` reads the values as of then; a time outside the supported range is a 422."""
    at = client.post("/v1/features", headers=READ, json={
        "features": ["user_features:user_events"], "entities": {"user_id": ["u2", "u1"]},
        "at": "2026-01-06T00:00:00Z"})
    assert at.status_code == 200, at.text
    assert at.json()["values"] == {"user_events": [2, 7]}
    assert at.json()["status"] == {"user_events": ["present", "present"]}
    bad = client.post("/v1/features", headers=READ, json={
        "features": ["user_features:user_events"], "entities": {"user_id": ["u1"]},
        "at": "not a time"})
    assert bad.status_code == 422 and "at" in bad.text


# Requests the fuzzer found answered 500, or 200 against the schema; each is a 422 naming
# its field. The bodies are raw JSON text: a lone surrogate ("\\ud800") is valid JSON.
SURROGATE = "\\ud800"
UNREADABLE = [
    ("/v1/features", f'{{"features": ["user_features:user_events"], '
                     f'"entities": {{"user_id": ["{SURROGATE}"]}}}}', "entities.user_id.0"),
    ("/v1/features", f'{{"features": ["user_features:user_events"], '
                     f'"entities": {{"{SURROGATE}": ["u1"]}}}}', "entities"),
    ("/v1/ranking-inputs", f'{{"user_id": "{SURROGATE}", "item_ids": ["i1"]}}', "user_id"),
    ("/v1/model-inputs", f'{{"user_id": "u1", "item_ids": ["{SURROGATE}"]}}', "item_ids.0"),
    ("/v1/rank", f'{{"user_id": "u1", "item_ids": ["i1"], "model": "ranker", '
                 f'"context": {{"device": "{SURROGATE}"}}}}', "context.device"),
    ("/v1/push", f'{{"events": [{{"user_id": "{SURROGATE}", "item_id": "i1"}}]}}', "events"),
    ("/v1/model-inputs", '{"user_id": "u1", "item_ids": ["i1"], '
                         '"at": "9999-12-31T23:59:59.999999Z"}', "at"),
    ("/v1/rank", '{"user_id": "u1", "item_ids": ["i1"], "model": "ranker", '
                 '"at": "9999-12-31T10:00:00-14:00"}', "at"),
    ("/v1/features", '{"features": ["user_features:user_events"], '
                     '"entities": {"user_id": ["u1"]}, "at": "1969-12-31T23:00:00Z"}', "at"),
    ("/v1/rank", '{"user_id": "u1", "item_ids": ["i1", "i2"], "model": "ranker", '
                 '"item_context": {"price": [1e309, 2]}}', "item_context.price.0"),
    ("/v1/model-inputs", '{"user_id": "u1", "item_ids": ["i1"], '
                         '"item_context": {"price": [NaN]}}', "item_context.price.0"),
    ("/v1/model-inputs", '{"user_id": "u1", "item_ids": ["i1"], '
                         '"context": {"device": Infinity}}', "context.device"),
    ("/v1/embeddings/lookup", '{"model": "ranker", "table": "user", "keys": [false]}',
     "keys.0"),
    ("/v1/embeddings/lookup", '{"model": "ranker", "table": "user", "keys": ["2"]}', "keys.0"),
    ("/v1/embeddings/lookup", '{"model": "ranker", "table": "user", "keys": [2.5]}', "keys.0"),
    ("/v1/ranking-inputs", '{"user_id": "u1", "item_ids": [false]}', "item_ids.0"),
    ("/v1/features", '{"features": ["user_features:user_events"], '
                     '"entities": {"user_id": [9223372036854775808]}}', "entities.user_id.0"),
    ("/v1/rank", '{"user_id": "u1", "item_ids": ["i1"], "model": "ranker", "top_k": true}',
     "top_k"),
]


@pytest.mark.parametrize(("path", "body", "field"), UNREADABLE)
def test_text_times_and_numbers_outside_the_contract_are_422s_naming_the_field(
        client, path, body, field):
    headers = {**(ADMIN if path == "/v1/push" else READ), "Content-Type": "application/json"}
    answer = client.post(path, headers=headers, content=body.encode())
    assert answer.status_code == 422, answer.text
    error = answer.json()
    assert error["error"] == "RequestValidationError"
    assert error["field"].startswith(field), error


@pytest.mark.parametrize("body", [b'{"user_id": "\xff\xfe"}', b"[" * 2_000 + b"]" * 2_000,
                                  b'{"user_id": "u1",'])
def test_a_body_that_is_no_json_document_is_a_422(client, body):
    answer = client.post("/v1/ranking-inputs", content=body,
                         headers={**READ, "Content-Type": "application/json"})
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"] == "RequestValidationError"


def test_features_by_reference_and_by_encoded_id(client):
    by_raw = client.post("/v1/features", headers=READ, json={
        "features": ["user_features:user_events"], "entities": {"user_id": ["u2", "u1"]}})
    by_encoded = client.post("/v1/features", headers=READ, json={
        "features": ["user_features:user_events"],
        "entities": {"user_id_cat": [encoded_id("u2"), encoded_id("u1")]}})
    assert by_raw.status_code == by_encoded.status_code == 200
    assert by_raw.json() == by_encoded.json()
    assert by_raw.json()["values"] == {"user_events": [2, 7]}


@pytest.mark.parametrize(("body", "status", "says"), [
    ({"service": "scoring", "entities": {"user_id": ["u1"]}}, 404, "unknown feature service"),
    ({"features": ["user_features:nope"], "entities": {"user_id": ["u1"]}}, 404,
     "unknown feature 'user_features:nope'"),
    ({"service": "ranking", "entities": {"user_id": ["u1"]}}, 422,
     "entities.item_id is required"),
    ({"service": "ranking", "entities": {"shop_id": ["s1"]}}, 422, "entities.shop_id"),
    ({"features": ["user_features:user_events"], "entities": {"user_id_cat": [1]}}, 422,
     "out-of-vocabulary"),
    ({"features": ["user_features:user_events"], "entities": {"user_id_cat": ["u1"]}}, 422,
     "entities.user_id_cat: encoded ids are integers"),
    ({"entities": {"user_id": ["u1"]}}, 422, "exactly one of service and features"),
    ({"service": "ranking", "entities": {"user_id": ["u1"], "item_id": []}}, 422,
     "same, non-zero length"),
])
def test_feature_errors_name_what_to_fix(client, body, status, says):
    response = client.post("/v1/features", headers=READ, json=body)
    assert response.status_code == status, response.text
    assert says in response.json()["message"]


def test_embedding_lookup_json_and_binary(client):
    keys = [3, 0, 3, 999]
    response = client.post("/v1/embeddings/lookup", headers=READ,
                           json={"model": "ranker", "table": "item", "keys": keys})
    assert response.status_code == 200, response.text
    vectors = np.array(response.json()["vectors"], dtype=np.float32)
    expected = table_vectors("item")
    np.testing.assert_array_equal(vectors[:3], expected[[3, 0, 3]])
    np.testing.assert_array_equal(vectors[3], np.full(DIM, -1.0))  # the table's default
    binary = client.post("/v1/embeddings/lookup", json={"model": "ranker", "table": "item",
                                                        "keys": keys},
                         headers={**READ, "Accept": "application/octet-stream"})
    assert binary.headers["content-type"] == "application/octet-stream"
    assert binary.headers["x-shape"] == f"4,{DIM}"
    np.testing.assert_array_equal(
        np.frombuffer(binary.content, dtype="<f4").reshape(4, DIM), vectors)


@pytest.mark.parametrize(("model", "table", "says"), [
    ("ranker", "shop", "shop"), ("scorer", "item", "scorer")])
def test_unknown_model_or_table_is_404(client, model, table, says):
    response = client.post("/v1/embeddings/lookup", headers=READ,
                           json={"model": model, "table": table, "keys": [1]})
    assert response.status_code == 404
    assert says in response.json()["message"]


def test_ranking_inputs_in_one_call(client):
    response = client.post("/v1/ranking-inputs", headers=READ,
                           json={"user_id": "u1", "item_ids": ["i2", "i9", "i1"]})
    assert response.status_code == 200, response.text
    body = response.json()
    RankingInputsResponse.model_validate(body)  # the documented shape
    assert body["user"]["encoded_ids"] == [encoded_id("u1")]
    assert body["items"]["encoded_ids"] == [encoded_id("i2"), 1, encoded_id("i1")]  # i9: OOV
    assert body["user"]["values"]["user_events"] == [7]
    assert body["items"]["values"]["item_events"] == [9, None, 5]
    assert body["items"]["status"]["item_events"] == ["present", "not_found", "present"]
    # The feature store's copy of the encoded id agrees with the vocabulary's.
    assert body["items"]["values"]["item_id_cat"] == [encoded_id("i2"), None, encoded_id("i1")]
    users = np.array(body["embeddings"]["user_id_cat"]["vectors"])
    items = np.array(body["embeddings"]["item_id_cat"]["vectors"])
    np.testing.assert_array_equal(users, table_vectors("user")[[encoded_id("u1")]])
    np.testing.assert_array_equal(items, table_vectors("item")[[4, 1, 3]])


def test_models_and_admin_reload(client, api_setup):
    models = client.get("/v1/embeddings/models", headers=READ).json()["models"]
    (ranker,) = models
    assert {t["name"]: (t["dim"], t["keys"]) for t in ranker["tables"]} == {
        "user": (DIM, TABLE_ROWS), "item": (DIM, TABLE_ROWS)}
    assert client.post("/v1/admin/models/ranker/reload", headers=READ).status_code == 403

    def encoded_items():
        return client.post("/v1/ranking-inputs", headers=READ, json={
            "user_id": "u1", "item_ids": ["i3", "i1"]}).json()["items"]["encoded_ids"]

    # The next day: a retrained table, and the ETL output's item vocabulary extended by i3.
    write_hugectr(api_setup["root"] / "tables" / "item", np.arange(TABLE_ROWS, dtype=np.int64),
                  table_vectors("item") + 0.5)
    vocabulary = api_setup["output"] / "artifacts" / "categorify" / "item_id" / "part-0.parquet"
    yesterday = pq.read_table(vocabulary)
    metadata = api_setup["output"] / "metadata.json"
    stamp = metadata.read_text()
    try:
        assert encoded_items() == [1, encoded_id("i1")]  # i3: out of vocabulary
        pq.write_table(pa.table({"value": ["i1", "i2", "i3"], "id": pa.array(
            [encoded_id(v) for v in ("i1", "i2", "i3")], pa.int64())}), vocabulary)
        metadata.write_text(json.dumps({**json.loads(stamp), "dataset": {"version": "day-2"}}))
        reloaded = client.post("/v1/admin/models/ranker/reload", headers=ADMIN)
        assert reloaded.status_code == 200, reloaded.text
        # One process serves this app: it heard its own announcement.
        answer = reloaded.json()
        assert 0 < answer.pop("held_ms") < 10_000  # /v1/rank held while the parts changed
        assert answer == {"model": "ranker", "workers": 1,
                          "rows": {"user": TABLE_ROWS, "item": TABLE_ROWS}}
        vectors = client.post("/v1/embeddings/lookup", headers=READ, json={
            "model": "ranker", "table": "item", "keys": [2]}).json()["vectors"]
        np.testing.assert_array_equal(vectors, table_vectors("item")[[2]] + 0.5)
        assert encoded_items() == [encoded_id("i3"), encoded_id("i1")]
        assert client.get("/healthz").headers["X-Featureline-Dataset-Version"] == "day-2"
    finally:
        write_hugectr(api_setup["root"] / "tables" / "item",
                      np.arange(TABLE_ROWS, dtype=np.int64), table_vectors("item"))
        pq.write_table(yesterday, vocabulary)
        metadata.write_text(stamp)
        client.post("/v1/admin/models/ranker/reload", headers=ADMIN)
    assert encoded_items() == [1, encoded_id("i1")]
    assert client.post("/v1/admin/models/scorer/reload", headers=ADMIN).status_code == 404


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"},
                                     {"Authorization": "Basic cmVhZGVyLWtleQ=="}])
def test_requests_without_a_valid_key_are_401(client, headers):
    response = client.post("/v1/features", headers=headers, json={
        "service": "ranking", "entities": {"user_id": ["u1"], "item_id": ["i1"]}})
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert response.json()["error"] == "Unauthorized"


def test_probes_and_metrics_need_no_key(client):
    assert client.get("/healthz").json() == {"status": "ok", "checks": {}}
    ready = client.get("/readyz").json()
    # The output's path on disk is for callers with a key, not for anyone probing.
    assert "output" not in ready["versions"]["online_store"]
    assert ready["versions"]["online_store"]["dataset_version"]
    keyed = client.get("/v1/embeddings/models", headers=READ).json()
    assert keyed["versions"]["online_store"]["output"]
    assert {k: ready[k] for k in ("status", "checks")} == {
        "status": "ok", "checks": {"redis": True, "hps": True, "hps_l3": True, "published": True,
                                   "versions": True}}
    assert ready["tiers"] == {"l2": True, "l3": True}
    assert ready["versions"]["problems"] == []
    client.post("/v1/embeddings/lookup", headers=READ,
                json={"model": "ranker", "table": "user", "keys": [2, 3]})
    client.post("/v1/embeddings/lookup", headers=READ,
                json={"model": "nobody", "table": "user", "keys": [2]})
    text = client.get("/metrics").text
    assert 'featureline_api_request_seconds_count{method="POST",route="/v1/embeddings/lookup",' \
           'status="200"}' in text
    assert 'featureline_api_errors_total{kind="UnknownModelError"}' in text
    assert 'featureline_hps_keys_share{model="ranker",table="user",tier="l1"}' in text
    assert 'featureline_hps_tier_available{tier="l2"} 1.0' in text


@pytest.mark.parametrize(("path", "body", "field", "limit"), [
    ("/v1/features", {"service": "ranking",
                      "entities": {"user_id": ["u1"] * 6, "item_id": ["i1"] * 6}},
     "entities", 5),
    ("/v1/ranking-inputs", {"user_id": "u1", "item_ids": ["i1"] * 6}, "item_ids", 5),
    ("/v1/embeddings/lookup", {"model": "ranker", "table": "item", "keys": [1] * 51},
     "keys", 50),
    ("/v1/embeddings/lookup", {"model": "ranker", "table": "item", "keys": [1] * 3000},
     "body", 4096),
    # 30 keys of 8 values: a 240-value answer over the cap on the response's size
    ("/v1/embeddings/lookup", {"model": "ranker", "table": "item", "keys": [1] * 30},
     "keys × dim", 200),
])
def test_limits_are_413_naming_the_field(client, path, body, field, limit):
    response = client.post(path, headers=READ, json=body)
    assert response.status_code == 413, response.text
    assert (response.json()["field"], response.json()["limit"]) == (field, limit)


def test_malformed_bodies_are_422_naming_the_field(client):
    response = client.post("/v1/embeddings/lookup", headers=READ,
                           json={"model": "ranker", "table": "item", "keys": ["x"]})
    assert response.status_code == 422
    assert response.json()["field"] == "keys.0"
    too_big = client.post("/v1/embeddings/lookup", headers=READ,
                          json={"model": "ranker", "table": "item", "keys": [2**63]})
    assert too_big.status_code == 422 and too_big.json()["message"] == (
        "keys.0: Value error, an integer from -9000000000000000000 to 9000000000000000000")
    # A JSON number without a fraction is an integer, as the schema reads it: 2.0 is key 2.
    whole = [client.post("/v1/embeddings/lookup", headers=READ, json={
        "model": "ranker", "table": "item", "keys": [key]}) for key in (2, 2.0)]
    assert whole[0].status_code == whole[1].status_code == 200
    assert whole[0].json() == whole[1].json()


def test_redis_restart_503_then_recovery(tmp_path, api_setup):
    server = EmbeddedRedis(tmp_path / "redis").start()
    repo = open_repo(api_setup["config"].feature_store, api_setup["output"], url=server.url)
    publish(repo, full=True, progress=lambda _: None)
    request = {"features": ["user_features:user_events"], "entities": {"user_id": ["u1"]}}
    # Without the parameter server: the module's app holds its RocksDB.
    settings = api_setup["config"].model_dump(mode="json")
    settings["api"]["hps"] = None
    application = create_app(parse_config(settings).serving(), output=api_setup["output"],
                             redis_url=server.url)
    try:
        with TestClient(application) as client:
            assert client.post("/v1/features", headers=READ, json=request).status_code == 200
            server.stop()
            down = client.post("/v1/features", headers=READ, json=request)
            assert down.status_code == 503
            assert down.headers["retry-after"] == "2"
            assert "is unavailable: Error 111" in down.json()["message"]
            assert client.get("/readyz").status_code == 503
            server.start()  # same port, empty: the next requests reconnect on their own
            publish(repo, full=True, progress=lambda _: None)
            back = client.post("/v1/features", headers=READ, json=request)
            assert back.status_code == 200
            assert back.json()["values"] == {"user_events": [7]}
            assert client.get("/readyz").status_code == 200
    finally:
        server.stop()


def test_online_reader_marks_values_outside_the_ttl(tmp_path, redis_server):
    """With a 3-day ttl, January's snapshots are stale now: values come back, flagged."""
    output = write_handmade_output(tmp_path / "output")
    url = fresh_db(redis_server, 9)
    repo = open_repo(copy_project(tmp_path, ttl="3d").feature_store, output, url=url)
    publish(repo, progress=lambda _: None)
    reader = OnlineReader.from_store(repo.store, url)
    result = reader.read(reader.references("ranking"),
                         {"user_id": ["u1", "zz"], "item_id": ["i1", "i1"]})
    assert result.values["user_events"] == [7, None]
    assert [s.value for s in result.status["user_events"]] == ["outside_ttl", "not_found"]
    # Read at a time of the log (a log in the past), the ttl counts back from then.
    stamp = result.timestamps["user_features"][0]
    for hours, status in ((1, "present"), (3 * 24 + 1, "outside_ttl")):
        then = reader.read(reader.references("ranking"), {"user_id": ["u1"], "item_id": ["i1"]},
                           at_us=(stamp + hours * 3600) * 1_000_000)
        assert [s.value for s in then.status["user_events"]] == [status]


def _published_reader(tmp_path, redis_server, cache: ValueCache | None) -> OnlineReader:
    output = write_handmade_output(tmp_path / "output")
    url = fresh_db(redis_server, 9)
    repo = open_repo(copy_project(tmp_path, ttl="3650d").feature_store, output, url=url)
    publish(repo, progress=lambda _: None)
    return OnlineReader.from_store(repo.store, url, cache)


def _overwrite(reader: OnlineReader, join_key: str, entity: str, feature: str,
               value: int) -> None:
    """Change one stored value behind the reader's back, as another writer would."""
    (layout,) = [v for v in reader.views.values()
                 if v.join_key == join_key and feature in v.features]
    (key,) = reader._redis_keys(layout, [entity])
    client = redis_clients.client(reader.url)
    generation = int(client.hget(publication_key(reader.project), "generation"))
    key = vector_prefix(reader.project, generation, layout.name) + key
    stamp, *values = orjson.loads(client.get(key))
    values[layout.features.index(feature)] = value
    client.set(key, orjson.dumps([stamp, *values]))


ROWS = {"user_id": ["u1", "u1", "u2"], "item_id": ["i1", "i2", "i1"]}


def test_cached_values_are_served_for_their_ttl_then_read_again(tmp_path, redis_server):
    cache = ValueCache(ttl_s=0.5, max_entities=100)
    reader = _published_reader(tmp_path, redis_server, cache)
    references = reader.references("ranking")
    assert reader.read(references, ROWS).values["user_events"] == [7, 7, 2]
    assert (cache.hits, cache.misses) == (0, 4)  # u1, u2, i1, i2
    _overwrite(reader, "user_id", "u1", "user_events", 99)
    again = reader.read(references, ROWS)
    assert again.values["user_events"] == [7, 7, 2]  # from memory, within the ttl
    assert [s.value for s in again.status["user_events"]] == ["present"] * 3
    assert (cache.hits, cache.misses) == (4, 4)
    time.sleep(0.6)
    assert reader.read(references, ROWS).values["user_events"] == [99, 99, 2]
    assert (cache.hits, cache.misses) == (4, 8)
    uncached = _published_reader(tmp_path / "b", redis_server, None)
    _overwrite(uncached, "user_id", "u1", "user_events", 99)
    assert uncached.read(references, ROWS).values == reader.read(references, ROWS).values


def test_a_publish_empties_the_cache_at_once(tmp_path, redis_server):
    cache = ValueCache(ttl_s=3600, max_entities=100)
    reader = _published_reader(tmp_path, redis_server, cache)
    references = reader.references("ranking")
    reader.read(references, ROWS)
    _overwrite(reader, "user_id", "u1", "user_events", 99)
    assert reader.read(references, ROWS).values["user_events"] == [7, 7, 2]
    redis_clients.client(reader.url).hset(publication_key(reader.project), "published_at",
                                          "a later publish")
    assert reader.read(references, ROWS).values["user_events"] == [99, 99, 2]


def test_an_unreachable_store_is_an_error_even_when_every_entity_is_cached(tmp_path,
                                                                           redis_server):
    from featureline.feature_store.errors import OnlineStoreUnavailableError
    from featureline.feature_store.online_store import open_online_store
    from featureline.feature_store.redis_server import free_port

    reader = _published_reader(tmp_path, redis_server, ValueCache(3600, 100))
    references = reader.references("ranking")
    reader.read(references, ROWS)
    reader.store = open_online_store("redis", f"redis://127.0.0.1:{free_port()}/0")
    with pytest.raises(OnlineStoreUnavailableError):
        reader.read(references, ROWS)


def test_the_api_counts_its_cache_lookups(client):
    body = {"service": "ranking", "entities": {"user_id": ["u1"], "item_id": ["i1"]}}
    for _ in range(2):
        assert client.post("/v1/features", headers=READ, json=body).status_code == 200
    text = client.get("/metrics").text
    counts = {result: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              for result in ("hit", "miss")
              if line.startswith(f'featureline_feature_cache_lookups_total{{result="{result}"}}')}
    assert counts["hit"] >= 2 and counts["miss"] >= 2


schema = schemathesis.pytest.from_fixture("api_schema")


@pytest.fixture(scope="module")
def api_schema(app):
    return schemathesis.openapi.from_asgi("/openapi.json", app)


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_fuzzing_finds_no_server_error(case):
    """Generated requests (valid and invalid) against every operation: never a 5xx."""
    headers = ADMIN if case.path.startswith("/v1/admin") else READ
    case.call_and_validate(headers=headers, checks=[not_a_server_error])


def test_docs_load_with_no_network(client):
    """/docs and /redoc name only assets this app serves (no CDN), and every one loads."""
    import re

    for page, kinds in (("/docs", ("swagger-ui-bundle.js", "swagger-ui.css")),
                        ("/redoc", ("redoc.standalone.js",))):
        html = client.get(page)
        assert html.status_code == 200, page
        urls = re.findall(r"""(?:src|href|url)\s*[:=]\s*['"]([^'"]+)['"]""", html.text)
        assert urls and not [u for u in urls if "//" in u], urls  # nothing off this server
        assert all(any(u.endswith(kind) for u in urls) for kind in kinds), urls
        for url in urls:
            asset = client.get(url)
            assert asset.status_code == 200 and len(asset.content) > 0, url
    assert "swagger" in client.get("/docs").text.lower()


def test_model_inputs_of_an_output_without_them_is_a_404_that_says_why(client):
    answer = client.post("/v1/model-inputs", headers=READ, json={
        "user_id": "u1", "item_ids": ["i1"], "context": {"device": "mobile"}})
    assert answer.status_code == 404
    assert "run the ETL again" in answer.json()["message"]


def test_every_field_of_the_openapi_document_is_described(client):
    """The reference a ranking service reads: every field of every request and response
    model has a description, and every error is an ErrorBody (what the handlers answer),
    not FastAPI's default validation error."""
    document = client.get("/openapi.json").json()
    schemas = document["components"]["schemas"]
    bare = [f"{name}.{field}" for name, schema in schemas.items()
            for field, spec in schema.get("properties", {}).items() if "description" not in spec]
    assert bare == []
    assert "HTTPValidationError" not in schemas
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            for status, response in operation["responses"].items():
                if status.startswith(("4", "5")) and path != "/readyz":  # 503: its Health
                    schema = response["content"]["application/json"]["schema"]
                    assert schema == {"$ref": "#/components/schemas/ErrorBody"}, (
                        method, path, status)
