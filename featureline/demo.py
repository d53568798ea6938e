"""The end-to-end demo after the ETL: publish to Redis, embedding tables for the parameter
server (the reference model trained on the TFRecords; a quick matrix factorisation of the
interaction table where TensorFlow is not installed), the API in the background, and one
call to each endpoint, printed as curl commands that work."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import yaml

from featureline.config import FeaturelineConfig
from featureline.core.aggregations import INPUTS_PREFIX, AggregateFeature, GroupSpec
from featureline.core.derive import DeriveSpec
from featureline.core.events import micros_of
from featureline.core.metadata import encoded_name, present, read_metadata
from featureline.core.redis import REDIS_URL_ENV, redact
from featureline.core.scoring import DENSE_LAYOUT
from featureline.etl.features.base import LABEL, SPLIT
from featureline.feature_store.redis_server import free_port
from featureline.next_day import NextDay, ask
from featureline.trainer.export import write_tables

EMBEDDED_TABLES = {"user_id": "user", "item_id": "item"}
START_TIMEOUT_S = 90.0
# The demo's aggregations where featureline.yaml defines none (docs/features.md): a user's
# events over three windows, their purchases and the sum of their values over the week; per
# user and category, the events and clicks of 30 days.
DEMO_AGGREGATIONS = """
- name: user_activity
  keys: [user_id]
  features:
    - {op: count, windows: [1h, 1d, 7d]}
    - {op: count, name: purchases, filter: "event_type in (purchase)", windows: [7d]}
    - {op: sum, column: value, windows: [7d]}
    - {op: last_k, column: item_id, k: 5}
- name: user_category
  keys: [user_id, category]
  features:
    - {op: count, windows: [30d]}
    - {op: count, name: clicks, filter: "event_type in (click, purchase)", windows: [30d]}
"""
# The demo's derived feature: the user's click rate in the candidate's category, smoothed
# towards their own positive rate.
DEMO_DERIVE = """
- name: category_click_rate
  expr: "ratio(user_category:clicks_30d, user_category:count_30d,
               prior=user_prior_positive_rate, weight=5)"
"""
# What the demo's lift leaves out: the derived feature and the counts it reads.
LIFT_OF = ("category_click_rate", "user_category:clicks_30d", "user_category:count_30d")


def demo_features(config: FeaturelineConfig) -> dict[str, Any]:
    """featureline.yaml's aggregations and derived features, or the demo's own where it
    defines no aggregations."""
    if config.aggregations:
        return {"aggregations": config.aggregations, "derive": config.derive}
    return {"aggregations": [GroupSpec.model_validate(group)
                             for group in yaml.safe_load(DEMO_AGGREGATIONS)],
            "derive": [DeriveSpec.model_validate(entry) for entry in yaml.safe_load(DEMO_DERIVE)]}


def sample_ids(output: Path, count: int = 3) -> dict[str, list[str]]:
    """The first ``count`` distinct raw ids of each entity table: what the demo shows."""
    metadata = read_metadata(output)
    return {entity: pq.read_table(output / table.path, columns=[table.join_key])
            .column(0).unique()[:count].to_pylist()
            for entity, table in metadata.entities.items()}


def demo_repo(config: FeaturelineConfig, out: Path, echo: Callable[[str], None]
              ) -> FeaturelineConfig:
    """``config``, or where its Feast repository is missing (an installed package run outside
    a checkout), ``config`` with a copy of the package's repository under ``out``."""
    from featureline.feature_store.repo import copy_packaged_repo

    if Path(config.feature_store.repo).is_dir():
        return config
    repo = copy_packaged_repo(out / "feast_repo").resolve()
    echo(f"no Feast repository at {config.feature_store.repo}: using a copy of the "
         f"package's, {repo}")
    store = config.feature_store.model_copy(update={"repo": str(repo)})
    return config.model_copy(update={"feature_store": store})


def publish_demo(config: FeaturelineConfig, output: Path, echo: Callable[[str], None],
                 progress: Callable[[str], None]) -> str:
    """Publish the demo's output and show a few rows as the online store now serves them;
    the online store's URL."""
    import pandas as pd

    from featureline.feature_store.publish import publish
    from featureline.feature_store.repo import open_repo

    repo = open_repo(config.feature_store, output)
    published = publish(repo, full=True, progress=progress)
    ids = sample_ids(output)
    rows = [{"user_id": user, "item_id": item}
            for user, item in zip(ids["user"], ids["item"], strict=False)]
    online = repo.store.get_online_features(
        features=repo.store.get_feature_service("ranking"), entity_rows=rows).to_dict()
    echo(f"online store {redact(repo.redis_url)}: {published.keys:,} keys in "
         f"{published.seconds:.1f}s; the ranking service reads, e.g.:")
    echo(pd.DataFrame(online).to_string(index=False))
    return repo.redis_url


