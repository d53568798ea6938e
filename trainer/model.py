"""The model, from metadata.json alone: one embedding table per categorical feature (width
and rows from the embedding plan; a feature that ``shares`` another's ids uses its table),
multi-hot lists as a masked mean of their rows, the continuous block through a bottom MLP,
everything concatenated into a top MLP that predicts the label (DLRM with its "cat"
interaction: the tables may have different widths)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from featureline.core.metadata import FIRST_ID, OOV_ID, PADDING_ID, Metadata, TfrecordGroup, present

LABEL_KIND = "label"
# The layers' names: the continuous block's MLP, the one over everything, the score.
BOTTOM = "bottom_"
TOP = "top_"
OUTPUT = "score"


@dataclass(frozen=True)
class TableSpec:
    """One embedding table: the categorical feature that owns it and those that share it."""

    owner: str
    rows: int
    width: int
    features: tuple[str, ...]


def tfrecord_groups(metadata: Metadata) -> dict[str, TfrecordGroup]:
    """The TFRecord groups; a :class:`KeyError` when the job wrote no TFRecords."""
    if metadata.tfrecord is None:
        raise KeyError("metadata.json has no 'tfrecord' section: the job ran with "
                       "etl.tfrecord.enabled: false")
    return metadata.tfrecord.groups


def label_group(metadata: Metadata) -> str:
    """The TFRecord group holding the label."""
    return next(name for name, group in tfrecord_groups(metadata).items()
                if group.columns == [present(metadata.label, metadata, "label").name])


def input_groups(metadata: Metadata) -> dict[str, TfrecordGroup]:
    """The TFRecord groups the model reads: every one but the label's, in order."""
    return {name: group for name, group in tfrecord_groups(metadata).items()
            if name != label_group(metadata)}


def embedding_tables(metadata: Metadata) -> dict[str, TableSpec]:
    """Owner feature → its table, in metadata.json's feature order."""
    plan = present(metadata.embedding_plan, metadata, "embedding_plan").features
    users: dict[str, list[str]] = {}
    for feature in metadata.features:
        if feature.kind in ("categorical", "multi_hot"):
            users.setdefault(feature.shares or feature.name, []).append(feature.name)
    return {owner: TableSpec(owner, plan[owner].cardinality, plan[owner].width, tuple(names))
            for owner, names in users.items()}


def column_owners(tables: dict[str, TableSpec]) -> dict[str, str]:
    """Each embedded feature → the owner of the table it reads."""
    return {name: spec.owner for spec in tables.values() for name in spec.features}


def build_model(metadata: Metadata, bottom: tuple[int, ...] = (64, 32),
                top: tuple[int, ...] = (256, 128), seed: int = 0) -> Any:
    """The Keras model; its inputs are the TFRecord groups as
    ``featureline.etl.tfrecord.dataset(grouped=True)`` gives them, less the label's."""
    import keras
    from keras import layers, ops

    keras.utils.set_random_seed(seed)
    kinds = {f.name: f.kind for f in metadata.features}
    tables = embedding_tables(metadata)
    owner_of = column_owners(tables)
    embeddings = {owner: layers.Embedding(spec.rows, spec.width, name=f"emb_{owner}")
                  for owner, spec in tables.items()}
    groups = input_groups(metadata)
    inputs = {name: keras.Input(shape=(group.width,), name=name,
                                dtype="float32" if group.dtype == "float32" else "int64")
              for name, group in groups.items()}
    parts = []
    for name, group in groups.items():
        block = inputs[name]
        columns = group.columns
        kind = kinds[columns[0]]
        if kind == "continuous":
            dense = block
            for index, units in enumerate(bottom):
                dense = layers.Dense(units, activation="relu", name=f"{BOTTOM}{index}")(dense)
            parts.append(dense)
            continue
        per_column = group.width // len(columns)
        for index, column in enumerate(columns):
            ids = block[:, index * per_column:(index + 1) * per_column]
            vectors = embeddings[owner_of[column]](ids)  # [batch, per_column, width]
            if kind == "categorical":
                parts.append(ops.squeeze(vectors, axis=1))
            else:  # multi-hot: the mean of the rows that are not padding
                mask = ops.expand_dims(ops.cast(ops.not_equal(ids, PADDING_ID), "float32"), -1)
                total = ops.sum(vectors * mask, axis=1)
                parts.append(total / ops.maximum(ops.sum(mask, axis=1), 1.0))
    hidden = layers.Concatenate(name="interaction")(parts)
    for index, units in enumerate(top):
        hidden = layers.Dense(units, activation="relu", name=f"{TOP}{index}")(hidden)
    output = layers.Dense(1, activation="sigmoid", name=OUTPUT)(hidden)
    return keras.Model(inputs=inputs, outputs=output, name="featureline_dlrm")


