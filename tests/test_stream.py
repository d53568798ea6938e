"""Fresh features on the embedded Redis Stream and on a real Kafka broker: POST /v1/push →
the log → the stream processor → /v1/features, with exact values (counts, rates, 7-day
windows), duplicates once, bad events rejected with the ETL's reasons, a processor SIGKILLed
and restarted, and the batch catching up to equal values. Real Redis, Kafka and Feast; real
Spark for the catch-up run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow.dataset as ds
import pytest
import yaml
from fastapi.testclient import TestClient

from featureline.api.app import create_app
from featureline.core.events import micros_of
from featureline.core.metadata import present, read_metadata
from featureline.feature_store.consistency import check_consistency
from featureline.feature_store.publish import publish
from featureline.feature_store.redis_server import free_port
from featureline.feature_store.repo import open_repo
from featureline.stream.expected import ArchivedStream
from featureline.stream.log import open_event_log
from featureline.stream.processor import open_processor
from featureline.stream.push import Pusher
from featureline.stream.tiles import SCRIPT_EVENTS, SCRIPT_KEYS
from tests.feast_data import copy_project, fresh_db

READ = {"Authorization": "Bearer reader-key"}
WRITE = {"Authorization": "Bearer writer-key"}
BIN = Path(sys.executable).parent


def _event(user: str, item: str, event_type: str, ts: datetime, **extra):
    return {"user_id": user, "item_id": item, "event_type": event_type, "ts": ts.isoformat(),
            "value": 1.0, "category": "c1", "device": "mobile", "price": 9.5, **extra}


def _setup(root: Path, redis_server, output: Path, db: int, stream: dict | None = None, **api):
    keys = root / "api-keys"
    keys.write_text("reader-key read\nwriter-key write\nadmin-key admin\n")
    config = copy_project(root, ttl="3650d",
                          # Uncached reads: each shows the store as the processor left it.
                          api={"auth": {"keys_file": str(keys)}, "data": str(output),
                               "feature_cache": {"ttl_s": 0}, **api},
                          stream={"archive": str(root / "archive"), **(stream or {})})
    url = fresh_db(redis_server, db)
    repo = open_repo(config.feature_store, output, url=url)
    publish(repo, progress=lambda _: None)
    return config, url


def _drain(processor, expected: int | None = None) -> int:
    """Process everything the log holds now (``expected``: wait for that many events, as a
    Kafka consumer first joins its group)."""
    processor.refresh_base()
    total = 0
    deadline = time.monotonic() + 60
    while True:
        count = processor.process(processor.log.read(processor.consumer, 100, 0.2))
        total += count
        waiting = expected is not None and total < expected and time.monotonic() < deadline
        if not count and not waiting:
            return total


@pytest.fixture(params=["redis_stream", "kafka"])
def log_settings(request, tmp_path):
    """The event log's settings: the embedded Redis Stream, or a topic of the real broker."""
    if request.param == "redis_stream":
        return {}
    broker = request.getfixturevalue("kafka_broker")
    name = f"events-{tmp_path.name}"
    return {"log": "kafka", "url": broker.bootstrap, "topic": name, "group": f"g-{name}",
            "partitions": 4}


def _latest(output: Path, entity: str, key: str, value: str) -> dict:
    """The entity's latest batch snapshot, read from the ETL output's table."""
    table = read_metadata(output).entities[entity]
    rows = ds.dataset(output / table.path).to_table(filter=ds.field(key) == value).to_pylist()
    return max(rows, key=lambda row: row["event_timestamp"])


def _cut(output: Path) -> datetime:
    """The output's cut: just after its latest event; the stream serves events from it on."""
    tiles = read_metadata(output).tiles
    assert tiles is not None
    return datetime.fromtimestamp(tiles.cut_us / 1e6, timezone.utc)


def _midnight_after(moment: datetime) -> datetime:
    """The start of the day after ``moment``'s: where the entity tables' snapshot of it is."""
    return datetime.combine(moment.date() + timedelta(days=1), datetime.min.time(),
                            tzinfo=timezone.utc)


