"""The model's input served at a request time equals the training row.

The replay: the ETL runs over the first days of a generated log and is published; the last
day's events are replayed in time order — each asked of ``/v1/model-inputs`` at its own time
with its user, item and request columns, then pushed and applied by the stream (events
sharing a time are all asked before any is pushed). Every served row equals the row a full
run over every day with the first run's fit writes for that event. An id first seen after
the published run is out of vocabulary online (the full run numbers it): such values are
counted apart. Real Spark, Redis, Feast and stream processor.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pyarrow.dataset as ds
import pytest

from featureline.core.events import micros_of
from featureline.core.ids import OOV_ID
from featureline.core.metadata import read_metadata
from featureline.etl.datagen import generate_events
from tests.job_config import make_config

JOIN = {"of": "event_type in (view)", "positive": "event_type in (click, purchase)",
        "within": "30m"}
AGGREGATIONS = [{"name": "user_activity", "keys": ["user_id"], "features": [
    {"op": "count", "windows": ["1h", "1d"]},
    {"op": "count", "name": "purchases", "filter": "event_type in (purchase)",
     "windows": ["7d"]},
    {"op": "sum", "column": "value", "windows": ["7d"]},
    {"op": "last_k", "column": "item_id", "k": 3}]},
    # Keyed by an item attribute: read with the candidate's category.
    {"name": "user_category", "keys": ["user_id", "category"], "features": [
        {"op": "count", "windows": ["7d"]},
        {"op": "count", "name": "clicks", "filter": "event_type in (click, purchase)",
         "windows": ["7d"]}]}]
# Derived features over an attribute-keyed group, another op's feature, an item attribute
# (the price), a window's sum and the seconds since the user's previous event.
DERIVE = [
    {"name": "category_click_rate", "expr": "ratio(user_category:clicks_7d, "
     "user_category:count_7d, prior=user_prior_positive_rate, weight=5)"},
    {"name": "price_over_spend", "expr": "log1p(price) - log1p(user_activity:value_sum_7d)"},
    {"name": "recency_bucket", "expr": "bucketize(user_secs_since_prev, [60, 3600, 86400])"},
]
LAST_DAY = "2026-01-09"
MICROS = 1_000_000


def _micros(ts: str | datetime) -> int:
    """µs since the epoch of an ISO text or a datetime (without a zone: UTC)."""
    at = ts if isinstance(ts, datetime) else datetime.fromisoformat(ts.replace("Z", "+00:00"))
    return micros_of(at if at.tzinfo is not None else at.replace(tzinfo=timezone.utc))


def _write(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture(scope="module")
def replay(spark, tmp_path_factory, redis_server):
    from fastapi.testclient import TestClient

    from featureline.api.app import create_app
    from featureline.etl import job
    from featureline.feature_store.publish import publish
    from featureline.feature_store.repo import open_repo
    from featureline.stream.processor import open_processor
    from featureline.trainer.train import train
    from tests.feast_data import copy_project, fresh_db

    root = tmp_path_factory.mktemp("model-inputs")
    events = [{k: v for k, v in e.items() if not (isinstance(v, float) and math.isnan(v))}
              for e in generate_events(6000, 120, 150, 5, seed=11).to_dict("records")]
    old = [e for e in events if not e["ts"].startswith(LAST_DAY)]
    new = [e for e in events if e["ts"].startswith(LAST_DAY)]
    # The catalog changes at the last day's midnight: every 4th item costs 10 % more.
    repriced = set(sorted({e["item_id"] for e in old})[::4])
    for event in new:
        if event["item_id"] in repriced and "price" in event:
            event["price"] = round(event["price"] * 1.1, 2)
    _write(root / "raw" / "old.jsonl", old)
    _write(root / "raw" / "new.jsonl", new)
    config = make_config(root / "first", root / "raw" / "old.jsonl", label=JOIN,
                         aggregations=AGGREGATIONS, derive=DERIVE)
    first = job.run(config, spark, progress=lambda _: None)
    # The reference model on the first run's TFRecords: its tables and dense part exported.
    trained = train(first.output, root / "model", epochs=1, progress=lambda _: None)

    project = copy_project(root, ttl="3650d", api={"auth": {"enabled": False},
                                                   "data": str(first.output),
                                                   "hps": str(trained.hps_config),
                                                   "feature_cache": {"ttl_s": 0},
                                                   "feature_logging": {"path": str(root / "log"),
                                                                       "roll_s": 1}},
                           stream={"archive": str(root / "archive")})
    url = fresh_db(redis_server, 12)
    publish(open_repo(project.feature_store, first.output, url=url), progress=lambda _: None)
    processor = open_processor(project.stream, project.feature_store, first.output, url=url,
                               consumer="replay")
    served: dict[tuple, list[dict]] = defaultdict(list)
    # Events of a repriced item before any event with its new price was pushed: the
    # answers with the new price given as item_context.
    stale: dict[tuple, list[dict]] = defaultdict(list)
    priced: set[str] = set()
    ranked: dict[tuple, list[float]] = defaultdict(list)
    ranked_trees: dict[tuple, list[float]] = defaultdict(list)
    by_time: dict[str, list[dict]] = defaultdict(list)
    for event in new:
        by_time[event["ts"]].append(event)
    app = create_app(project.serving(), output=first.output, redis_url=url)
    # An item without an earlier event has no published attributes: the caller sends them.
    seen = {event["item_id"] for event in old}
    first_seen = 0
    with TestClient(app) as api:
        for ts in sorted(by_time, key=_micros):
            for event in by_time[ts]:
                body = {"user_id": event["user_id"], "item_ids": [event["item_id"]],
                        "context": {"device": event["device"]}, "at": ts}
                if event["item_id"] not in seen:
                    first_seen += 1
                    body["item_context"] = {c: [event.get(c)] for c in ("category", "price")}
                answer = api.post("/v1/model-inputs", json=body)
                assert answer.status_code == 200, answer.text
                key = (event["user_id"], event["item_id"], _micros(ts))
                served[key].append(answer.json())
                if event["item_id"] in repriced - priced and "price" in event:
                    fresh = api.post("/v1/model-inputs", json={
                        **body, "item_context": {"price": [event["price"]]}})
                    stale[key].append(fresh.json())
                scored = api.post("/v1/rank", json={**body, "model": "ranker"})
                assert scored.status_code == 200, scored.text
                ranked[key].append(scored.json()["items"][0]["score"])
                scored = api.post("/v1/rank", json={**body, "model": "ranker-gbdt"})
                assert scored.status_code == 200, scored.text
                ranked_trees[key].append(scored.json()["items"][0]["score"])
            seen.update(event["item_id"] for event in by_time[ts])
            priced.update(e["item_id"] for e in by_time[ts] if e["item_id"] in repriced
                          and "price" in e)
            pushed = api.post("/v1/push", json={"events": by_time[ts]})
            assert pushed.json()["rejected"] == [], pushed.text
            processor.refresh_base()
            processor.process(processor.log.read(processor.consumer, 1000, 0.5))
        bad = {
            "unknown context column": ({"context": {"device": "mobile", "colour": "red"}},
                                       "context.colour"),
            "missing request column": ({"context": {}}, "context.device"),
            "item_context of the wrong length": ({"context": {"device": "mobile"},
                                                  "item_context": {"price": [1.0]}},
                                                 "item_context.price"),
            "at before the published events": ({"context": {"device": "mobile"},
                                                "at": "2026-01-06T00:00:00Z"}, "at"),
        }
        refused = {name: api.post("/v1/model-inputs", json={
            "user_id": "u1", "item_ids": ["i1", "i2"], **body}) for name, (body, _) in bad.items()}
        asked = {"user_id": "u1", "item_ids": ["i1", "i2"], "context": {"device": "mobile"}}
        refused["unknown model"] = api.post("/v1/rank", json={**asked, "model": "nope"})
        # 100 candidates ranked at once, with their input rows.
        candidates = sorted({event["item_id"] for event in old})[:100]
        many = api.post("/v1/rank", json={"user_id": new[-1]["user_id"], "item_ids": candidates,
                                          "context": {"device": "mobile"}, "model": "ranker",
                                          "return_inputs": True})
        assert many.status_code == 200, many.text
        services = app.state.services
        served_fit, services.fit_version = services.fit_version, "another-fit"
        refused["model of another fit"] = api.post("/v1/rank", json={**asked, "model": "ranker"})
        services.fit_version = served_fit
    full = job.run(make_config(root / "full", root / "raw", label=JOIN,
                               aggregations=AGGREGATIONS, derive=DERIVE,
                               fit={"from_output": str(first.output)}), spark,
                   progress=lambda _: None)
    return {"first": first, "full": full, "served": served, "refused": refused,
            "bad": bad, "first_seen": first_seen, "ranked": ranked, "trained": trained,
            "many": many.json(), "url": url, "asked": {**asked, "at": new[-1]["ts"]},
            "stale": stale, "ranked_trees": ranked_trees, "project": project,
            "log": root / "log", "archive": root / "archive"}


def _examples(output: Path, day: str) -> list[dict]:
    table = ds.dataset(output / "examples", format="parquet", partitioning="hive").to_table()
    rows = table.to_pylist()
    return [row for row in rows if row["ts"].strftime("%Y-%m-%d") == day]  # UTC days


def _listed(value) -> list:
    return value if isinstance(value, list) else [value]


def _oov_online(value, expected, first_new: int | None) -> bool:
    """An id the full run numbered after the published fit, served out of vocabulary."""
    return first_new is not None and value == OOV_ID and expected >= first_new


def _compared(got, expected, dtype: str, first_new: int | None) -> str:
    """``equal``, ``apart`` (an id the published fit does not have, served out of
    vocabulary) or ``differ``."""
    if dtype != "int64":
        return "equal" if math.isclose(got, expected, rel_tol=1e-6, abs_tol=1e-6) else "differ"
    got_list = got if isinstance(got, list) else [got]
    expected_list = expected if isinstance(expected, list) else [expected]
    if got_list == expected_list:
        return "equal"
    if all(g == e or _oov_online(g, e, first_new)
           for g, e in zip(got_list, expected_list, strict=True)):
        return "apart"
    return "differ"


def test_every_served_row_equals_the_training_row(replay):
    """Every replayed event's served row equals the full run's example row. The repriced
    items' events before their new price reached the API differ in the price alone (served:
    the latest price an earlier event carried; trained on: the event's own); given the new
    price as item_context, they are equal too."""
    first, full, served, stale = replay["first"], replay["full"], replay["served"], replay["stale"]
    features = read_metadata(full.output).features
    categorify = read_metadata(first.output).artifacts["categorify"]
    # Per id feature, the first id the published fit did not have.
    first_new = {}
    for feature in features:
        owner = feature.shares or feature.name
        column = owner.removesuffix("_cat")
        if column in categorify:
            first_new[feature.name] = categorify[column]["cardinality"]
    examples = _examples(full.output, LAST_DAY)
    assert len(examples) > 300
    compared = defaultdict(int)
    apart = defaultdict(int)
    differ = []
    old_price = 0

    def device_of(answers: list[dict], row: dict) -> dict:
        # Events of one user, item and time differ in their request columns (the device).
        return next(a for a in answers if a["features"]["device_cat"] == [row["device_cat"]])

    for row in examples:
        key = (row["user_id"], row["item_id"], _micros(row["ts"]))
        answer = device_of(served[key], row)
        if key in stale:
            changed = {f.name for f in features if _compared(
                answer["features"][f.name][0], row[f.name], f.dtype,
                first_new.get(f.name)) == "differ"}
            assert changed <= {"price_norm", "price_over_spend"}, (key, changed)
            assert "price_norm" in changed, (key, changed)
            old_price += 1
            answer = device_of(stale[key], row)
        for feature in features:
            name = feature.name
            outcome = _compared(answer["features"][name][0], row[name], feature.dtype,
                                first_new.get(name))
            if outcome == "equal":
                compared[name] += 1
            elif outcome == "apart":
                apart[name] += 1
            else:
                differ.append((name, key, answer["features"][name][0], row[name]))
    assert differ == [], (len(differ), differ[:10])
    assert set(compared) == {f.name for f in features}
    assert min(compared.values()) > 300, dict(compared)
    assert replay["first_seen"] > 0  # the item_context path is taken
    assert old_price >= 5  # the repriced items' first events
    print({"rows": len(examples), "compared": dict(compared), "apart": dict(apart),
           "items_first_seen": replay["first_seen"], "served_the_old_price": old_price})


def test_served_groups_are_the_tfrecords_layout(replay):
    metadata = read_metadata(replay["first"].output)
    answer = next(iter(replay["served"].values()))[0]
    for name, group in metadata.tfrecord.groups.items():
        if "label" in group.columns:
            assert name not in answer["groups"]
            continue
        row = answer["groups"][name][0]
        expected = []
        for column in group.columns:
            value = answer["features"][column][0]
            expected += value if isinstance(value, list) else [value]
        assert row == expected
        assert len(row) == group.width


def test_bad_requests_name_the_field(replay):
    for name, (_, field) in replay["bad"].items():
        answer = replay["refused"][name]
        assert answer.status_code == 422, (name, answer.text)
        assert answer.json()["field"] == field, (name, answer.json())
    unknown, stale = replay["refused"]["unknown model"], replay["refused"]["model of another fit"]
    assert unknown.status_code == 404 and "ranker" in unknown.json()["message"]
    assert stale.status_code == 503 and "another-fit" in stale.json()["message"]


def test_metadata_names_each_features_source(replay):
    inputs = read_metadata(replay["first"].output).inputs
    assert inputs is not None and inputs.unserved == []
    assert inputs.features["user_secs_since_prev"].kind == "since"
    assert inputs.features["category_click_rate"].kind == "derive"
    assert inputs.features["recency_bucket"].expr == DERIVE[2]["expr"]
    assert inputs.features["user_hist_items"].width == 10
    assert [g.name for g in inputs.groups] == ["inputs_user", "inputs_pair", "inputs_item"]


def test_served_scores_equal_the_trained_models_on_the_training_rows(replay):
    """/v1/rank's score of each replayed event (NumPy over the exported dense part and the
    parameter server's vectors) equals the trained Keras model's on the full run's row of
    it, for every row whose ids the published fit numbers — and `featureline score`'s of
    the full run's validation split."""
    import keras

    from featureline.trainer.score import score

    full, served, ranked = replay["full"], replay["served"], replay["ranked"]
    metadata = read_metadata(replay["first"].output)
    model = keras.models.load_model(replay["trained"].out / "model.keras")
    groups = {name: group for name, group in metadata.tfrecord.groups.items()
              if "label" not in group.columns}
    cardinality = {f.name: f.cardinality for f in metadata.features if f.cardinality}
    rows, scores = [], []
    for row in _examples(full.output, LAST_DAY):
        key = (row["user_id"], row["item_id"], _micros(row["ts"]))
        index = next(i for i, a in enumerate(served[key])
                     if a["features"]["device_cat"] == [row["device_cat"]])
        if any(v >= n for name, n in cardinality.items() for v in _listed(row[name])):
            continue  # an id the published fit does not have: out of vocabulary online
        if key in replay["stale"]:
            continue  # served the old price
        rows.append(row)
        scores.append(ranked[key][index])
    assert len(rows) > 300
    blocks = {name: np.array([[v for column in group.columns for v in _listed(r[column])]
                              for r in rows],
                             dtype=np.float32 if group.dtype == "float32" else np.int64)
              for name, group in groups.items()}
    expected = np.asarray(model(blocks, training=False)).reshape(-1)
    assert np.allclose(scores, expected, rtol=1e-5, atol=1e-6), np.abs(
        np.asarray(scores) - expected).max()
    assert np.std(expected) > 0  # scores that differ between rows
    # `featureline score`: the same runtime offline, over the full run's validation split.
    offline = score(full.output, replay["trained"].out, "valid").to_pylist()
    by_key = defaultdict(list)  # events of one key differ in their device at most
    for r in offline:
        by_key[(r["user_id"], r["item_id"], _micros(r["ts"]))].append(r["score"])
    assert len(offline) >= len(rows)
    for row, served_score in zip(rows, scores, strict=True):
        key = (row["user_id"], row["item_id"], _micros(row["ts"]))
        assert any(s == pytest.approx(served_score, rel=1e-6, abs=1e-7) for s in by_key[key])