def interaction_embeddings(output: Path, widths: dict[str, int], seed: int = 0
                           ) -> dict[str, np.ndarray]:
    """User and item vectors from a rank-k factorisation of log(1 + interactions) on the
    training split (randomised SVD); rows are encoded ids, so row 0 (padding) and row 1
    (out of vocabulary) stay as they come out."""
    metadata = read_metadata(output)
    plan = present(metadata.embedding_plan, metadata, "embedding_plan").features
    user, item = encoded_name("user_id"), encoded_name("item_id")
    table = pq.read_table(output / "examples" / f"{SPLIT}=train", columns=[user, item, LABEL])
    users, items = plan[user].cardinality, plan[item].cardinality
    weights = 1.0 + table[LABEL].to_numpy()  # a positive counts twice
    cells = table[user].to_numpy() * items + table[item].to_numpy()
    matrix = np.log1p(np.bincount(cells, weights=weights, minlength=users * items)
                      .reshape(users, items))
    rank = min(max(widths.values()), min(users, items) - 1)
    rng = np.random.default_rng(seed)
    basis, _ = np.linalg.qr(matrix @ rng.standard_normal((items, rank + 8)))
    small_u, values, vt = np.linalg.svd(basis.T @ matrix, full_matrices=False)
    scale = np.sqrt(values[:rank])
    factors = {"user_id": (basis @ small_u[:, :rank]) * scale, "item_id": vt[:rank].T * scale}
    vectors = {}
    for column, width in widths.items():
        padded = np.zeros((len(factors[column]), width), dtype=np.float32)
        padded[:, :min(width, rank)] = factors[column][:, :width]
        vectors[column] = padded
    return vectors


def write_embedding_tables(output: Path, root: Path) -> Path:
    """HugeCTR folders for the user and item ids and an ``hps.yaml`` that imports them, each
    table tagged with the vocabulary version its rows are keyed by."""
    metadata = read_metadata(output)
    plan = present(metadata.embedding_plan, metadata, "embedding_plan").features
    widths = {column: plan[encoded_name(column)].width for column in EMBEDDED_TABLES}
    vectors = interaction_embeddings(output, widths)
    shutil.rmtree(root, ignore_errors=True)  # a fresh RocksDB imports the new tables
    return write_tables(root, {name: (vectors[column],
                                      metadata.vocabularies[column].version)
                               for column, name in EMBEDDED_TABLES.items()})


DEMO_EPOCHS = 3
# The seeds of the demo's lift, each side trained once per seed.
LIFT_SEEDS = 3


def train_tables(output: Path, root: Path, echo: Callable[[str], None],
                 progress: Callable[[str], None]) -> Path:
    """The reference model trained on the demo's TFRecords, its tables exported under
    ``root``; without TensorFlow, a factorisation of the interactions instead. The hps.yaml."""
    try:
        from featureline.trainer.train import train
    except ImportError as exc:
        echo(f"TensorFlow is not installed ({exc.name}; the [tf] extra): serving a "
             "factorisation of the interactions instead of trained embeddings")
        return write_embedding_tables(output, root)
    result = train(output, root, epochs=DEMO_EPOCHS, progress=progress)
    echo(result.summary())
    return result.hps_config


def show_lift(output: Path, echo: Callable[[str], None], progress: Callable[[str], None]
              ) -> None:
    """The lift of the demo's derived feature with the counts it reads (``featureline
    lift``), where the output has it and TensorFlow is installed: the reference model with
    and without them, per seed."""
    try:
        from featureline.trainer.lift import lift
    except ImportError:
        return
    if LIFT_OF[0] not in {feature.name for feature in read_metadata(output).features}:
        return
    progress(f"the lift of the user's click rate in the candidate's category: featureline "
             f"lift --without {','.join(LIFT_OF)} --seeds {LIFT_SEEDS} --epochs {DEMO_EPOCHS} "
             "--no-gbdt")
    echo(lift(output, LIFT_OF, seeds=range(LIFT_SEEDS), epochs=DEMO_EPOCHS, gbdt=False,
              progress=progress).summary())