def _features(client, user: str, item: str, at: datetime | None = None) -> dict:
    """The ranking service's features of (user, item), served at the request time ``at``
    (None: now)."""
    if at is not None:
        client.app.state.services.reader.clock = lambda: micros_of(at)
    response = client.post("/v1/features", headers=READ, json={
        "service": "ranking", "entities": {"user_id": [user], "item_id": [item]}})
    assert response.status_code == 200, response.text
    return {name: values[0] for name, values in response.json()["values"].items()}


@pytest.fixture(scope="module")
def stream_app(tmp_path_factory, redis_server, job_output):
    root = tmp_path_factory.mktemp("stream")
    config, url = _setup(root, redis_server, job_output.output, 11, limits={"max_events": 20})
    application = create_app(config.serving(), output=job_output.output, redis_url=url)
    processor = open_processor(config.stream, config.feature_store, job_output.output, url=url,
                               consumer="test")
    with TestClient(application) as client:
        yield {"client": client, "processor": processor, "output": job_output.output,
               "root": root, "config": config, "url": url}


def test_pushed_events_are_served_exactly_with_duplicates_once(tmp_path, redis_server,
                                                               job_output, log_settings):
    output = job_output.output
    config, url = _setup(tmp_path, redis_server, output, 15, log_settings)
    processor = open_processor(config.stream, config.feature_store, output, url=url,
                               consumer="exact")
    with TestClient(create_app(config.serving(), output=output, redis_url=url)) as client:
        _check_pushed_events(client, processor, output)


def test_the_stream_runs_on_a_redis_cluster(tmp_path, redis_cluster, job_output):
    """``feature_store.redis_type: redis_cluster``: the log on the cluster, each key's tiles
    and streamed events in one slot, the same exact values and duplicates once; a new
    generation's move; the API's feature cache told of rewritten entities through the
    cluster."""
    from redis.cluster import RedisCluster

    RedisCluster.from_url(redis_cluster.url).flushall()
    output = job_output.output
    keys = tmp_path / "api-keys"
    keys.write_text("reader-key read\nwriter-key write\n")
    config = copy_project(tmp_path, ttl="3650d", redis_type="redis_cluster",
                          api={"auth": {"keys_file": str(keys)}, "data": str(output),
                               "feature_cache": {"ttl_s": 3600, "max_entities": 1000}},
                          stream={"archive": str(tmp_path / "archive")})
    url = redis_cluster.url
    repo = open_repo(config.feature_store, output, url=url)
    publish(repo, progress=lambda _: None)
    processor = open_processor(config.stream, config.feature_store, output, url=url,
                               consumer="cluster")
    with TestClient(create_app(config.serving(), output=output, redis_url=url)) as client:
        _check_pushed_events(client, processor, output)
        # A new generation of the same output: the streamed keys move to its tiles, each in
        # its slot's transaction, and are served as before.
        served = processor.tiles.generation
        publish(repo, full=True, progress=lambda _: None)
        assert processor.refresh_base()
        assert processor.tiles.generation != served
        assert _features(client, "new-user", "i1")["user_events"] == 3
        cache = client.app.state.services.reader.cache
        hits = cache.hits
        assert _features(client, "new-user", "i1")["user_events"] == 3
        assert cache.hits == hits + 2  # the user and the item, from memory
        later = _event("new-user", "i1", "view", _cut(output) + timedelta(hours=4))
        assert client.post("/v1/push", headers=WRITE, json={"events": [later]}).status_code == 202
        assert _drain(processor) == 1
        deadline = time.monotonic() + 5
        while _features(client, "new-user", "i1")["user_events"] == 3:
            assert time.monotonic() < deadline, "the cached value was never forgotten"
            time.sleep(0.05)
        assert _features(client, "new-user", "i1")["user_events"] == 4