def test_the_trees_serve_the_scores_featureline_score_gives(replay):
    """The gradient-boosted trees exported beside the model: /v1/rank's score of each
    replayed event (LightGBM over the served features) equals `featureline score`'s of the
    full run's example — and the booster's own on those rows."""
    import lightgbm

    from featureline.trainer.score import score

    full, ranked = replay["full"], replay["ranked_trees"]
    metadata = read_metadata(replay["first"].output)
    cardinality = {f.name: f.cardinality for f in metadata.features if f.cardinality}
    offline = score(full.output, replay["trained"].out, "valid", "ranker-gbdt").to_pylist()
    by_key = defaultdict(list)
    for r in offline:
        by_key[(r["user_id"], r["item_id"], _micros(r["ts"]))].append(r["score"])
    rows = 0
    for row in _examples(full.output, LAST_DAY):
        key = (row["user_id"], row["item_id"], _micros(row["ts"]))
        if key in replay["stale"] or any(
                v >= n for name, n in cardinality.items() for v in _listed(row[name])):
            continue  # served the old price, or an id the published fit does not have
        assert any(s == pytest.approx(t, rel=1e-5, abs=1e-6)
                   for s in by_key[key] for t in ranked[key]), key
        rows += 1
    assert rows > 300
    trees = lightgbm.Booster(model_file=str(replay["trained"].out / "gbdt.txt"))
    frame = (ds.dataset(full.output / "examples", format="parquet", partitioning="hive")
             .to_table(filter=ds.field("split") == "valid").to_pandas())
    layout = json.loads((replay["trained"].out / "gbdt.json").read_text())
    frame = frame[layout["columns"]].astype({c: "category" for c in layout["categorical"]})
    assert np.allclose([r["score"] for r in offline], trees.predict(frame), atol=1e-6)
    assert np.std([r["score"] for r in offline]) > 0


