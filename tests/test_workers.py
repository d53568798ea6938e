"""`featureline serve --workers 2`, as the Kubernetes Deployment runs it: both workers open a
RocksDB tier, a reload reaches both, every update reaches both and a malformed one is
dead-lettered without stopping either."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import redis
import yaml

from featureline.feature_store.publish import publish
from featureline.feature_store.redis_server import free_port
from featureline.feature_store.repo import open_repo
from featureline.hps.formats import write_hugectr
from featureline.hps.updates import dead_letter_stream, stream_name
from featureline.hps.updates import publish as publish_update
from tests.feast_data import copy_project, fresh_db, write_handmade_output

BIN = Path(sys.executable).parent
DIM = 4
ROWS = 6
REQUESTS = 24  # fresh connections, spread by the kernel over both workers


def _call(base: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(base + path, data=data, method="POST" if body is not None
                                     or path.endswith("reload") else "GET",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def _first_values(base: str, key: int) -> set[float]:
    """The first element of ``key``'s item vector as each of many requests saw it."""
    return {_call(base, "/v1/embeddings/lookup", {"model": "ranker", "table": "item",
                                                  "keys": [key]})[1]["vectors"][0][0]
            for _ in range(REQUESTS)}


def _eventually(check, timeout_s: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.2)
    return False


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory, redis_server):
    root = tmp_path_factory.mktemp("workers")
    output = write_handmade_output(root / "output")
    vectors = np.zeros((ROWS, DIM), dtype=np.float32)
    vectors[:, 0] = np.arange(ROWS)
    write_hugectr(root / "tables" / "item", np.arange(ROWS, dtype=np.int64), vectors)
    hps_yaml = root / "hps.yaml"
    hps_yaml.write_text(yaml.safe_dump({
        "models": [{"name": "ranker", "tables": [
            {"name": "item", "dim": DIM, "source": str(root / "tables" / "item")}]}],
        "persistent_db": {"path": str(root / "rocksdb")}, "cache_device": "cpu",
        "updates": {"group": "test"}}))
    url = fresh_db(redis_server, 13)
    config = copy_project(root, ttl="3650d")
    publish(open_repo(config.feature_store, output, url=url), progress=lambda _: None)
    port = free_port()
    settings = config.model_dump(mode="json")
    settings["api"].update({"port": port, "data": str(output), "hps": str(hps_yaml),
                            "auth": {"enabled": False, "keys_file": None},
                            "ranking": {"model": "ranker", "tables": {"item_id_cat": "item"}}})
    config_file = root / "featureline.yaml"
    config_file.write_text(yaml.safe_dump(settings))
    log = (root / "serve.log").open("w")
    server = subprocess.Popen([str(BIN / "featureline"), "serve", "--config", str(config_file),
                               "--workers", "2"], env={**os.environ, "REDIS_URL": url},
                              stdout=log, stderr=log, cwd=root)
    base = f"http://127.0.0.1:{port}"
    try:
        client = redis.Redis.from_url(url)
        # Both workers are up once both consumer groups exist (each opens its tiers first).
        groups = lambda: len(client.xinfo_groups(stream_name("ranker"))) == 2  # noqa: E731
        assert _eventually(lambda: client.exists(stream_name("ranker")) and groups(), 90), (
            root / "serve.log").read_text()[-3000:]
        yield base, root, client, url
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_both_workers_open_a_rocksdb_tier_and_serve(two_workers):
    base, root, _, _ = two_workers
    assert (root / "rocksdb" / "CURRENT").is_file()
    assert (root / "rocksdb.worker-1" / "CURRENT").is_file()
    status, ready = _call(base, "/readyz")
    assert status == 200, ready
    assert _first_values(base, 3) == {3.0}


def test_a_reload_reaches_both_workers(two_workers):
    base, root, _, _ = two_workers
    vectors = np.zeros((ROWS, DIM), dtype=np.float32)
    vectors[:, 0] = np.arange(ROWS) + 100
    write_hugectr(root / "tables" / "item", np.arange(ROWS, dtype=np.int64), vectors)
    status, body = _call(base, "/v1/admin/models/ranker/reload")
    assert status == 200, body
    assert body["workers"] == 2
    assert _eventually(lambda: _first_values(base, 4) == {104.0})


def test_every_update_reaches_both_workers_and_a_bad_one_is_dead_lettered(two_workers):
    base, _, client, url = two_workers
    client.xadd(stream_name("ranker"), {b"u": b"not an update"})
    publish_update("ranker", "item", np.array([5]), np.full((1, DIM), 7.5, np.float32),
                   url=url)
    publish_update("ranker", "item", np.array([5]), np.ones((1, DIM + 1), np.float32), url=url)
    assert _eventually(lambda: _first_values(base, 5) == {7.5})
    # Each worker's group set both bad messages aside, with their error.
    assert _eventually(lambda: client.xlen(dead_letter_stream("ranker")) == 4)
    errors = [fields[b"error"].decode()
              for _, fields in client.xrange(dead_letter_stream("ranker"))]
    assert sum("not an HPU1" in e or "not an HPS update" in e for e in errors) == 2
    assert sum("expected (1, 4)" in e for e in errors) == 2
    for group in client.xinfo_groups(stream_name("ranker")):
        assert group["pending"] == 0
    metrics = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
    assert 'featureline_hps_updates_total{model="ranker",outcome="dead_lettered"} 2.0' in metrics