# Seconds between two feature log files of the demo's API.
LOG_ROLL_S = 1.0


def demo_config(config: FeaturelineConfig, output: Path, hps: Path, port: int, log: Path,
                archive: Path) -> dict[str, Any]:
    settings = config.model_dump(mode="json")
    settings["api"].update({"data": str(output.resolve()), "hps": str(hps.resolve()),
                            "port": port, "auth": {"enabled": False, "keys_file": None},
                            "feature_logging": {"path": str(log.resolve()),
                                                "roll_s": LOG_ROLL_S}})
    settings["feature_store"]["repo"] = str(Path(settings["feature_store"]["repo"]).resolve())
    settings["feature_store"]["redis_dir"] = str(
        Path(settings["feature_store"]["redis_dir"]).resolve())
    settings["stream"].update({"archive": str(archive.resolve()), "metrics_port": free_port()})
    return settings


def stop_server(pid_file: Path) -> None:
    """Stop the API a previous demo left running."""
    if pid_file.is_file():
        with contextlib.suppress(ProcessLookupError, ValueError):  # gone already
            pid = int(pid_file.read_text())
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:  # its port is free once it has exited
                with contextlib.suppress(ChildProcessError):  # reap it if it is our child
                    os.waitpid(pid, os.WNOHANG)
                os.kill(pid, 0)
                time.sleep(0.1)
        pid_file.unlink()


def start_server(config_file: Path, pid_file: Path, redis_url: str, log: Path) -> None:
    """``featureline serve`` in the background, once it answers /readyz."""
    settings = yaml.safe_load(config_file.read_text())["api"]
    with log.open("w") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "featureline.cli", "serve", "--config", str(config_file),
             "--stream"],
            env={**os.environ, REDIS_URL_ENV: redis_url}, stdout=sink, stderr=sink,
            start_new_session=True)
    pid_file.write_text(str(process.pid))
    ready = f"http://{settings['host']}:{settings['port']}/readyz"
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the API exited: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(ready, timeout=2) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError):
            time.sleep(0.5)
    raise RuntimeError(f"the API did not become ready in {START_TIMEOUT_S:.0f}s: {log}")


def _call(base: str, method: str, path: str, body: dict[str, Any] | None) -> tuple[int, str]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def sample_calls(base: str, user: str, items: list[str], scored: bool = False
                 ) -> list[tuple[str, str, Any]]:
    """One call per endpoint; ``scored``: /v1/rank too (the trained model's dense part was
    exported)."""
    inputs = {"user_id": user, "item_ids": items, "context": {"device": "mobile"}}
    rank = [("POST", "/v1/rank", {**inputs, "model": "ranker"})] if scored else []
    return [
        ("GET", "/healthz", None),
        ("GET", "/readyz", None),
        ("POST", "/v1/features", {"service": "ranking",
                                  "entities": {"user_id": [user] * 2, "item_id": items[:2]}}),
        ("POST", "/v1/embeddings/lookup", {"model": "ranker", "table": "item",
                                           "keys": [2, 3]}),
        ("GET", "/v1/embeddings/models", None),
        ("POST", "/v1/ranking-inputs", {"user_id": user, "item_ids": items}),
        ("POST", "/v1/model-inputs", inputs),
        *rank,
        ("POST", "/v1/admin/models/ranker/reload", None),
        ("GET", "/metrics", None),
    ]


def run_calls(base: str, user: str, items: list[str], echo: Callable[[str], None],
              scored: bool = False) -> None:
    """Call every endpoint once and print the curl command for it with a short answer."""
    for method, path, body in sample_calls(base, user, items, scored):
        status, text = _call(base, method, path, body)
        data = f" -H 'Content-Type: application/json' -d '{json.dumps(body)}'" if body else ""
        verb = "" if method == "GET" else f" -X {method}"
        echo(f"curl -s{verb} {base}{path}{data}")
        short = text if len(text) <= 160 else text[:157] + "..."
        echo(f"  → {status} {short.splitlines()[0] if short else ''}")
        if status >= 400:
            raise RuntimeError(f"{method} {path} answered {status}: {text[:500]}")