def _check_pushed_events(client, processor, output: Path) -> None:
    item = _latest(output, "item", "item_id", "i1")  # its totals: every event before the cut
    day = _cut(output) + timedelta(hours=3)
    clicked = _event("new-user", "i1", "click", day)
    # An epoch float, as time.time() gives it, is a time like any other.
    viewed = day + timedelta(minutes=1, microseconds=123457)
    events = [clicked, {**_event("new-user", "i1", "view", viewed), "ts": viewed.timestamp()},
              _event("new-user", "i1", "purchase", day + timedelta(minutes=2)),
              dict(clicked),  # an exact duplicate: counts once
              {**clicked, "user_id": None}, {**clicked, "ts": "yesterday"},
              {**clicked, "event_type": "hover"}, {**clicked, "price": "lots"}, "not an event"]
    response = client.post("/v1/push", headers=WRITE, json={"events": events})
    assert response.status_code == 202, response.text
    assert response.json() == {"accepted": 4, "rejected": [
        {"index": 4, "reason": "missing_user_id", "field": "user_id"},
        {"index": 5, "reason": "bad_timestamp", "field": "ts"},
        {"index": 6, "reason": "unknown_event_type", "field": "event_type"},
        {"index": 7, "reason": "bad_number", "field": "price"},
        {"index": 8, "reason": "malformed_record", "field": None}]}
    assert _drain(processor, expected=4) == 4
    # At the midnight after the events, the request time equals the snapshot's.
    served = _features(client, "new-user", "i1", at=_midnight_after(day))
    # Labels: event_type in (click, purchase) → 2 of the 3 distinct events.
    assert (served["user_events"], served["user_positives"], served["user_events_7d"]) == (3, 2, 3)
    assert served["user_positive_rate"] == pytest.approx(2 / 3)
    assert served["item_events"] == item["item_events"] + 3
    assert served["item_id_cat"] == item["item_id_cat"] > 1  # its id kept; new-user's unknown
    assert served["user_id_cat"] == 1
    assert served["item_positives"] == item["item_positives"] + 2
    assert served["item_positive_rate"] == pytest.approx(
        (item["item_positives"] + 2) / (item["item_events"] + 3))
    assert _drain(processor) == 0
    again = client.post("/v1/push", headers=WRITE, json={"events": [clicked]})
    assert again.json() == {"accepted": 1, "rejected": []}
    assert _drain(processor, expected=1) == 1
    assert _features(client, "new-user", "i1")["user_events"] == 3  # pushed again: once


def test_the_seven_day_window_ends_at_the_request_time(stream_app):
    """Served at the request time: the batch's days fall out of the window, then the pushed
    event does — an idle user's recent count decays to 0, its lifetime count stays."""
    client, processor, output = (stream_app[k] for k in ("client", "processor", "output"))
    user = _latest(output, "user", "user_id", "u1")
    assert user["user_events_7d"] > 1  # the batch's window holds more than the pushed event
    later = user["event_timestamp"].replace(tzinfo=timezone.utc) + timedelta(days=30)
    response = client.post("/v1/push", headers=WRITE, json={
        "events": [_event("u1", "i2", "view", later)]})
    assert response.json()["accepted"] == 1
    _drain(processor)
    served = _features(client, "u1", "i2", at=later + timedelta(seconds=1))
    assert served["user_events"] == user["user_events"] + 1
    assert served["user_events_7d"] == 1  # the batch's days fell out of the window
    assert served["user_positives"] == user["user_positives"]
    # The window is 7 days back from the request's day start (a day's hop): the event's
    # day is in it through the 7th day after, out of it from the 8th.
    day = _midnight_after(later) - timedelta(days=1)
    kept = _features(client, "u1", "i2", at=day + timedelta(days=7, hours=23))
    gone = _features(client, "u1", "i2", at=day + timedelta(days=8))
    assert (kept["user_events_7d"], gone["user_events_7d"]) == (1, 0)
    assert gone["user_events"] == user["user_events"] + 1
    # Feast's online view holds the row the processor wrote, stamped the midnight after the
    # event (snapshot accuracy, as the training set's): 1, at any request time.
    config, url = stream_app["config"], stream_app["url"]
    store = open_repo(config.feature_store, output, url=url).store
    row = store.get_online_features(features=["user_features:user_events_7d"],
                                    entity_rows=[{"user_id": "u1"}]).to_dict()
    assert row["user_events_7d"] == [1]


