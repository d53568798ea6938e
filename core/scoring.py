"""The trained model's dense part, as the trainer exports it and the API runs it: NumPy alone,
no TensorFlow (docs/ARCHITECTURE.md, "Scoring").

The reference model (``trainer/model.py``) reads the TFRecord groups: each categorical column
through its embedding table, each multi-hot list as the mean of its rows that are not padding,
the continuous block through a bottom MLP; all of it concatenated into a top MLP and a
sigmoid. The trainer writes its embedding tables for the parameter server (``hps.yaml``) and,
beside them, this part: ``dense.json`` (the layout: each group's columns, the table each reads,
the layers in order, the versions the model was trained on) and ``dense.npz`` (each layer's
kernel and bias). :meth:`DenseModel.scores` runs it on the groups ``/v1/model-inputs`` gives,
with the vectors a lookup returns — the same pass for every candidate of a request.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from featureline.core.errors import FeaturelineError, NotFoundError
from featureline.core.ids import PADDING_ID

DENSE_LAYOUT = "dense.json"
DENSE_WEIGHTS = "dense.npz"
# The gradient-boosted trees exported beside them (LightGBM's text format, and the layout).
TREES_MODEL = "gbdt.txt"
TREES_LAYOUT = "gbdt.json"
# The quality gate's latest verdict, in Prometheus' format, in the served model's folder.
GATE_METRICS = "gate.prom"
# (table, ids) → [len(ids), width] float32 vectors.
Lookup = Callable[[str, np.ndarray], np.ndarray]


class ModelNotExportedError(NotFoundError):
    """No dense part beside a model's tables."""

    def __init__(self, folder: Path) -> None:
        super().__init__(f"{folder / DENSE_LAYOUT}: the model's dense part was not exported "
                         f"(train it again with `featureline train`)")


class ModelFileError(FeaturelineError):
    """An exported model that cannot be read: a damaged file, a dense layer without its
    weights, dense weights that do not chain, trees without LightGBM."""

    exit_code = 2
    hint = "export the model again with `featureline train`"

    def __init__(self, path: Path, reason: str) -> None:
        self.path = str(path)
        super().__init__(f"{path}: {reason}")


def model_version(*parts: Mapping[str, np.ndarray]) -> str:
    """A model's identity: a digest of its arrays (the dense weights, the embedding tables),
    each under its name."""
    digest = hashlib.sha256()
    for arrays in parts:
        for name in sorted(arrays):
            digest.update(name.encode())
            digest.update(np.ascontiguousarray(arrays[name]).tobytes())
    return digest.hexdigest()[:16]


def write_dense(folder: Path, layout: Mapping[str, Any], weights: Mapping[str, np.ndarray],
                tables: Mapping[str, np.ndarray] | None = None) -> Path:
    """``layout`` (groups, layers, versions) and ``weights`` (``<layer>/kernel``,
    ``<layer>/bias``) under ``folder``, the layout stamped with the :func:`model_version` of
    the weights and ``tables`` (the vectors exported beside them); the layout's path."""
    folder.mkdir(parents=True, exist_ok=True)
    arrays: dict[str, Any] = {k: np.asarray(v, np.float32) for k, v in weights.items()}
    np.savez(folder / DENSE_WEIGHTS, **arrays)
    path = folder / DENSE_LAYOUT
    path.write_text(json.dumps({**layout, "version": model_version(arrays, tables or {})},
                               indent=2))
    return path