def serve_demo(config: FeaturelineConfig, output: Path, out: Path, redis_url: str,
               echo: Callable[[str], None], hps: Path, next_day: NextDay | None = None) -> str:
    """The API in the background over the tables of ``hps`` (an hps.yaml), one call per
    endpoint (and the model's input of ``next_day``'s first impression, before any push);
    its URL."""
    pid_file = out / "api.pid"
    stop_server(pid_file)
    port = config.api.port if _port_free(config.api.host, config.api.port) else free_port()
    log = out / "feature-log"
    shutil.rmtree(log, ignore_errors=True)  # this run's requests only
    archive = out / "stream_archive"
    reset_stream(archive, redis_url)
    settings = demo_config(config, output, hps, port, log, archive)
    config_file = out / "featureline.yaml"
    config_file.write_text(yaml.safe_dump(settings, sort_keys=False))
    start_server(config_file, pid_file, redis_url, out / "api.log")
    base = f"http://{settings['api']['host']}:{port}"
    ids = sample_ids(output)
    scored = (hps.parent / DENSE_LAYOUT).exists()
    run_calls(base, ids["user"][0], ids["item"], echo, scored)
    if scored:
        show_ranking(base, ids["user"][0], sample_ids(output, RANKED)["item"], echo)
    if next_day is not None:
        ask(next_day, base, output, config.etl, _call, echo)
    # The groups a user defines (and the entity tables'): the model inputs' show in /v1/rank.
    groups = [group for group in read_metadata(output).tile_groups()
              if not group.name.startswith(INPUTS_PREFIX)]
    push_events(base, ids["user"][0], ids["item"][0], groups, echo)
    report_consistency(config, output, log, archive, echo)
    return base


# Candidates the demo ranks, and how many of the best it shows.
RANKED = 100
SHOWN = 5


def show_ranking(base: str, user: str, items: list[str], echo: Callable[[str], None]) -> None:
    """``items`` ranked for ``user`` by the trained model; the best :data:`SHOWN` printed."""
    status, text = _call(base, "POST", "/v1/rank", {
        "user_id": user, "item_ids": items, "context": {"device": "mobile"},
        "model": "ranker", "top_k": SHOWN})
    if status != 200:
        raise RuntimeError(f"POST /v1/rank answered {status}: {text[:500]}")
    best = ", ".join(f"{item['item_id']} {item['score']:.4f}" for item in json.loads(text)["items"])
    echo(f"{len(items)} candidates ranked for {user} by the trained model; the best {SHOWN}: "
         f"{best}")


def reset_stream(archive: Path, redis_url: str) -> None:
    """This run's pushed events only: the demo's archive of earlier runs and the streamed
    state they left in its Redis go together (a Redis restarted without its data would
    otherwise hold less than the archive, and the consistency check compares the two)."""
    from featureline.core.redis import client

    shutil.rmtree(archive, ignore_errors=True)
    redis = client(redis_url)
    try:
        stale = list(redis.scan_iter(match="featureline:stream:*", count=1000))
        if stale:
            redis.delete(*stale)
    finally:
        redis.close()


def report_consistency(config: FeaturelineConfig, output: Path, log: Path, archive: Path,
                       echo: Callable[[str], None]) -> None:
    """``featureline consistency`` over what the API logged of the calls above (the rows of
    entities the pushed events touched against the stream processor's archive of this run's
    pushes; the model inputs and ranked candidates' rows too); its metrics land beside the
    log, where the API exports them."""
    from featureline.core.files import write_whole
    from featureline.feature_store.feature_log import REPORT_METRICS
    from featureline.served import check_served
    from featureline.stream.expected import ArchivedStream

    time.sleep(2 * LOG_ROLL_S)  # the API writes its log once per LOG_ROLL_S
    report = check_served(log, output, config.feature_store,
                          expected=ArchivedStream(archive, output))
    write_whole(log / REPORT_METRICS, lambda path: path.write_text(report.prometheus()))
    echo(f"featureline consistency --log {log} --data {output} --archive {archive}")
    for line in report.lines():
        echo(f"  {line}")


# Seconds the demo waits for pushed events to be served.
FRESH_TIMEOUT_S = 30.0


def _first_row(base: str, body: dict[str, Any]) -> dict[str, Any]:
    """``POST /v1/features`` with ``body``: each feature's value of the first row."""
    status, text = _call(base, "POST", "/v1/features", body)
    if status != 200:
        raise RuntimeError(f"POST /v1/features answered {status}: {text[:500]}")
    return {name: values[0] for name, values in json.loads(text)["values"].items()}


def _user_features(base: str, user: str, item: str) -> dict[str, Any]:
    return _first_row(base, {"service": "ranking",
                             "entities": {"user_id": [user], "item_id": [item]}})


