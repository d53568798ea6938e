"""The reference trainer on the shared small ETL output: it beats the popularity baseline on
validation, its model follows metadata.json, and the exported tables load through the
parameter server equal to the trained weights row for row, tagged with their vocabulary.
`featureline lift` trains it without named features."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pandas as pd
import pytest

from featureline.core.errors import ConfigError
from featureline.core.metadata import FIRST_ID, OOV_ID, PADDING_ID, encoded_name, read_metadata
from featureline.etl.tfrecord.reader import dataset, read_numpy
from featureline.hps.config import load_hps_config
from featureline.hps.server import ParameterServer
from featureline.trainer.model import Blank, embedding_tables, table_weights, tfrecord_groups
from tests.test_cli import _featureline

EPOCHS = 4
PATIENCE = 1


@pytest.fixture(scope="module")
def trained(job_output, tmp_path_factory):
    from featureline.trainer.train import train

    out = tmp_path_factory.mktemp("model")
    # A deployment's settings the written hps.yaml keeps (its tables are replaced).
    template = out.parent / f"{out.name}-template.yaml"
    template.write_text(json.dumps({
        "models": [{"name": "ranker", "cache_fraction": 0.25,
                    "tables": [{"name": "user", "dim": 1, "source": "/nowhere"}]}],
        "persistent_db": {"path": str(out / "replica")}}))
    return train(job_output.output, out, epochs=EPOCHS, patience=PATIENCE, batch_size=512,
                 hps_template=template, progress=lambda _: None)


@pytest.fixture(scope="module")
def model(trained):
    import keras

    return keras.models.load_model(trained.out / "model.keras")


def test_the_model_beats_the_popularity_baseline(job_output, trained):
    validation = trained.validation
    assert validation["rows"] == job_output.metadata["split"]["rows"]["valid"]
    assert validation["model"]["auc"] > validation["baseline"]["auc"]
    assert validation["model"]["log_loss"] < validation["baseline"]["log_loss"]
    ran = len(trained.epochs)
    assert [epoch["epoch"] for epoch in trained.epochs] == list(range(1, ran + 1))
    assert ran == EPOCHS or ran == trained.best_epoch + PATIENCE  # stopped early
    assert trained.epochs[-1]["loss"] < trained.epochs[0]["loss"]
    report = json.loads((trained.out / "training.json").read_text())
    assert report["validation"] == validation
    assert report["dataset_version"] == job_output.metadata["dataset"]["version"]


def test_the_best_epochs_weights_are_restored_scored_and_saved(job_output, trained, model):
    """The best epoch by validation AUC (the history's own record) is the one kept: the saved
    model scores the validation split exactly as that epoch did, whichever epoch ran last."""
    from featureline.etl.tfrecord.reader import dataset
    from featureline.trainer.model import label_group
    from featureline.trainer.train import _inputs

    aucs = [epoch["val_auc"] for epoch in trained.epochs]
    assert trained.best_epoch == int(np.argmax(aucs)) + 1
    metadata = read_metadata(job_output.output)
    valid = _inputs(dataset(metadata, 512, "valid", grouped=True), label_group(metadata))
    with warnings.catch_warnings():  # Keras learns the split's length as it reads it
        warnings.filterwarnings("ignore", message="Your input ran out of data")
        scored = model.evaluate(valid, verbose=0, return_dict=True)
    assert scored["auc"] == pytest.approx(aucs[trained.best_epoch - 1], abs=1e-6)
    assert scored["loss"] == pytest.approx(
        trained.epochs[trained.best_epoch - 1]["val_loss"], abs=1e-5)
    report = json.loads((trained.out / "training.json").read_text())
    assert report["best_epoch"] == trained.best_epoch


def test_the_gbdt_baseline_is_scored_on_the_models_validation_rows(job_output, trained):
    """LightGBM on the Parquet examples: the same validation rows as the model (count and
    positives; train() refuses a difference), early-stopped, a real score."""
    validation = trained.validation
    trees = validation["gbdt"]
    assert trees["rows"] == validation["rows"] == job_output.metadata["split"]["rows"]["valid"]
    assert trees["positives"] == round(validation["positive_rate"] * validation["rows"])
    assert 1 <= trees["rounds"] < 2000
    assert validation["baseline"]["auc"] < trees["auc"] < 1.0
    assert 0 < trees["log_loss"] < validation["baseline"]["log_loss"]
    assert "GBDT" in trained.summary()


def test_the_baseline_is_each_items_smoothed_training_click_rate(job_output):
    """From the Parquet examples with pandas, against the trainer's from the TFRecords."""
    from featureline.trainer.quality import BASELINE_SMOOTHING, popularity

    rates, prior = popularity(read_metadata(job_output.output))
    train = pd.read_parquet(job_output.output / "examples" / "split=train")
    item = encoded_name("item_id")
    assert prior == pytest.approx(train["label"].mean())
    by_item = train.groupby(item)["label"].agg(["sum", "count"])
    expected = (by_item["sum"] + BASELINE_SMOOTHING * prior) / (by_item["count"]
                                                                + BASELINE_SMOOTHING)
    np.testing.assert_allclose(rates[by_item.index.to_numpy()], expected.to_numpy())
    unseen = np.setdiff1d(np.arange(len(rates)), by_item.index.to_numpy())
    np.testing.assert_allclose(rates[unseen], prior)


def test_the_model_is_built_from_metadata(job_output, model):
    metadata = job_output.metadata
    plan = metadata["embedding_plan"]["features"]
    owners = [f["name"] for f in metadata["features"]
              if f["kind"] in ("categorical", "multi_hot") and "shares" not in f]
    tables = {layer.name: layer for layer in model.layers if layer.name.startswith("emb_")}
    # One table per categorical feature; the previous item and the history use the item's.
    assert sorted(tables) == sorted(f"emb_{owner}" for owner in owners)
    for owner in owners:
        assert tuple(tables[f"emb_{owner}"].embeddings.shape) == (
            plan[owner]["cardinality"], plan[owner]["width"])
    groups = metadata["tfrecord"]["groups"]
    assert sorted(model.input) == sorted(name for name in groups if name != "y")


def test_exported_tables_load_through_the_parameter_server(job_output, trained, model):
    config = load_hps_config(trained.hps_config)
    (ranker,) = config.models
    assert (ranker.name, ranker.cache_fraction) == ("ranker", 0.25)  # the template's
    assert config.persistent_db.path == str(trained.out / "replica")
    versions = {c: v["version"] for c, v in job_output.metadata["vocabularies"].items()}
    owners = {"user": encoded_name("user_id"), "item": encoded_name("item_id")}
    server = ParameterServer(config)
    try:
        for table in ranker.tables:
            owner = owners.get(table.name, table.name)
            weights = table_weights(model, owner)
            assert table.dim == weights.shape[1]
            got = server.lookup("ranker", table.name, np.arange(len(weights)))
            np.testing.assert_array_equal(got, weights)
            column = next((c for c in versions if encoded_name(c) == owner), None)
            assert table.vocabulary_version == (versions[column] if column else None)
            # Every table was trained on the examples of the output's fit.
            assert table.fit_version == job_output.metadata["fit"]["version"]
    finally:
        server.close()
    assert {t.name for t in ranker.tables} >= {"user", "item", "category_x_device"}
    fit = job_output.metadata["fit"]
    assert trained.fit == {"version": fit["version"], "trained_until": fit["trained_until"],
                           "age_days": fit["age_days"]}
    report = json.loads((trained.out / "training.json").read_text())
    assert report["fit"]["version"] == fit["version"]
    assert f"fit {fit['version']}" in trained.summary()


def test_rows_no_training_example_read_hold_the_oov_rows_vector(job_output, trained, model):
    """A value the training split never holds (an unused hash bucket here; a value a kept
    fit numbered after the training days) is scored as the out-of-vocabulary id is, not by a
    random initial vector of its own; every other row keeps what training made of it."""
    metadata = read_metadata(job_output.output)
    train = read_numpy(metadata, "train")
    kinds = {f.name: f.kind for f in metadata.features}
    settled = 0
    for owner, spec in embedding_tables(metadata).items():
        weights = table_weights(model, owner)
        seen = np.zeros(len(weights), dtype=bool)
        for name in spec.features:
            ids = train[name].reshape(-1)
            seen[ids[ids != PADDING_ID] if kinds[name] == "multi_hot" else ids] = True
        unread = np.flatnonzero(~seen[FIRST_ID:]) + FIRST_ID
        assert trained.unreached_rows[owner] == len(unread), owner
        np.testing.assert_array_equal(weights[unread], np.broadcast_to(
            weights[OOV_ID], (len(unread), weights.shape[1])))
        read = np.flatnonzero(seen[FIRST_ID:]) + FIRST_ID
        assert not (weights[read] == weights[OOV_ID]).all(axis=1).any(), owner
        settled += len(unread)
    assert settled > 0  # the test can fail
    report = json.loads((trained.out / "training.json").read_text())
    assert report["unreached_rows"] == trained.unreached_rows


def test_without_tensorflow_the_demo_serves_a_factorisation_of_the_interactions(
        job_output, tmp_path, monkeypatch):
    import sys

    import pyarrow.parquet as pq

    from featureline.demo import EMBEDDED_TABLES, train_tables

    monkeypatch.setitem(sys.modules, "featureline.trainer.train", None)  # import fails
    said = []
    hps_config = train_tables(job_output.output, tmp_path, said.append, lambda _: None)
    assert len(said) == 1 and "TensorFlow is not installed" in said[0]
    (ranker,) = load_hps_config(hps_config).models
    tables = {t.name: t for t in ranker.tables}
    assert set(tables) == set(EMBEDDED_TABLES.values())
    metadata = job_output.metadata
    plan = metadata["embedding_plan"]["features"]
    vectors = {}
    server = ParameterServer(load_hps_config(hps_config))
    try:
        for column, name in EMBEDDED_TABLES.items():
            feature = plan[encoded_name(column)]
            assert tables[name].dim == feature["width"]
            assert tables[name].vocabulary_version == metadata["vocabularies"][column]["version"]
            vectors[column] = server.lookup("ranker", name, np.arange(feature["cardinality"]))
    finally:
        server.close()
    # The vectors factor the training interactions: a pair seen there scores higher than
    # the same users with the same items shuffled among them (which keeps the popularity of
    # each), and far higher than known users and items paired at random.
    user, item = encoded_name("user_id"), encoded_name("item_id")
    pairs = pq.read_table(job_output.output / "examples" / "split=train",
                          columns=[user, item]).to_pandas()
    users, items = vectors["user_id"][pairs[user]], vectors["item_id"][pairs[item]]
    rng = np.random.default_rng(0)
    shuffled = items[rng.permutation(len(items))]
    anyone = vectors["user_id"][rng.integers(2, len(vectors["user_id"]), len(pairs))]
    anything = vectors["item_id"][rng.integers(2, len(vectors["item_id"]), len(pairs))]
    seen = (users * items).sum(axis=1).mean()
    assert seen > 1.05 * (users * shuffled).sum(axis=1).mean()
    assert seen > 5 * (anyone * anything).sum(axis=1).mean()


def test_exported_tables_keep_a_deployments_parameter_server_settings(tmp_path):
    from featureline.hps.config import HpsConfig
    from featureline.trainer.export import write_tables

    template = HpsConfig.model_validate({
        "models": [{"name": "ranker", "cache_fraction": 0.25, "hit_rate_threshold": 0.5,
                    "tables": [{"name": "user", "dim": 4, "source": "/old/user"}]},
                   {"name": "other", "tables": [{"name": "t", "dim": 2, "source": "/o/t"}]}],
        "volatile_db": {"type": "redis", "url": "redis://cache:6379/0"},
        "persistent_db": {"path": "/tmp/hps/rocksdb"}, "updates": {"group": "hps"}})
    tables = {"user": (np.ones((5, 3), np.float32), "v-user"),
              "item": (np.zeros((7, 2), np.float32), "v-item")}
    written = load_hps_config(write_tables(tmp_path, tables, "ranker", template))
    ranker, other = written.models
    assert (ranker.name, ranker.cache_fraction, ranker.hit_rate_threshold) == ("ranker", 0.25, 0.5)
    assert [(t.name, t.dim, t.source, t.vocabulary_version) for t in ranker.tables] == [
        ("user", 3, str(tmp_path / "tables" / "user"), "v-user"),
        ("item", 2, str(tmp_path / "tables" / "item"), "v-item")]
    assert other == template.models[1]
    assert (written.volatile_db, written.persistent_db, written.updates) == (
        template.volatile_db, template.persistent_db, template.updates)
    # A template without the model gets it added, with the parameter server's defaults.
    written = load_hps_config(write_tables(tmp_path, tables, "new", template))
    assert [m.name for m in written.models] == ["ranker", "other", "new"]
    assert written.models[0].tables == template.models[0].tables
    assert [t.name for t in written.models[2].tables] == ["user", "item"]


def test_the_auc_is_the_share_of_ordered_pairs_and_the_log_loss_the_mean():
    """The gate's and the report's metrics against their definitions, ties included: AUC =
    P(score of a positive > score of a negative) + half the ties."""
    from featureline.trainer.quality import evaluate

    rng = np.random.default_rng(3)
    labels = rng.integers(0, 2, 400)
    scores = np.round(rng.random(400) * 0.5 + labels * 0.2, 2)  # many ties
    positive, negative = scores[labels == 1], scores[labels == 0]
    pairs = positive[:, None] - negative[None, :]
    expected = ((pairs > 0).sum() + 0.5 * (pairs == 0).sum()) / pairs.size
    measured = evaluate(labels, scores)
    assert measured["auc"] == pytest.approx(expected, abs=1e-12)
    clipped = np.clip(scores, 1e-7, 1 - 1e-7)
    assert measured["log_loss"] == pytest.approx(
        -np.mean(labels * np.log(clipped) + (1 - labels) * np.log(1 - clipped)))
    assert evaluate(np.array([1, 1, 0]), np.array([0.9, 0.8, 0.1]))["auc"] == 1.0


def test_promote_keeps_the_newest_model_folders_the_served_one_and_anything_else(tmp_path):
    """`featureline promote --keep N` deletes only folders holding an exported model, never
    the served one nor a folder of anything else beside them."""
    import os

    from featureline.core.scoring import DENSE_LAYOUT
    from featureline.trainer.quality import prune

    folders = []
    for age, name in enumerate(["d4", "d3", "d2", "d1"]):  # d1 the oldest
        folder = tmp_path / name
        folder.mkdir()
        (folder / DENSE_LAYOUT).write_text("{}")
        os.utime(folder, (1_000_000 - age * 100, 1_000_000 - age * 100))
        folders.append(folder)
    (tmp_path / "output").mkdir()  # not a model
    (tmp_path / "ranker").symlink_to(tmp_path / "d1")
    gone = prune(tmp_path, 2, (tmp_path / "ranker").resolve())
    assert sorted(p.name for p in gone) == ["d2"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d1", "d3", "d4", "output", "ranker"]


# `featureline lift` on the same output: a left-out feature is blank in every row the model
# reads and absent from the trees, the side with every feature is the model trained above, and
# the report's differences are the seeds' own.

# One of each kind: a continuous feature, a categorical id, a multi-hot list.
LEFT_OUT = ("user_prior_positive_rate", "device_cat", "user_hist_items")


@pytest.fixture(scope="module")
def metadata(job_output):
    return read_metadata(job_output.output)


def test_a_left_out_feature_is_blank_in_every_row_and_the_others_unchanged(metadata):
    kinds = {f.name: f.kind for f in metadata.features}
    assert [kinds[name] for name in LEFT_OUT] == ["continuous", "categorical", "multi_hot"]
    blank = Blank(metadata, LEFT_OUT)
    columns = read_numpy(metadata, "valid")
    blanked = blank.columns(columns)
    assert (blanked["user_prior_positive_rate"] == 0).all()
    assert (blanked["device_cat"] == OOV_ID).all() and (columns["device_cat"] != OOV_ID).any()
    assert (blanked["user_hist_items"] == PADDING_ID).all()
    for name in set(columns) - set(LEFT_OUT):
        np.testing.assert_array_equal(blanked[name], columns[name])
    # The grouped batches the model reads, blanked in TensorFlow: the same values.
    rows = len(columns["device_cat"])
    (blocks,) = dataset(metadata, rows, "valid", grouped=True).map(blank.blocks).take(1)
    for name, group in tfrecord_groups(metadata).items():
        block = blocks[name].numpy()
        per_column = group.width // len(group.columns)
        for index, column in enumerate(group.columns):
            part = block[:, index * per_column:(index + 1) * per_column]
            np.testing.assert_array_equal(part.reshape(blanked[column].shape), blanked[column])


@pytest.fixture(scope="module")
def lifted(job_output):
    from featureline.trainer.lift import lift

    # Every continuous input of the item: the trees' popularity signal.
    return lift(job_output.output, ["item_id_te", "item_id_count", "item_id_cat"],
                seeds=(0, 1), epochs=EPOCHS, patience=PATIENCE, batch_size=512,
                progress=lambda _: None)


def test_the_side_with_every_feature_is_the_trained_model(lifted, trained):
    """Seed 0 with every feature: the model `featureline train` trains and its trees."""
    validation = trained.validation
    assert lifted.rows == validation["rows"]
    assert lifted.runs["model"]["with"][0]["auc"] == pytest.approx(
        validation["model"]["auc"], abs=1e-6)
    assert lifted.runs["gbdt"]["with"][0]["auc"] == pytest.approx(
        validation["gbdt"]["auc"], abs=1e-9)


def test_the_lift_is_the_seeds_differences(lifted):
    report = lifted.lift()
    model = lifted.runs["model"]
    deltas = [w["auc"] - wo["auc"] for w, wo in zip(model["with"], model["without"],
                                                     strict=True)]
    assert report["model"]["auc"]["per_seed"] == pytest.approx(deltas)
    assert report["model"]["auc"]["mean"] == pytest.approx(np.mean(deltas))
    assert report["model"]["auc"]["sd"] == pytest.approx(np.std(deltas, ddof=1))
    # The two seeds train different models.
    assert model["with"][0]["auc"] != model["with"][1]["auc"]
    # The trees once (they do not depend on the seed), other trees without the columns.
    assert len(lifted.runs["gbdt"]["with"]) == len(lifted.runs["gbdt"]["without"]) == 1
    assert report["gbdt"]["auc"]["mean"] != 0
    assert "(2 seeds, " in lifted.summary() and "GBDT: AUC +" in lifted.summary()


def test_names_are_the_examples_or_the_apis_and_others_are_refused(metadata):
    from featureline.trainer.lift import feature_names

    # An aggregation's output, as the examples and as the API name it.
    spec = next(f for f in metadata.features if f.name == "item_id_te")
    aggregated = metadata.model_copy(update={"features": [
        *metadata.features, spec.model_copy(update={"name": "user_activity__count_7d"})]})
    assert feature_names(aggregated, ["user_activity:count_7d", "item_id_te"]) == (
        "user_activity__count_7d", "item_id_te")
    with pytest.raises(ConfigError, match=r"--without.*'nope' is not a feature"):
        feature_names(metadata, ["nope"])
    # A feature that may be missing is left out with its missing indicator.
    indicator = next(f for f in metadata.features
                     if (f.transform or {}).get("name") == "missing_indicator")
    of = indicator.transform["of"]  # type: ignore[index]
    assert feature_names(metadata, [of]) == (of, indicator.name)


def test_the_command_names_an_unknown_feature_in_one_line(job_output):
    done = _featureline("lift", "--data", str(job_output.output), "--without", "nope")
    assert done.returncode == 2
    assert done.stderr.startswith("error: --without: 'nope' is not a feature of this output")
    assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) <= 2
