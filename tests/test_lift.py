"""`featureline lift` on the shared small ETL output: a left-out feature is blank in every
row the model reads and absent from the trees, the side with every feature is the model
`featureline train` trains, and the report's differences are the seeds' own."""

from __future__ import annotations

import numpy as np
import pytest

from featureline.core.errors import ConfigError
from featureline.core.ids import OOV_ID, PADDING_ID
from featureline.core.metadata import read_metadata
from featureline.etl.tfrecord.reader import dataset, read_numpy
from featureline.trainer.model import Blank, tfrecord_groups
from tests import test_trainer
from tests.test_cli import _featureline
from tests.test_trainer import EPOCHS, PATIENCE

# `featureline train`'s model on the same output (the fixture of tests/test_trainer.py).
trained = test_trainer.trained

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


def test_the_command_names_an_unknown_feature_in_one_line(job_output):
    done = _featureline("lift", "--data", str(job_output.output), "--without", "nope")
    assert done.returncode == 2
    assert done.stderr.startswith("error: --without: 'nope' is not a feature of this output")
    assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) <= 2