def _aggregations_body(user: str, features: list[AggregateFeature]) -> dict[str, Any]:
    return {"features": [f.qualified for f in features], "entities": {"user_id": [user]}}


def push_events(base: str, user: str, item: str, groups: list[GroupSpec],
                echo: Callable[[str], None]) -> None:
    """Push three events of ``user`` now and show its features change once the stream
    processor has written them: the entity features, and the aggregations of the groups
    keyed by the user, with when the pushed events leave each window (``groups``: the
    output's groups with tiles, the entity tables' among them: the user table's outputs
    are the entity features)."""
    before = _user_features(base, user, item)
    entity = {f.output: f for group in groups if group.name == "user" for f in group.outputs()}
    aggregated = [f for group in groups if group.keys == ["user_id"] and group.name != "user"
                  for f in group.outputs()]
    before_aggregations = (_first_row(base, _aggregations_body(user, aggregated))
                           if aggregated else {})
    now = datetime.now(timezone.utc)
    # Events of the last seconds: a log holds what happened before it is sent.
    body = {"events": [{"user_id": user, "item_id": item, "event_type": kind,
                        "ts": (now - timedelta(seconds=2 - i)).isoformat(), "value": 1.0}
                       for i, kind in enumerate(("view", "click", "purchase"))]}
    started = time.monotonic()
    status, text = _call(base, "POST", "/v1/push", body)
    echo(f"curl -s -X POST {base}/v1/push -H 'Content-Type: application/json' "
         f"-d '{json.dumps(body)}'")
    echo(f"  → {status} {text}")
    if status != 202:
        raise RuntimeError(f"POST /v1/push answered {status}: {text[:500]}")
    names = ("user_events", "user_events_7d", "user_positives")
    while time.monotonic() - started < FRESH_TIMEOUT_S:
        after = _user_features(base, user, item)
        if after["user_events"] == before["user_events"] + 3:
            changes = ", ".join(f"{name} {before[name]} → {after[name]}"
                                f"{_until(entity.get(name), micros_of(now))}" for name in names)
            echo(f"fresh features of {user} after {time.monotonic() - started:.2f}s, at the "
                 f"request time: {changes}")
            break
        time.sleep(0.1)
    else:
        raise RuntimeError(f"pushed events were not served within {FRESH_TIMEOUT_S:.0f}s")
    if aggregated:
        last = micros_of(now)  # the last pushed event's time
        _show_aggregations(base, user, aggregated, before_aggregations, last, started, echo)


def _until(feature: AggregateFeature | None, pushed_us: int) -> str:
    """When events pushed at ``pushed_us`` leave the feature's window, as the demo says it
    (nothing for a lifetime or an unknown feature)."""
    expires = None if feature is None else feature.window.expires(pushed_us)
    if expires is None:
        return ""
    return (" (the pushed events count until "
            f"{datetime.fromtimestamp(expires / 1e6, timezone.utc):%Y-%m-%d %H:%M} UTC)")


def _show_aggregations(base: str, user: str, features: list[AggregateFeature],
                       before: dict[str, Any], pushed_us: int, started: float,
                       echo: Callable[[str], None]) -> None:
    """The user's aggregations once the pushed events are in them, each with when they
    leave its window (the value at the request time: docs/features.md)."""
    counted = next((f.qualified for f in features if f.operation().counts
                    and not f.operation().needs_column and f.spec.filter is None), None)
    while time.monotonic() - started < FRESH_TIMEOUT_S:
        after = _first_row(base, _aggregations_body(user, features))
        if counted is None or after[counted] == before[counted] + 3:
            break
        time.sleep(0.1)
    else:
        raise RuntimeError(f"pushed events were not aggregated within {FRESH_TIMEOUT_S:.0f}s")
    echo(f"curl -s -X POST {base}/v1/features -H 'Content-Type: application/json' -d "
         f"'{json.dumps(_aggregations_body(user, features))}'")
    echo(f"aggregations of {user} at the request time, before → after the push:")
    for feature in features:
        name = feature.qualified
        echo(f"  {name} {_shown(before[name])} → {_shown(after[name])}"
             f"{_until(feature, pushed_us)}")


def _shown(value: Any) -> Any:
    """A value as the demo prints it: a list (last_k's items) as compact JSON."""
    return json.dumps(value, separators=(",", ":")) if isinstance(value, list) else value


def _port_free(host: str, port: int) -> bool:
    import socket

    with socket.socket() as probe:
        return probe.connect_ex((host, port)) != 0
