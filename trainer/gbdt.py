"""The gradient-boosted trees baseline (LightGBM, the ``[gbdt]`` extra): trained on the
Parquet examples' training split with the model's own input columns — every categorical id
as a categorical feature, every continuous feature as the ETL wrote it (model-ready), the
history lists left out — early-stopped on the validation split and scored on those same
rows, as the model is, and exported for ``/v1/rank`` (``core.scoring.TreeModel``;
docs/ARCHITECTURE.md, "Scoring")."""

from __future__ import annotations

import json
from collections.abc import Collection
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from featureline.core.metadata import Metadata, present
from featureline.core.scoring import TREES_LAYOUT, TREES_MODEL, model_version

ROUNDS = 2000
EARLY_STOPPING_ROUNDS = 50
LEARNING_RATE = 0.05
NAME = "gradient-boosted trees (LightGBM) on the examples' columns"
MISSING = "lightgbm is not installed: pip install 'featureline[gbdt]'"


def columns(metadata: Metadata, without: Collection[str] = ()
            ) -> tuple[list[str], list[str]]:
    """The baseline's columns (less ``without``), and which of them are categorical."""
    used = [f for f in metadata.features
            if f.kind in ("categorical", "continuous") and f.name not in without]
    return [f.name for f in used], [f.name for f in used if f.kind == "categorical"]


def split(metadata: Metadata, name: str, without: Collection[str] = ()
          ) -> tuple[Any, np.ndarray]:
    """The features (less ``without``) and labels of one split of the Parquet examples."""
    label = present(metadata.label, metadata, "label").name
    names, categorical = columns(metadata, without)
    folder = Path(metadata.folder or ".") / "examples" / f"split={name}"
    frame = pq.read_table(folder, columns=[*names, label]).to_pandas()
    for column in categorical:
        frame[column] = frame[column].astype("category")
    return frame[names], frame[label].to_numpy(dtype=np.float64)


def gbdt_baseline(metadata: Metadata, seed: int = 0, out: Path | None = None,
                  model_name: str = "ranker", without: Collection[str] = ()
                  ) -> dict[str, Any]:
    """LightGBM's validation scores (``auc``, ``log_loss``), the rounds it kept and the
    rows it was scored on; ``{"skipped": …}`` without LightGBM. ``out``: the trees are
    exported there too, as the model ``<model_name>-gbdt``; ``without``: columns left out
    (``featureline lift``)."""
    try:
        import lightgbm
    except ImportError:
        return {"name": NAME, "skipped": MISSING}
    from featureline.trainer.quality import evaluate

    train_x, train_y = split(metadata, "train", without)
    valid_x, valid_y = split(metadata, "valid", without)
    categorical = columns(metadata, without)[1]
    for column in categorical:  # the training split's categories, known or not
        valid_x[column] = valid_x[column].cat.set_categories(train_x[column].cat.categories)
    train_set = lightgbm.Dataset(train_x, train_y, categorical_feature=categorical)
    valid_set = lightgbm.Dataset(valid_x, valid_y, categorical_feature=categorical,
                                 reference=train_set)
    booster = lightgbm.train(
        {"objective": "binary", "metric": "auc", "learning_rate": LEARNING_RATE,
         "seed": seed, "num_threads": 2, "verbose": -1},
        train_set, num_boost_round=ROUNDS, valid_sets=[valid_set],
        callbacks=[lightgbm.early_stopping(EARLY_STOPPING_ROUNDS, verbose=False)])
    predicted = np.asarray(booster.predict(valid_x, num_iteration=booster.best_iteration))
    if out is not None:
        export_trees(booster, metadata, out, f"{model_name}{TREES_SUFFIX}")
    return {"name": NAME, "rounds": int(booster.best_iteration), "rows": len(valid_y),
            "positives": int(valid_y.sum()), **evaluate(valid_y, predicted)}


# The trees' model name: the dense model's, and this.
TREES_SUFFIX = "-gbdt"


def export_trees(booster: Any, metadata: Metadata, out: Path, model_name: str) -> Path:
    """The booster's kept rounds (LightGBM's text format, which keeps each categorical
    column's categories) and its layout: the model's name, its columns, which are
    categorical, the versions of the data it was trained on; the layout's path."""
    out.mkdir(parents=True, exist_ok=True)
    text = booster.model_to_string(num_iteration=booster.best_iteration)
    (out / TREES_MODEL).write_text(text)
    names, categorical = columns(metadata)
    layout = {"model": model_name, "columns": names, "categorical": categorical,
              "versions": {"dataset": metadata.dataset.version if metadata.dataset else None,
                           "fit": metadata.fit.version if metadata.fit else None},
              "version": model_version({"trees": np.frombuffer(text.encode(), np.uint8)})}
    path = out / TREES_LAYOUT
    path.write_text(json.dumps(layout, indent=2))
    return path