def test_a_hundred_candidates_come_back_in_the_models_order(replay):
    """/v1/rank of 100 candidates: sorted best first, each score the Keras model's on the
    input row it returns."""
    import keras

    answer = replay["many"]
    model = keras.models.load_model(replay["trained"].out / "model.keras")
    metadata = read_metadata(replay["first"].output)
    blocks = {name: np.asarray(rows, dtype=np.float32 if metadata.tfrecord.groups[name].dtype
                               == "float32" else np.int64)
              for name, rows in answer["groups"].items()}
    expected = np.asarray(model(blocks, training=False)).reshape(-1)
    scores = np.array([item["score"] for item in answer["items"]])
    assert len(scores) == 100 and len(set(item["item_id"] for item in answer["items"])) == 100
    assert np.all(np.diff(scores) <= 0)
    assert np.allclose(scores, expected, rtol=1e-5, atol=1e-6)


def _variant(model: Path, out: Path, *, noise: float, bias: float = 0.0, seed: int = 0) -> Path:
    """Another export of ``model`` in ``out``: its tables and dense weights plus seeded
    noise (sd ``noise``), its output bias shifted by ``bias``."""
    from featureline.core.scoring import DenseModel, write_dense
    from featureline.hps.config import load_hps_config
    from featureline.trainer.export import HPS_CONFIG, write_tables
    from featureline.trainer.score import _tables

    rng = np.random.default_rng(seed)
    dense = DenseModel.load(model)
    config = next(m for m in load_hps_config(model / HPS_CONFIG).models
                  if m.name == dense.layout["model"])
    tables = {t.name: (rows + rng.normal(0, noise, rows.shape).astype(np.float32),
                       next(c.vocabulary_version for c in config.tables if c.name == t.name))
              for t in config.tables for rows, _ in [_tables(model, config.name)[t.name]]}
    write_tables(out, tables, config.name, fit_version=dense.versions["fit"])
    weights = {k: v + rng.normal(0, noise, v.shape).astype(np.float32)
               for k, v in dense.weights.items()}
    weights[f"{dense.layout['output']}/bias"] = weights[f"{dense.layout['output']}/bias"] + bias
    write_dense(out, {k: v for k, v in dense.layout.items() if k != "version"}, weights,
                {name: rows for name, (rows, _) in tables.items()})
    return out