def test_a_processor_dying_between_the_tiles_and_the_row_writes_the_row_again(stream_app,
                                                                              monkeypatch):
    """Redelivered, every event is in the tiles already: the row is still written."""
    client, processor, output = (stream_app[k] for k in ("client", "processor", "output"))
    at = _cut(output) + timedelta(hours=5)
    events = [_event("tiles-only", "i1", "click", at),
              _event("tiles-only", "i2", "view", at + timedelta(minutes=1))]
    assert client.post("/v1/push", headers=WRITE, json={"events": events}).status_code == 202
    processor.refresh_base()

    def killed(entity, values):
        raise RuntimeError("killed before writing the rows")

    with monkeypatch.context() as patched:
        patched.setattr(processor, "_write", killed)
        with pytest.raises(RuntimeError, match="killed"):
            processor.process(processor.log.read(processor.consumer, 100, 0.2))
    config, url = stream_app["config"], stream_app["url"]
    store = open_repo(config.feature_store, output, url=url).store

    def row() -> tuple:  # the user's row, as Feast's SDK reads it
        read = store.get_online_features(
            features=["user_features:user_events", "user_features:user_positives"],
            entity_rows=[{"user_id": "tiles-only"}]).to_dict()
        return read["user_events"][0], read["user_positives"][0]

    assert row() == (None, None)
    # The API merges the tiles at the request time: it serves the events already.
    served = _features(client, "tiles-only", "i1")
    assert (served["user_events"], served["user_positives"]) == (2, 1)
    restarted = open_processor(config.stream, config.feature_store, output, url=url,
                               consumer=processor.consumer)
    assert _drain(restarted) == 2  # delivered again: nothing was committed
    assert row() == (2, 1)