def table_weights(model: Any, owner: str) -> Any:
    """The trained rows of ``owner``'s table, [rows, width] float32."""
    return model.get_layer(f"emb_{owner}").embeddings.value.numpy()


def reached_rows(metadata: Metadata, columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Owner feature → which rows of its table ``columns`` (long name → ids, as
    ``read_numpy`` gives a split) read: the rows that training on them moves. A multi-hot
    list's padding is masked out: it reads nothing."""
    kinds = {f.name: f.kind for f in metadata.features}
    reached = {}
    for owner, spec in embedding_tables(metadata).items():
        seen = np.zeros(spec.rows, dtype=bool)
        for name in spec.features:
            ids = np.asarray(columns[name], dtype=np.int64).reshape(-1)
            if kinds[name] == "multi_hot":
                ids = ids[ids != PADDING_ID]
            seen[ids] = True
        reached[owner] = seen
    return reached


def settle_unreached(model: Any, reached: dict[str, np.ndarray]) -> dict[str, int]:
    """Give every row of ``model``'s tables that no training example read (ids from
    ``FIRST_ID`` on: a value a kept fit numbered after the training days, an unused hash
    bucket) the out-of-vocabulary row's vector: the model scores a value it never trained on
    as out of vocabulary, as a new fit's ids give it, not by a random initial vector of its
    own (docs/ARCHITECTURE.md, "Fits"). Owner → rows set."""
    settled = {}
    for owner, seen in reached.items():
        layer = model.get_layer(f"emb_{owner}")
        unreached = ~seen
        unreached[:FIRST_ID] = False
        settled[owner] = int(unreached.sum())
        if settled[owner]:
            weights = np.array(layer.embeddings.value.numpy())
            weights[unreached] = weights[OOV_ID]
            layer.embeddings.assign(weights)
    return settled


def blank_value(kind: str) -> float:
    """What an input is held at when a model is trained without it: a value that says
    nothing — a standardised column's mean (0), the out-of-vocabulary id, a list of padding."""
    return {"continuous": 0.0, "categorical": float(OOV_ID), "multi_hot": float(PADDING_ID)}[kind]


@dataclass(frozen=True)
class Blank:
    """The features a model is trained and scored without (``featureline lift``): each held
    at its :func:`blank_value` in every row, so the model keeps its shape and learns nothing
    from them."""

    metadata: Metadata
    features: tuple[str, ...]

    @functools.cached_property
    def _kinds(self) -> dict[str, str]:
        return {f.name: f.kind for f in self.metadata.features}

    @functools.cached_property
    def _masks(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Per TFRecord group holding a blanked feature: which positions, and their values."""
        found = {}
        for name, group in tfrecord_groups(self.metadata).items():
            hit = [c for c in group.columns if c in self.features]
            if not hit:
                continue
            per_column = group.width // len(group.columns)
            mask = np.zeros(group.width, dtype=bool)
            fill = np.zeros(group.width, dtype=np.float32 if group.dtype == "float32"
                            else np.int64)
            for column in hit:
                at = group.columns.index(column) * per_column
                mask[at:at + per_column] = True
                fill[at:at + per_column] = blank_value(self._kinds[column])
            found[name] = (mask[None, :], fill[None, :])
        return found

    def columns(self, columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``columns`` (name → ids or values, as ``read_numpy`` gives a split), blanked."""
        return {name: (np.full_like(values, blank_value(self._kinds[name]))
                       if name in self.features else values)
                for name, values in columns.items()}

    def blocks(self, blocks: dict[str, Any]) -> dict[str, Any]:
        """A batch of grouped blocks (``dataset(grouped=True)``), blanked: a TensorFlow map."""
        import tensorflow as tf

        blanked = dict(blocks)
        for name, (mask, fill) in self._masks.items():
            blanked[name] = tf.where(mask, fill, blocks[name])
        return blanked