def test_the_gate_keeps_a_worse_model_out_and_a_reload_swaps_whole_models(replay, tmp_path):
    """The quality gate on the full run's validation day: an untrained model (random dense
    weights) is refused and the served link stays; a model as good is promoted. Reloads
    under load (A → B → A …) answer every ranking from one model: each answer's scores are
    all of A or all of B, as its model_version says. A damaged dense part is refused by the
    reload, and the model served before it keeps answering."""
    import threading

    from click.testing import CliRunner
    from fastapi.testclient import TestClient

    from featureline.api.app import create_app
    from featureline.cli import main
    from featureline.core.scoring import DenseModel, write_dense
    from featureline.trainer.quality import Verdict, point, promote
    from featureline.trainer.settings import GateConfig
    from tests.feast_data import copy_project

    first, full = replay["first"].output, replay["full"].output
    a = tmp_path / "a"
    shutil.copytree(replay["trained"].out, a, ignore=shutil.ignore_patterns("rocksdb"))
    link = tmp_path / "ranker"
    point(link, a)
    untrained = _variant(a, tmp_path / "untrained", noise=0.0)
    dense = DenseModel.load(untrained)
    rng = np.random.default_rng(1)
    write_dense(untrained, {k: v for k, v in dense.layout.items() if k != "version"},
                {k: rng.normal(0, 0.5, v.shape) for k, v in dense.weights.items()})
    ran = CliRunner().invoke(main, ["promote", str(untrained), "--data", str(full),
                                    "--served", str(link)])
    assert ran.exit_code == 1 and "REFUSED: ranker is worse than the served model" in ran.output
    (refused,) = [Verdict(**v) for v in json.loads((untrained / "gate.json").read_text())[
        "models"]]
    assert not refused.promoted
    assert refused.reference["version"] == DenseModel.load(a).version
    assert refused.candidate["auc"] < refused.reference["auc"] - 0.05
    assert link.resolve() == a.resolve()
    assert 'featureline_model_gate_refused{model="ranker"} 1.0' in (a / "gate.prom").read_text()

    # A copy of the served export: the dense part and the trees, each as good as served.
    again = shutil.copytree(a, tmp_path / "again")
    verdicts = promote(full, again, link, GateConfig())
    assert {v.model: v.promoted for v in verdicts} == {"ranker": True, "ranker-gbdt": True}
    assert all(v.reference["name"] == "served model" and v.candidate["auc"] == v.reference["auc"]
               for v in verdicts)
    assert link.resolve() == again.resolve()
    b = _variant(a, tmp_path / "b", noise=1e-3, bias=0.02, seed=2)
    (accepted,) = promote(full, b, link, GateConfig())
    assert accepted.promoted and accepted.reference["name"] == "served model", accepted.reason
    assert link.resolve() == b.resolve()
    point(link, a)

    project = copy_project(tmp_path, ttl="3650d", api={
        "auth": {"enabled": False}, "data": str(first), "hps": str(link / "hps.yaml"),
        "feature_cache": {"ttl_s": 0}})
    body = {**replay["asked"], "model": "ranker"}
    answers: list = []
    stop = threading.Event()
    with TestClient(create_app(project.serving(), output=first, redis_url=replay["url"])) as api:
        def ranked() -> dict:
            answer = api.post("/v1/rank", json=body)
            assert answer.status_code == 200, answer.text
            return answer.json()

        def reload(target: Path) -> None:
            point(link, target)
            answer = api.post("/v1/admin/models/ranker/reload")
            assert answer.status_code == 200, answer.text
            assert 0 < answer.json()["held_ms"] < 10_000

        assert 'featureline_model_gate_refused{model="ranker"} 1.0' in api.get("/metrics").text
        expected = {}
        for target in (b, a):
            reload(target)
            answer = ranked()
            expected[answer["model_version"]] = [i["score"] for i in answer["items"]]
        old, new = expected.values()
        assert len(expected) == 2 and old != new

        def load() -> None:
            while not stop.is_set():
                answers.append(api.post("/v1/rank", json=body))

        threads = [threading.Thread(target=load) for _ in range(3)]
        for thread in threads:
            thread.start()
        for target in (b, a) * 4:
            reload(target)
        stop.set()
        for thread in threads:
            thread.join()
        assert {r.status_code for r in answers} == {200}
        versions = [r.json()["model_version"] for r in answers]
        assert set(versions) == set(expected)
        for answer in answers:
            scores = [i["score"] for i in answer.json()["items"]]
            assert scores == pytest.approx(expected[answer.json()["model_version"]], rel=1e-6)

        # A served ranker's name reloads the tables it scores with, and the rankers.
        trees = api.post("/v1/admin/models/ranker-gbdt/reload")
        assert trees.status_code == 200, trees.text
        assert trees.json()["model"] == "ranker-gbdt"
        assert trees.json()["rows"] == api.post("/v1/admin/models/ranker/reload").json()["rows"]
        damaged = tmp_path / "damaged"
        shutil.copytree(b, damaged)
        (damaged / "dense.npz").write_bytes(b"not a zip file")
        point(link, damaged)
        answer = api.post("/v1/admin/models/ranker/reload")
        assert answer.status_code == 500 and "dense.npz" in answer.json()["message"], answer.text
        assert ranked()["model_version"] == DenseModel.load(a).version
        too_many = api.post("/v1/rank", json={**body, "item_ids": [str(i) for i in range(1001)]})
        assert too_many.status_code == 413 and "item_ids" in too_many.text