@dataclass(frozen=True)
class DenseModel:
    layout: dict[str, Any]
    weights: dict[str, np.ndarray]

    @classmethod
    def load(cls, folder: str | Path) -> DenseModel:
        folder = Path(folder)
        if not (folder / DENSE_LAYOUT).exists():
            raise ModelNotExportedError(folder)
        try:
            layout = json.loads((folder / DENSE_LAYOUT).read_text())
        except (OSError, ValueError) as exc:
            raise ModelFileError(folder / DENSE_LAYOUT, f"not readable: {exc}") from None
        try:
            with np.load(folder / DENSE_WEIGHTS) as stored:
                weights = {name: stored[name] for name in stored.files}
        except (OSError, ValueError, EOFError) as exc:  # a bad zip is a ValueError too
            raise ModelFileError(folder / DENSE_WEIGHTS, f"not readable: {exc}") from None
        model = cls(layout, weights)
        model._check(folder / DENSE_WEIGHTS)
        return model

    def _check(self, path: Path) -> None:
        """Every layer of the layout has its kernel and bias, each kernel as wide as its
        bias, and the layers of each stack chain."""
        try:
            stacks = [self.layout["bottom"], [*self.layout["top"], self.layout["output"]]]
        except KeyError as exc:
            raise ModelFileError(path.with_name(DENSE_LAYOUT), f"no {exc} layers") from None
        for stack in stacks:
            width = None
            for layer in stack:
                kernel = self.weights.get(f"{layer}/kernel")
                bias = self.weights.get(f"{layer}/bias")
                if kernel is None or bias is None or kernel.ndim != 2:
                    raise ModelFileError(path, f"layer {layer} has no kernel and bias")
                if bias.shape != kernel.shape[1:] or width not in (None, kernel.shape[0]):
                    raise ModelFileError(path, f"layer {layer}: a kernel of shape "
                                         f"{kernel.shape} and a bias of {bias.shape} after "
                                         f"a layer of width {width}")
                width = kernel.shape[1]

    @property
    def version(self) -> str:
        """The model's identity (:func:`model_version`), as exported."""
        return str(self.layout.get("version") or model_version(self.weights))

    @property
    def versions(self) -> dict[str, Any]:
        """The dataset, fit and vocabulary versions the model was trained on."""
        return dict(self.layout.get("versions", {}))

    def _dense(self, x: np.ndarray, layer: str, activation: str) -> np.ndarray:
        x = x @ self.weights[f"{layer}/kernel"] + self.weights[f"{layer}/bias"]
        if activation == "relu":
            return np.maximum(x, 0.0)
        return 0.5 * (1.0 + np.tanh(0.5 * x))  # the sigmoid, without exp's overflow

    def rank(self, features: Mapping[str, np.ndarray], groups: Mapping[str, np.ndarray],
             lookup: Lookup) -> np.ndarray:
        """The score of each candidate of a request (its ``/v1/model-inputs`` answer)."""
        return self.scores(groups, lookup)

    def scores(self, groups: Mapping[str, np.ndarray], lookup: Lookup) -> np.ndarray:
        """The model's score per row of ``groups`` (TFRecord group → [rows, width]); each
        table is looked up once, for the distinct ids of every column that reads it (the
        user's history: once for every candidate)."""
        return self.forward(self.inputs(groups, lookup))

    def inputs(self, groups: Mapping[str, np.ndarray], lookup: Lookup) -> list[np.ndarray]:
        """What the dense layers read, in the layout's order: each continuous block as
        it is, each embedded column's vectors (a multi-hot list's: the mean of those that
        are not padding)."""
        embedded = self._embedded(groups, lookup)
        parts = []
        for group in self.layout["groups"]:
            if group["kind"] == "continuous":
                parts.append(np.asarray(groups[group["name"]]).astype(np.float32))
                continue
            for column in group["columns"]:
                ids, rows = embedded[column["name"]]
                if group["kind"] == "categorical":
                    parts.append(rows[:, 0, :])
                else:  # multi-hot: the mean of the rows that are not padding
                    mask = (ids != PADDING_ID).astype(np.float32)[..., None]
                    parts.append((rows * mask).sum(axis=1) / np.maximum(mask.sum(axis=1), 1.0))
        return parts

    @property
    def continuous_parts(self) -> list[int]:
        """Which of :meth:`inputs`' parts go through the bottom layers."""
        indices, index = [], 0
        for group in self.layout["groups"]:
            if group["kind"] == "continuous":
                indices.append(index)
                index += 1
            else:
                index += len(group["columns"])
        return indices

    def forward(self, parts: list[np.ndarray]) -> np.ndarray:
        """The dense layers over :meth:`inputs`' parts: the bottom layers on each
        continuous block, everything concatenated through the top layers and the sigmoid."""
        hidden = list(parts)
        for index in self.continuous_parts:
            for layer in self.layout["bottom"]:
                hidden[index] = self._dense(hidden[index], layer, "relu")
        x = np.concatenate(hidden, axis=1).astype(np.float32)
        for layer in self.layout["top"]:
            x = self._dense(x, layer, "relu")
        return self._dense(x, self.layout["output"], "sigmoid").reshape(-1)

    def _embedded(self, groups: Mapping[str, np.ndarray], lookup: Lookup
                  ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Each embedded column's ids ([rows, per column]) and their vectors ([rows, per
        column, width]): one lookup per table of the distinct ids of all its columns."""
        by_table: dict[str, list[tuple[str, np.ndarray]]] = {}
        for group in self.layout["groups"]:
            if group["kind"] == "continuous":
                continue
            block = np.asarray(groups[group["name"]]).astype(np.int64)
            per = group["per_column"]
            for index, column in enumerate(group["columns"]):
                ids = block[:, index * per:(index + 1) * per]
                by_table.setdefault(column["table"], []).append((column["name"], ids))
        embedded = {}
        for table, columns in by_table.items():
            distinct, inverse = np.unique(np.concatenate([ids.reshape(-1) for _, ids in columns]),
                                          return_inverse=True)
            found = lookup(table, distinct)[inverse]
            start = 0
            for name, ids in columns:
                embedded[name] = (ids, found[start:start + ids.size].reshape(*ids.shape, -1))
                start += ids.size
        return embedded


@dataclass(frozen=True)
class TreeModel:
    """The gradient-boosted trees ``featureline train`` exports beside the dense part (the
    ``[gbdt]`` extra): LightGBM's own predictor over the examples' columns by name, one
    thread."""

    layout: dict[str, Any]
    booster: Any

    @classmethod
    def load(cls, folder: str | Path) -> TreeModel:
        folder = Path(folder)
        try:
            layout = json.loads((folder / TREES_LAYOUT).read_text())
        except (OSError, ValueError) as exc:
            raise ModelFileError(folder / TREES_LAYOUT, f"not readable: {exc}") from None
        try:
            import lightgbm
        except ImportError:
            raise ModelFileError(folder / TREES_MODEL, "lightgbm is not installed: pip "
                                 "install 'featureline[gbdt]' to serve the trees") from None
        try:
            booster = lightgbm.Booster(model_str=(folder / TREES_MODEL).read_text())
        except (OSError, lightgbm.basic.LightGBMError) as exc:
            raise ModelFileError(folder / TREES_MODEL, f"not readable: {exc}") from None
        return cls(layout, booster)

    @property
    def version(self) -> str:
        return str(self.layout["version"])

    @property
    def versions(self) -> dict[str, Any]:
        return dict(self.layout.get("versions", {}))

    def rank(self, features: Mapping[str, np.ndarray], groups: Mapping[str, np.ndarray],
             lookup: Lookup) -> np.ndarray:
        return self.predict(features)

    def predict(self, columns: Mapping[str, Any]) -> np.ndarray:
        """The score per row of ``columns`` (name → values; model-ready, as the examples
        hold them). A categorical value is its category's code among the training split's
        (LightGBM's own mapping of a pandas column, done in NumPy); one training never saw
        is missing to the trees."""
        rows = len(columns[self.layout["columns"][0]])
        matrix = np.empty((rows, len(self.layout["columns"])), dtype=np.float64)
        for index, name in enumerate(self.layout["columns"]):
            values = np.asarray(columns[name])
            if name in self._categories:
                known = self._categories[name]
                codes = np.searchsorted(known, values).clip(0, max(len(known) - 1, 0))
                found = (known[codes] == values) if len(known) else np.zeros(rows, bool)
                matrix[:, index] = np.where(found, codes, np.nan)
            else:
                matrix[:, index] = values
        return np.asarray(self.booster.predict(matrix, num_threads=1), dtype=np.float64)

    @functools.cached_property
    def _categories(self) -> dict[str, np.ndarray]:
        """Each categorical column's training categories (sorted), as the booster keeps
        them."""
        kept = self.booster.pandas_categorical or []
        return {name: np.asarray(values) for name, values
                in zip(self.layout["categorical"], kept, strict=True)}


# A model /v1/rank scores with.
Ranker = DenseModel | TreeModel


def load_rankers(folder: str | Path) -> dict[str, Ranker]:
    """The models exported in ``folder``, by name: the dense part, and the trees when they
    were exported; none without a dense part."""
    folder = Path(folder)
    try:
        dense = DenseModel.load(folder)
    except ModelNotExportedError:
        return {}
    models: dict[str, Ranker] = {dense.layout["model"]: dense}
    if (folder / TREES_LAYOUT).exists():
        trees = TreeModel.load(folder)
        models[trees.layout["model"]] = trees
    return models