def test_a_batch_of_many_script_calls_counts_each_event_once(stream_app):
    """One read holding more keys than one script call takes — and one key (the item) with
    more events than a call takes —, with duplicates of the first events at the end, and
    -0.0 and 0.0 (one value to Spark)."""
    client, processor, output = (stream_app[k] for k in ("client", "processor", "output"))
    start = _cut(output) + timedelta(hours=1)
    users = SCRIPT_KEYS + 20
    events = [_event(f"bulk-{n % users}", "bulk-i", "click" if n % 4 == 0 else "view",
                     start + timedelta(days=n % 9, seconds=n)) for n in range(3 * users)]
    events += [dict(event) for event in events[:300]]
    events += [_event("bulk-0", "bulk-i", "view", start, value=0.0),
               _event("bulk-0", "bulk-i", "view", start, value=-0.0)]
    metadata = read_metadata(output)
    pusher = Pusher(present(metadata.events, metadata, "events"), processor.log)
    assert pusher.push(events) == (len(events), [])
    processor.refresh_base()
    done = 0
    while done < len(events):
        done += processor.process(processor.log.read(processor.consumer, 5000, 0.2))
    assert done == len(events)
    for user in ("bulk-0", "bulk-1", f"bulk-{users - 1}"):  # the last in another call
        distinct = {(e["ts"], e["event_type"], e["value"]) for e in events
                    if e["user_id"] == user}
        days = [datetime.fromisoformat(ts).timestamp() // 86_400 for ts, _, _ in distinct]
        served = _features(client, user, "bulk-i", at=_midnight_after(
            datetime.fromtimestamp(max(days) * 86_400, timezone.utc)))
        assert served["user_events"] == len(distinct)
        assert served["user_positives"] == sum(kind == "click" for _, kind, _ in distinct)
        assert served["user_events_7d"] == sum(day > max(days) - 7 for day in days)
    assert len(events) > SCRIPT_EVENTS
    assert served["item_events"] == len({(e["user_id"], e["ts"], e["event_type"], e["value"])
                                         for e in events})


def test_push_needs_the_write_scope_and_answers_bad_bodies(stream_app):
    client = stream_app["client"]
    event = _event("u1", "i1", "view", datetime(2026, 1, 6, tzinfo=timezone.utc))
    assert client.post("/v1/push", headers=READ, json={"events": [event]}).status_code == 403
    assert client.post("/v1/push", json={"events": [event]}).status_code == 401
    too_many = client.post("/v1/push", headers=WRITE, json={"events": [event] * 21})
    assert too_many.status_code == 413 and too_many.json()["field"] == "events"
    for body in ({"events": []}, {"events": {"user_id": "u1"}}, {"event": [event]}):
        answer = client.post("/v1/push", headers=WRITE, json=body)
        assert answer.status_code == 422, body
        assert "events" in answer.text


@pytest.mark.parametrize("log", ["redis_stream", "kafka"])
def test_a_log_that_is_down_is_503_and_nothing_is_acknowledged(tmp_path, redis_server,
                                                               job_output, log):
    port = free_port()
    dead = f"redis://127.0.0.1:{port}/0" if log == "redis_stream" else f"127.0.0.1:{port}"
    config, url = _setup(tmp_path, redis_server, job_output.output, 12, {"log": log, "url": dead})
    application = create_app(config.serving(), output=job_output.output, redis_url=url)
    with TestClient(application) as client:
        response = client.post("/v1/push", headers=WRITE, json={"events": [
            _event("u1", "i1", "view", datetime(2026, 1, 6, tzinfo=timezone.utc))]})
    assert response.status_code == 503
    assert response.headers["Retry-After"]
    assert "event log" in response.json()["message"]


def _stream_cli(config_file: Path, url: str, consumer: str) -> subprocess.Popen:
    return subprocess.Popen([str(BIN / "featureline"), "stream", "--config", str(config_file),
                             "--consumer", consumer],
                            env={**os.environ, "REDIS_URL": url}, stderr=subprocess.PIPE)


def test_a_processor_killed_and_restarted_loses_and_doubles_nothing(tmp_path, redis_server,
                                                                    job_output, log_settings):
    config, url = _setup(tmp_path, redis_server, job_output.output, 13, log_settings)
    config_file = tmp_path / "featureline.yaml"
    config_file.write_text(yaml.safe_dump(config.model_dump(mode="json", exclude={"etl"})))
    metadata = read_metadata(job_output.output)
    assert metadata.events is not None
    pusher = Pusher(metadata.events, open_event_log(config.stream, url))
    start = datetime(2026, 1, 20, tzinfo=timezone.utc)
    users = [f"k{i}" for i in range(40)]
    # 4,000 events: 100 per user, every fourth a click; pushed before the processor starts.
    for batch in range(40):
        events = [_event(users[(batch + j) % 40], f"ki{j % 7}", "click" if j % 4 == 0 else "view",
                         start + timedelta(seconds=batch * 100 + j)) for j in range(100)]
        assert pusher.push(events)[0] == 100
    processor = _stream_cli(config_file, url, "killed")
    archive = Path(config.stream.archive)
    deadline = time.monotonic() + 60
    while not list(archive.glob(".events-*.jsonl")) and time.monotonic() < deadline:
        time.sleep(0.05)
    processor.send_signal(signal.SIGKILL)  # mid-stream: some batches written, some not
    processor.wait()
    restarted = _stream_cli(config_file, url, "killed")
    try:
        application = create_app(config.serving(), output=job_output.output, redis_url=url)
        with TestClient(application) as client:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                served = [_features(client, user, "ki0") for user in users]
                if all(s["user_events"] == 100 for s in served):
                    break
                time.sleep(0.5)
        assert [s["user_events"] for s in served] == [100] * 40
        assert [s["user_positives"] for s in served] == [25] * 40
        assert served[0]["item_events"] == sum(1 for j in range(100) if j % 7 == 0) * 40
    finally:
        restarted.send_signal(signal.SIGTERM)
        restarted.wait(timeout=30)


def test_the_batch_catches_up_to_the_streamed_values(spark, tmp_path, redis_server, small_log,
                                                     job_output):
    """Push, run the ETL over the original log plus the archive, publish: every streamed
    entity's values equal what the stream served; today's events stay served on top."""
    from featureline.etl import job
    from tests.job_config import make_config

    config, url = _setup(tmp_path, redis_server, job_output.output, 14)
    processor = open_processor(config.stream, config.feature_store, job_output.output, url=url,
                               consumer="catch-up")
    _drain(processor)
    metadata = read_metadata(job_output.output)
    assert metadata.events is not None
    pusher = Pusher(metadata.events, open_event_log(config.stream, url))
    cut = _cut(job_output.output)
    late = _event("u1", "i1", "click", cut - timedelta(hours=5))  # before the cut: the batch's
    pushed = [late, _event("u1", "i3", "view", cut + timedelta(days=1, hours=2)),
              _event("u2", "i1", "purchase", cut + timedelta(days=3)),
              _event("c-new", "i-new", "click", cut + timedelta(days=9)),
              _event("c-new", "i1", "view", cut + timedelta(days=9, hours=1))]
    assert pusher.push(pushed)[0] == len(pushed)
    _drain(processor)
    application = create_app(config.serving(), output=job_output.output, redis_url=url)
    names = ("events", "events_7d", "positives", "positive_rate")
    pairs = [("u1", "i1"), ("u1", "i3"), ("u2", "i1"), ("c-new", "i-new"), ("c-new", "i1")]
    with TestClient(application) as client:
        streamed = [_features(client, *pair) for pair in pairs]
    u1 = _latest(job_output.output, "user", "user_id", "u1")
    assert streamed[0]["user_events"] == u1["user_events"] + 1  # i3's view, not the late click
    assert streamed[0]["user_positives"] == u1["user_positives"]

    inputs = tmp_path / "inputs"
    inputs.mkdir()
    (inputs / "log.jsonl").write_text(small_log.read_text())
    assert processor.seal_archive(everything=True)  # as when the hour is over
    # Every events file published; their batch times stay hidden (the ETL skips them).
    assert not list(Path(config.stream.archive).glob(".*.jsonl"))
    assert list(Path(config.stream.archive).glob(".*.jsonl.times"))
    for file in Path(config.stream.archive).glob("*.jsonl"):
        (inputs / file.name).write_text(file.read_text())
    result = job.run(make_config(tmp_path / "catch-up", inputs), spark, progress=lambda _: None)
    repo = open_repo(config.feature_store, result.output, url=url)
    publish(repo, progress=lambda _: None)
    caught_up = create_app(config.serving(), output=result.output, redis_url=url)
    with TestClient(caught_up) as client:
        batch = [_features(client, *pair) for pair in pairs]
        # The late click, read by the batch from the archive, is u1's and i1's only.
        late_in = {("user", "u1"), ("item", "i1")}
        for pair, before, after in zip(pairs, streamed, batch, strict=True):
            for entity, own in zip(("user", "item"), pair, strict=True):
                if (entity, own) in late_in:
                    assert after[f"{entity}_events"] == before[f"{entity}_events"] + 1
                    assert after[f"{entity}_positives"] == before[f"{entity}_positives"] + 1
                    continue
                for name in names:
                    key = f"{entity}_{name}"
                    assert after[key] == pytest.approx(before[key]), (key, before, after)
        # An event of today: after the batch (whose snapshots end yesterday) it stays served.
        today = datetime.now(timezone.utc)
        assert pusher.push([_event("u2", "i1", "view", today)]) == (1, [])
        after_processor = open_processor(config.stream, config.feature_store, result.output,
                                         url=url, consumer="catch-up")
        assert _drain(after_processor) == 1
        fresh = _features(client, "u2", "i1")
        assert fresh["user_events"] == batch[2]["user_events"] + 1
        assert fresh["user_events_7d"] == 1


def test_a_cached_entity_is_served_fresh_once_the_processor_rewrote_it(tmp_path, redis_server,
                                                                      job_output):
    """The API's feature cache forgets what the processor announces it rewrote."""
    output = job_output.output
    config, url = _setup(tmp_path, redis_server, output, 10,
                         feature_cache={"ttl_s": 3600, "max_entities": 1000})
    processor = open_processor(config.stream, config.feature_store, output, url=url,
                               consumer="cached")
    _drain(processor)
    with TestClient(create_app(config.serving(), output=output, redis_url=url)) as client:
        before = _features(client, "u2", "i1")
        assert _features(client, "u2", "i1") == before  # now from the cache
        pushed = _event("u2", "i1", "view", _cut(output))
        assert client.post("/v1/push", headers=WRITE, json={"events": [pushed]}).status_code == 202
        assert _drain(processor) == 1
        deadline = time.monotonic() + 5
        while (after := _features(client, "u2", "i1"))["user_events"] == before["user_events"]:
            assert time.monotonic() < deadline, "the cached value was never forgotten"
            time.sleep(0.05)
        assert after["user_events"] == before["user_events"] + 1
        assert after["item_events"] == before["item_events"] + 1
        # The cache holds the entities' tiles, not their values: a request 9 days after the
        # push, answered from the cache, merges them at its own time.
        cache = client.app.state.services.reader.cache
        hits = cache.hits
        later = _features(client, "u2", "i1", at=_cut(output) + timedelta(days=9))
        assert cache.hits == hits + 2  # the user and the item, both from memory
        assert (later["user_events_7d"], later["item_events_7d"]) == (0, 0)
        assert later["user_events"] == after["user_events"]


def test_consistency_compares_streamed_rows_with_the_archive(tmp_path, redis_server,
                                                             job_output):
    """Rows of entities the processor wrote are compared with the rule of time over the
    output's and the archived events applied before the request: equal as served; an event
    dated before the cut left to the batch (its entity's rows compared with the batch's); an
    archive that lost an event reports exactly those entities."""
    output = job_output.output
    log = tmp_path / "log"
    config, url = _setup(tmp_path, redis_server, output, 15,
                         feature_logging={"path": str(log), "roll_s": 0.2})
    processor = open_processor(config.stream, config.feature_store, output, url=url,
                               consumer="skew")
    cut = _cut(output)
    metadata = read_metadata(output)
    pusher = Pusher(present(metadata.events, metadata, "events"),
                    open_event_log(config.stream, url))
    pushed = [_event("late-user", "i2", "view", cut - timedelta(days=2)),  # before the cut
              _event("fresh-user", "i1", "click", cut + timedelta(hours=1)),
              _event("fresh-user", "i1", "view", cut + timedelta(hours=2)),
              _event("fresh-user", "i1", "purchase", cut + timedelta(hours=3))]
    assert pusher.push(pushed) == (4, [])
    assert _drain(processor) == 4
    with TestClient(create_app(config.serving(), output=output, redis_url=url)) as client:
        response = client.post("/v1/features", headers=READ, json={
            "service": "ranking", "entities": {"user_id": ["fresh-user", "late-user", "u1"],
                                               "item_id": ["i1", "i2", "i3"]}})
        assert response.status_code == 200, response.text
    served = response.json()["values"]
    assert served["user_events"][0] == 3

    def reports(expected) -> dict:
        report = check_consistency(log, output, config.feature_store, expected=expected)
        return {f.feature: f for f in report.features}

    assert served["user_events"][1] is None  # late-user: left to the next batch
    unsettled = reports(None)  # no archive: streamed rows counted, not compared
    assert unsettled["user_events"].streamed == unsettled["user_events"].unsettled == 1
    archive = Path(config.stream.archive)
    settled = reports(ArchivedStream(archive, output))
    for name, report in settled.items():
        assert report.mismatch == report.missing == report.extra == 0, (name, report.top)
    user_events = settled["user_events"]
    # fresh-user streamed and settled; late-user's event, before the cut, was not streamed.
    assert (user_events.streamed, user_events.unsettled) == (1, 0)
    # fresh-user (from the archive), u1 (the batch) and late-user (no value either side).
    assert user_events.compared == 3
    # i1 (fresh-user's events) settled; i2 served and compared as the batch wrote it.
    assert (settled["item_events"].streamed, settled["item_events"].unsettled) == (1, 0)
    assert settled["item_events"].compared == 3

    (events_file,) = archive.glob(".events-*.jsonl")  # the purchase lost from the archive
    lines = events_file.read_bytes().splitlines(keepends=True)
    assert b"purchase" in lines[-1]
    events_file.write_bytes(b"".join(lines[:-1]))
    lost = reports(ArchivedStream(archive, output))
    top = lost["user_events"].top
    assert lost["user_events"].mismatch == 1
    assert [(t["entity"], t["served"] - t["offline"]) for t in top] == [("fresh-user", 1)]
    assert [t["entity"] for t in lost["user_positives"].top] == ["fresh-user"]
    assert [t["entity"] for t in lost["item_events"].top] == ["i1"]
    assert lost["item_events"].mismatch == 1


def test_a_kafka_cluster_id_never_starts_with_a_dash():
    from featureline.stream.kafka_server import cluster_id

    # 0xF8 encodes as '-' first: Kafka's command line would read it as an option ("-t -…").
    assert not cluster_id(bytes([0xF8]) + bytes(15)).startswith("-")
    assert cluster_id(bytes(16)) == "AAAAAAAAAAAAAAAAAAAAAA"
    assert len({cluster_id() for _ in range(64)}) == 64