def test_the_logged_model_inputs_equal_their_definition_at_request_time(replay):
    """`featureline consistency` over the replay's feature log: every model input the API
    served (each /v1/model-inputs and /v1/rank candidate row) against the same request
    answered again from the output's events and the archive's pushed events applied by
    then — per feature, none differs."""
    import functools
    import time

    from featureline.api.inputs_consistency import ENTITY, compare_inputs
    from featureline.feature_store.consistency import check_consistency
    from featureline.stream.expected import ArchivedStream

    first = replay["first"].output
    expected = ArchivedStream(replay["archive"], first)
    started = time.perf_counter()
    report = check_consistency(replay["log"], first, replay["project"].feature_store,
                               expected=expected, more=functools.partial(
                                   compare_inputs, output=first, expected=expected))
    seconds = time.perf_counter() - started
    inputs = {f.feature.removeprefix("input:"): f for f in report.features
              if f.entity == ENTITY}
    assert set(inputs) == {f.name for f in read_metadata(first).features}
    for name, feature in inputs.items():
        assert (feature.mismatch, feature.missing, feature.extra) == (0, 0, 0), (
            name, feature.top)
        assert feature.compared > 1000, (name, feature.compared, feature.unsettled)
    print({"rows": report.rows, "compared": inputs["price_norm"].compared,
           "unsettled": inputs["price_norm"].unsettled, "seconds": round(seconds, 1)})
    # Without the archive the pushed events are missing offline, as from a stream that lost
    # them: the windows over them differ, the rows' request columns do not.
    lost = check_consistency(replay["log"], first, replay["project"].feature_store,
                             more=functools.partial(compare_inputs, output=first))
    differing = {f.feature.removeprefix("input:") for f in lost.features
                 if f.entity == ENTITY and f.mismatch}
    assert {"user_events_1h", "ui_events_24h", "user_secs_since_prev"} <= differing
    assert "device_cat" not in differing


