"""Failure paths: credentials never printed or returned, errors that are not ours answered as
JSON without internals, Redis refusing a command treated as unavailable, an API that will
not serve the network unauthenticated or with the deployment's placeholder key, an online
store that came back empty, and a Redis primary failed over by Sentinel under load."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from featureline.api.app import create_app
from featureline.api.settings import ApiConfig, AuthConfig, api_keys
from featureline.config import parse_config
from featureline.core.errors import ConfigError
from featureline.core.redis import redact
from featureline.feature_store.errors import OnlineStoreUnavailableError, online_store_errors
from featureline.feature_store.publish import publish
from featureline.feature_store.repo import open_repo
from tests.feast_data import copy_project, fresh_db, write_handmade_output

BIN = Path(sys.executable).parent
SECRET = "s3cr3t-pass"


@pytest.mark.parametrize(("url", "shown"), [
    (f"redis://:{SECRET}@10.0.0.5:6379/0", "redis://:***@10.0.0.5:6379/0"),
    (f"rediss://app:{SECRET}@redis.internal/2", "rediss://app:***@redis.internal/2"),
    ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
    (f"redis+sentinel://app:{SECRET}@s1:26379,s2:26380/main/1",
     "redis+sentinel://app:***@s1:26379,s2:26380/main/1"),
    (f"redis+sentinel://:{SECRET}@s1/main", "redis+sentinel://:***@s1/main"),
])
def test_urls_are_redacted(url, shown):
    assert redact(url) == shown
    error = OnlineStoreUnavailableError(url, "connection refused")
    assert SECRET not in str(error) and shown in str(error)


def test_sentinel_urls_are_parsed_and_bad_ones_refused():
    from featureline.core.redis import SentinelUrl, sentinel_url
    from featureline.feature_store.repo import feast_connection_string

    url = f"redis+sentinel://app:{SECRET}@s1:26379,s2,10.0.0.3:26400/main/2"
    assert sentinel_url(url) == SentinelUrl(
        [("s1", 26379), ("s2", 26379), ("10.0.0.3", 26400)], "main", 2, "app", SECRET)
    assert sentinel_url("redis://h:6379/0") is None
    for bad in ("redis+sentinel://s1:26379", "redis+sentinel://s1:x/main",
                "redis+sentinel://s1/main/zero"):
        with pytest.raises(ConfigError, match="REDIS_URL"):
            sentinel_url(bad)
    assert feast_connection_string(url, "redis_sentinel").startswith(
        f"s1:26379,s2:26379,10.0.0.3:26400,db=2,username=app,password={SECRET}")
    with pytest.raises(ConfigError, match="redis_sentinel"):
        feast_connection_string(url, "redis")
    with pytest.raises(ConfigError, match="redis_sentinel"):
        feast_connection_string("redis://h:6379/0", "redis_sentinel")


def test_the_cli_never_prints_the_password():
    env = {**os.environ, "REDIS_URL": f"redis://:{SECRET}@127.0.0.1:1/0"}
    status = subprocess.run([str(BIN / "featureline"), "redis", "status"], env=env,
                            capture_output=True, text=True, timeout=60)
    assert status.returncode == 0, status.stderr
    assert SECRET not in status.stdout and ":***@" in status.stdout
    publish = subprocess.run([str(BIN / "featureline"), "publish", "--data", "/nonexistent"],
                             env=env, capture_output=True, text=True, timeout=120)
    assert SECRET not in publish.stdout + publish.stderr


def test_redis_refusing_a_command_is_unavailable_not_a_crash(redis_server):
    import redis

    client = redis.Redis.from_url(redis_server.url)
    with pytest.raises(OnlineStoreUnavailableError, match="unknown command"), \
            online_store_errors(redis_server.url):
        client.execute_command("NO-SUCH-COMMAND")


@pytest.fixture(scope="module")
def fragile_client(tmp_path_factory, redis_server):
    root = tmp_path_factory.mktemp("faults")
    output = write_handmade_output(root / "output")
    config = copy_project(root, ttl="3650d", api={"auth": {"enabled": False}})
    url = fresh_db(redis_server, 14)
    publish(open_repo(config.feature_store, output, url=url), progress=lambda _: None)
    app = create_app(config.serving(), output=output, redis_url=url)
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client, app


def test_an_error_that_is_not_ours_is_json_without_internals(fragile_client, monkeypatch):
    client, app = fragile_client

    async def broken(*_args, **_kwargs):
        raise OSError("IO error: /var/lib/rocksdb/000123.sst: checksum mismatch")

    monkeypatch.setattr(app.state.services.reader, "read_async", broken)
    response = client.post("/v1/features", json={"features": ["user_features:user_events"],
                                                 "entities": {"user_id": ["u1"]}})
    assert response.status_code == 500
    assert response.json() == {"error": "InternalError",
                               "message": "internal error; the server log has the details"}
    assert "rocksdb" not in response.text
    metrics = client.get("/metrics").text
    assert 'featureline_api_errors_total{kind="OSError"} 1.0' in metrics


def test_unauthenticated_serving_on_the_network_is_refused():
    with pytest.raises(ConfigError, match="allow_unauthenticated_remote"):
        parse_config({"api": {"host": "0.0.0.0", "auth": {"enabled": False}}})
    allowed = ApiConfig(host="0.0.0.0", auth=AuthConfig(enabled=False,
                                                        allow_unauthenticated_remote=True))
    assert allowed.host == "0.0.0.0"
    assert ApiConfig(host="127.0.0.1", auth=AuthConfig(enabled=False)).auth.enabled is False


def test_serve_refuses_a_network_host_without_auth(tmp_path):
    config = tmp_path / "featureline.yaml"
    config.write_text(json.dumps({"api": {"auth": {"enabled": False}}}))
    result = subprocess.run([str(BIN / "featureline"), "serve", "--config", str(config),
                             "--host", "0.0.0.0"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "--host" in result.stderr and "allow_unauthenticated_remote" in result.stderr


def test_the_placeholder_key_is_not_a_key(tmp_path):
    keys = tmp_path / "api-keys"
    keys.write_text((Path(__file__).resolve().parent.parent / "k8s" / "base" / "api.yaml")
                    .read_text().split("api-keys: |\n", 1)[1].splitlines()[0].strip() + "\n")
    with pytest.raises(ConfigError, match="placeholder"):
        api_keys(AuthConfig(keys_file=str(keys)))


def test_auth_on_without_keys_warns_at_startup(tmp_path, redis_server, caplog):
    output = write_handmade_output(tmp_path / "output")
    config = copy_project(tmp_path, ttl="3650d")
    app = create_app(config.serving(), output=output, redis_url=fresh_db(redis_server, 15))
    with caplog.at_level(logging.WARNING, logger="featureline.api"), TestClient(app):
        pass
    assert "no key is configured" in caplog.text


def test_a_chunked_body_is_cut_off_at_the_limit(fragile_client):
    client, app = fragile_client
    limit = app.state.services.config.api.limits.max_body_bytes
    def chunks():  # no Content-Length: the server learns the size only by reading
        for _ in range(limit // 1000 + 50):
            yield b" " * 1000

    response = client.post("/v1/embeddings/lookup", content=chunks(),
                           headers={"Content-Type": "application/json"})
    assert response.status_code == 413
    assert (response.json()["field"], response.json()["limit"]) == ("body", limit)
    small = b'{"features": ["user_features:user_events"], "entities": {"user_id": ["u1"]}}'
    ok = client.post("/v1/features", content=iter([small[:20], small[20:]]),
                     headers={"Content-Type": "application/json"})
    assert ok.status_code == 200, ok.text
    assert ok.json()["values"] == {"user_events": [7]}


def test_an_empty_store_is_detected_and_repaired(tmp_path, redis_server):
    """Redis restarted without its data (flushed here): /readyz 503 naming it, the API 503
    with Retry-After instead of not_found for everyone, the gauges 0; `publish --repair`
    republishes and the same answers come back; on a healthy store it changes nothing."""
    import redis
    from click.testing import CliRunner

    from featureline.cli import main

    output = write_handmade_output(tmp_path / "output")
    config = copy_project(tmp_path, ttl="3650d", api={"auth": {"enabled": False},
                                                      "feature_cache": {"ttl_s": 0}})
    config_file = tmp_path / "featureline.yaml"
    config_file.write_text(json.dumps(config.model_dump(mode="json", exclude={"etl"})))
    url = fresh_db(redis_server, 2)
    publish(open_repo(config.feature_store, output, url=url), progress=lambda _: None)
    body = {"service": "ranking", "entities": {"user_id": ["u1", "u2"], "item_id": ["i1", "i2"]}}

    def repair() -> dict:
        run = CliRunner().invoke(main, ["publish", "--repair", "--config", str(config_file),
                                        "--data", str(output)], env={"REDIS_URL": url})
        assert run.exit_code == 0, run.output
        return json.loads(run.output.strip().splitlines()[-1])

    with TestClient(create_app(config.serving(), output=output, redis_url=url)) as client:
        served = client.post("/v1/features", json=body)
        assert served.status_code == 200 and served.json()["values"]["user_events"] == [7, 2]
        assert repair()["repaired"] is False  # a healthy store: nothing written
        redis.Redis.from_url(url).flushdb()  # a restart without persistence
        ready = client.get("/readyz")
        assert ready.status_code == 503 and ready.headers["Retry-After"]
        assert ready.json()["checks"]["published"] is False
        assert any("publish --repair" in p for p in ready.json()["versions"]["problems"])
        empty = client.post("/v1/features", json=body)
        assert empty.status_code == 503 and empty.headers["Retry-After"], empty.text
        assert "publish --repair" in empty.json()["message"]
        metrics = client.get("/metrics").text
        assert "featureline_online_store_available 0.0" in metrics
        assert "featureline_online_store_published 0.0" in metrics
        assert not re.search(r"^featureline_versions_compatible ", metrics, re.MULTILINE)
        assert repair()["repaired"] is True
        assert client.get("/readyz").status_code == 200
        assert client.post("/v1/features", json=body).json() == served.json()
        assert "featureline_online_store_published 1.0" in client.get("/metrics").text


def test_a_primary_killed_under_load_fails_over_with_nothing_wrong(tmp_path):
    """Redis Sentinel (a real primary, replica and three sentinels): the primary SIGKILLed
    while a client reads — every answer is the published one or a 503 with Retry-After, and
    answers come back from the promoted replica within seconds; Feast's SDK reads the same
    values through the sentinels."""
    import threading
    import time

    from featureline.feature_store.redis_server import EmbeddedRedisSentinel

    output = write_handmade_output(tmp_path / "output")
    config = copy_project(tmp_path, ttl="3650d", redis_type="redis_sentinel",
                          api={"auth": {"enabled": False}, "feature_cache": {"ttl_s": 0}})
    body = {"service": "ranking", "entities": {"user_id": ["u1", "u2"], "item_id": ["i1", "i2"]}}
    with EmbeddedRedisSentinel(tmp_path / "sentinel") as group:
        repo = open_repo(config.feature_store, output, url=group.url)
        publish(repo, progress=lambda _: None)
        group.wait_replicated()
        feast_rows = repo.store.get_online_features(
            features=repo.store.get_feature_service("ranking"),
            entity_rows=[{"user_id": "u1", "item_id": "i1"},
                         {"user_id": "u2", "item_id": "i2"}]).to_dict()
        assert feast_rows["user_events"] == [7, 2]
        with TestClient(create_app(config.serving(), output=output,
                                   redis_url=group.url)) as client:
            expected = client.post("/v1/features", json=body)
            assert expected.status_code == 200, expected.text
            assert expected.json()["values"]["user_events"] == [7, 2]
            answers: list[tuple[float, int, dict, str | None]] = []
            stop = threading.Event()

            def load() -> None:
                while not stop.is_set():
                    response = client.post("/v1/features", json=body)
                    answers.append((time.monotonic(), response.status_code, response.json(),
                                    response.headers.get("Retry-After")))
                    time.sleep(0.005)

            reader = threading.Thread(target=load)
            reader.start()
            try:
                time.sleep(0.5)
                killed_at = time.monotonic()
                old = group.kill_primary()
                deadline = killed_at + 30
                while time.monotonic() < deadline and (group.primary_port() == old
                                                       or answers[-1][1] != 200):
                    time.sleep(0.05)
                time.sleep(0.5)
            finally:
                stop.set()
                reader.join()
        after = [a for a in answers if a[0] > killed_at]
        assert {status for _, status, *_ in answers} <= {200, 503}
        assert all(a[2] == expected.json() for a in answers if a[1] == 200)  # nothing wrong
        assert all(a[3] for a in answers if a[1] == 503)
        failed = [a[0] for a in after if a[1] == 503]
        recovered = next(a[0] for a in after if a[1] == 200 and a[0] > max(failed, default=0))
        assert recovered - killed_at < 20
        assert group.primary_port() != old  # the replica was promoted
        assert sum(1 for a in after if a[0] > recovered and a[1] == 200) > 10
        rows = repo.store.get_online_features(
            features=repo.store.get_feature_service("ranking"),
            entity_rows=[{"user_id": "u1", "item_id": "i1"}]).to_dict()
        assert rows["user_events"] == [7]  # Feast follows the new primary too
