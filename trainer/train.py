"""Train the reference model on an ETL output's TFRecords, score it on the validation split
against a popularity baseline, export its tables (``featureline train``).

Training stops when the validation AUC has not improved for ``patience`` epochs, and the
weights of the best epoch are restored before anything is scored, saved or exported. Before
each validation pass, every table row that no training example reads gets the
out-of-vocabulary row's vector (``model.settle_unreached``): a value the training days never
held is scored as out of vocabulary, whichever fit numbered it."""

from __future__ import annotations

import json
import os
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from featureline.core.errors import ConfigError, MetadataFormatError
from featureline.core.metadata import Metadata, encoded_name, read_metadata
from featureline.core.scoring import TREES_LAYOUT, TREES_MODEL
from featureline.etl.tfrecord.reader import dataset, read_numpy
from featureline.hps.config import load_hps_config
from featureline.trainer.export import export
from featureline.trainer.gbdt import gbdt_baseline
from featureline.trainer.model import (
    Blank,
    build_model,
    label_group,
    reached_rows,
    settle_unreached,
    tfrecord_groups,
)
from featureline.trainer.quality import evaluate, popularity

MODEL_FILE = "model.keras"
REPORT_FILE = "training.json"


@dataclass(frozen=True)
class TrainResult:
    out: Path
    hps_config: Path
    epochs: list[dict[str, float]]
    best_epoch: int  # 1-based: the epoch whose weights were restored, scored and exported
    validation: dict[str, Any]
    dataset_version: str
    vocabularies: dict[str, str]
    seconds: float
    # The fit the examples were transformed with: its version, where its training split
    # ended and its age at this dataset (docs/ARCHITECTURE.md, "Fits"); None: not recorded.
    fit: dict[str, Any] | None = None
    # Per table (its owner feature): the rows no training example read, given the
    # out-of-vocabulary row's vector.
    unreached_rows: dict[str, int] | None = None

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "out": str(self.out), "hps_config": str(self.hps_config)}

    def summary(self) -> str:
        """The validation scores against the baseline, and where the tables went."""
        model, baseline = self.validation["model"], self.validation["baseline"]
        trees = self.validation.get("gbdt", {})
        scored = "auc" in trees  # not when LightGBM is missing
        auc = f", GBDT {trees['auc']:.4f}" if scored else ""
        loss = f", {trees['log_loss']:.4f}" if scored else ""
        return (f"best epoch {self.best_epoch} of {len(self.epochs)} (its weights kept); "
                f"validation ({self.validation['rows']:,} rows): AUC {model['auc']:.4f} vs "
                f"popularity {baseline['auc']:.4f}{auc}; log-loss {model['log_loss']:.4f} vs "
                f"{baseline['log_loss']:.4f}{loss}\ntables for the parameter server: "
                f"{self.hps_config} (trained in {self.seconds:.1f}s on dataset "
                f"{self.dataset_version}{self._fit_text()})")

    def _fit_text(self) -> str:
        if self.fit is None:
            return ""
        age = self.fit["age_days"]
        return f", fit {self.fit['version']}" + (f", {age:g} days old" if age else "")


def _inputs(batches: Any, label: str) -> Any:
    """(features, label) pairs for Keras from the grouped batches."""
    return batches.map(lambda blocks: ({k: v for k, v in blocks.items() if k != label},
                                       blocks[label]))