FUZZ_CONFIG = Path(__file__).parent / "fuzz" / "schemathesis.toml"
# Routes anyone may call: the probes, the metrics, the API's own documents.
OPEN = {"/healthz", "/readyz", "/metrics", "/openapi.json", "/docs", "/redoc"}


def test_the_api_holds_its_contract_under_the_fuzzer(replay, tmp_path, redis_server):
    """schemathesis over the API with authentication on, on a real output with its model
    inputs and ranker: every operation, every check, the examples, coverage, fuzzing and
    stateful phases, a fixed seed (tests/fuzz/schemathesis.toml): no failure. Then, without
    a key, every route but the open ones refuses."""
    import subprocess
    import sys
    import threading

    import httpx
    import uvicorn

    from featureline.api.app import create_app
    from featureline.feature_store.publish import publish
    from featureline.feature_store.redis_server import free_port
    from featureline.feature_store.repo import open_repo
    from tests.feast_data import copy_project, fresh_db

    keys = tmp_path / "api-keys"
    keys.write_text("reader-key read\nwriter-key write\nadmin-key admin\n")
    first = replay["first"].output
    project = copy_project(tmp_path, ttl="3650d", api={
        "auth": {"keys_file": str(keys)}, "data": str(first),
        "hps": str(replay["trained"].hps_config)})
    url = fresh_db(redis_server, 13)
    publish(open_repo(project.feature_store, first, url=url), progress=lambda _: None)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(
        create_app(project.serving(), output=first, redis_url=url), host="127.0.0.1",
        port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(600):
            if server.started:
                break
            time.sleep(0.1)
        fuzzed = subprocess.run(
            [str(Path(sys.executable).parent / "st"), "--config-file", str(FUZZ_CONFIG),
             "--no-color", "run", f"{base}/openapi.json",
             "--phases", "examples,coverage,fuzzing,stateful", "--max-examples", "20",
             "-H", "Authorization: Bearer admin-key"],
            cwd=tmp_path, capture_output=True, text=True, timeout=180)  # its cache there
        summary = fuzzed.stdout[fuzzed.stdout.rfind("SUMMARY"):]
        assert fuzzed.returncode == 0, fuzzed.stdout[-6000:]
        assert "Tested: 11" in summary and " passed" in summary, summary
        document = httpx.get(f"{base}/openapi.json").json()
        refused = {}
        for path, operations in document["paths"].items():
            for method in operations:
                if path in OPEN:
                    continue
                answer = httpx.request(method, base + path.replace("{name}", "ranker"),
                                       json={})
                refused[f"{method.upper()} {path}"] = answer.status_code
        assert len(refused) == 8 and set(refused.values()) == {401}, refused
    finally:
        server.should_exit = True
        thread.join(timeout=30)