def scores(model: Any, metadata: Metadata, batch_size: int, blank: Blank | None = None
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Labels, model scores and the rows' item ids over the validation split, in one pass
    (``blank``: the features held blank, as the model was trained)."""
    label = label_group(metadata)
    item_group, item_index = next(
        (name, g.columns.index(encoded_name("item_id")))
        for name, g in tfrecord_groups(metadata).items() if encoded_name("item_id") in g.columns)
    labels, predicted, items = [], [], []
    for blocks in dataset(metadata, batch_size, "valid", grouped=True):
        if blank is not None:
            blocks = blank.blocks(blocks)
        features = {k: v for k, v in blocks.items() if k != label}
        predicted.append(np.asarray(model(features, training=False)).reshape(-1))
        labels.append(blocks[label].numpy().reshape(-1))
        items.append(blocks[item_group].numpy()[:, item_index])
    if not labels:
        raise ConfigError("etl.split.valid_days", "the validation split is empty")
    return np.concatenate(labels), np.concatenate(predicted), np.concatenate(items)


def trainable(data: str | Path) -> Metadata:
    """``data``'s metadata, refused where the ETL wrote no TFRecords to train from."""
    metadata = read_metadata(data)
    if metadata.tfrecord is None:
        raise ConfigError("etl.tfrecord.enabled", f"{data}: the ETL wrote no TFRecords to "
                          "train from; run it with etl.tfrecord.enabled: true")
    return metadata


@dataclass(frozen=True)
class Fitted:
    """A trained model with the best epoch's weights, and what training read."""

    model: Any
    history: list[dict[str, float]]
    best_epoch: int  # 1-based
    train_columns: dict[str, np.ndarray]
    unreached: dict[str, int]


def fit_model(metadata: Metadata, *, seed: int, epochs: int, patience: int, batch_size: int,
              learning_rate: float, progress: Callable[[str], None],
              blank: Blank | None = None) -> Fitted:
    """The model trained over the training split, early-stopped on the validation AUC, the
    best epoch's weights restored; ``blank``: the features held blank in both splits
    (``featureline lift``). Each model starts from ``seed`` alone, whatever was trained
    before it in the process."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's start-up chatter
    import keras

    keras.backend.clear_session()

    label = label_group(metadata)
    model = build_model(metadata, seed=seed)
    model.compile(optimizer=keras.optimizers.Adam(learning_rate),
                  loss="binary_crossentropy", metrics=[keras.metrics.AUC(name="auc")])
    history: list[dict[str, float]] = []

    class Report(keras.callbacks.Callback):
        def on_epoch_end(self, epoch: int, logs: dict[str, float] | None = None) -> None:
            row = {"epoch": epoch + 1, **{k: round(float(v), 6) for k, v in (logs or {}).items()}}
            history.append(row)
            progress(f"epoch {epoch + 1}/{epochs}: " + ", ".join(
                f"{k} {v:.4f}" for k, v in row.items() if k != "epoch"))

    train_columns = read_numpy(metadata, "train")
    if blank is not None:
        train_columns = blank.columns(train_columns)
    reached = reached_rows(metadata, train_columns)
    unreached: dict[str, int] = {}

    class Settle(keras.callbacks.Callback):
        # Before each validation pass: what it scores (and early stopping keeps) is the
        # model as it is exported (the OOV row moves only where training reads it).
        def on_test_begin(self, logs: dict[str, float] | None = None) -> None:
            unreached.update(settle_unreached(model, reached))

    train_rows = dataset(metadata, batch_size, "train", grouped=True, shuffle=64, seed=seed)
    valid_rows = dataset(metadata, batch_size, "valid", grouped=True)
    if blank is not None:
        train_rows, valid_rows = train_rows.map(blank.blocks), valid_rows.map(blank.blocks)
    stopping = keras.callbacks.EarlyStopping(monitor="val_auc", mode="max", patience=patience,
                                             restore_best_weights=True)
    with warnings.catch_warnings():
        # Keras learns the epoch's length from the first one and says so; nothing is wrong.
        warnings.filterwarnings("ignore", message="Your input ran out of data")
        model.fit(_inputs(train_rows, label), validation_data=_inputs(valid_rows, label),
                  epochs=epochs, verbose=0, shuffle=False,
                  callbacks=[Settle(), Report(), stopping])
    best_epoch = stopping.best_epoch + 1
    if len(history) < epochs:
        progress(f"stopped after epoch {len(history)}: no better validation AUC for "
                 f"{patience} epochs")
    progress(f"kept the weights of epoch {best_epoch} (validation AUC "
             f"{history[best_epoch - 1].get('val_auc', float('nan')):.4f})")
    return Fitted(model, history, best_epoch, train_columns, unreached)


def train(data: str | Path, out: str | Path, *, epochs: int = 10, patience: int = 2,
          batch_size: int = 2048, learning_rate: float = 1e-3, model_name: str = "ranker",
          seed: int = 0, hps_template: str | Path | None = None, gbdt: bool = True,
          progress: Callable[[str], None] = print) -> TrainResult:
    """Build the model from ``data``'s metadata.json, train it over the training split for
    at most ``epochs`` epochs — stopping once the validation AUC has not improved for
    ``patience`` epochs, then restoring the best epoch's weights — compare it with the
    popularity baseline and (``gbdt``, where LightGBM is installed) gradient-boosted trees
    on the same validation rows, and write ``out``: the tables and hps.yaml
    (the settings of ``hps_template`` when given, see ``export.write_tables``), the Keras
    model, and training.json."""
    started = time.perf_counter()
    template = load_hps_config(hps_template) if hps_template is not None else None
    metadata = trainable(data)
    fitted = fit_model(metadata, seed=seed, epochs=epochs, patience=patience,
                       batch_size=batch_size, learning_rate=learning_rate, progress=progress)
    model, history, best_epoch = fitted.model, fitted.history, fitted.best_epoch
    train_columns, unreached = fitted.train_columns, fitted.unreached

    labels, predicted, items = scores(model, metadata, batch_size)
    item_rate, prior = popularity(metadata, train_columns)
    validation = {"rows": len(labels), "positive_rate": float(labels.mean()),
                  "model": evaluate(labels, predicted),
                  "baseline": {"name": "item popularity (smoothed training click rate)",
                               "prior": prior, **evaluate(labels, item_rate[items])}}
    exported_trees = False
    if gbdt:
        progress("training the gradient-boosted trees baseline on the Parquet examples")
        trees = gbdt_baseline(metadata, seed, Path(out), model_name)
        if "rows" in trees and (trees["rows"], trees["positives"]) != (len(labels),
                                                                      int(labels.sum())):
            raise MetadataFormatError(str(data), "the Parquet examples' validation split "
                                      f"({trees['rows']:,} rows) is not the TFRecords' "
                                      f"({len(labels):,})")
        validation["gbdt"] = trees
        exported_trees = "rounds" in trees
    if not exported_trees:  # nor any of an earlier run in the folder
        for name in (TREES_MODEL, TREES_LAYOUT):
            (Path(out) / name).unlink(missing_ok=True)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    fit = (None if metadata.fit is None else
           {"version": metadata.fit.version, "trained_until": metadata.fit.trained_until,
            "age_days": metadata.fit.age_days})
    hps_config = export(model, metadata, out, model_name, template)
    with warnings.catch_warnings():
        # Keras 3.15 saving TensorFlow variables under NumPy 2; the file is complete.
        warnings.filterwarnings("ignore", message="__array__ implementation doesn't accept")
        model.save(out / MODEL_FILE)
    vocabularies = {c: v.version for c, v in metadata.vocabularies.items()}
    result = TrainResult(out, hps_config, history, best_epoch, validation,
                         metadata.dataset.version if metadata.dataset else "", vocabularies,
                         round(time.perf_counter() - started, 3), fit, unreached)
    (out / REPORT_FILE).write_text(json.dumps(result.to_json(), indent=2))
    return result
