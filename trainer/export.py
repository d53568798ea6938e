"""The trained model for serving: its embedding tables for the parameter server (HugeCTR's
sparse-model layout: ``key`` int64, ``emb_vector`` float32, rows = encoded ids) and an
``hps.yaml`` that imports them, each table tagged with the vocabulary version whose ids key its
rows and the fit of the examples it was trained on; and beside them its dense part
(``core.scoring``: the layers' weights and which table each column reads), which the API runs
without TensorFlow."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import yaml

from featureline.core.metadata import Metadata, encoded_name
from featureline.core.scoring import write_dense
from featureline.hps.config import HpsConfig
from featureline.hps.formats import write_hugectr
from featureline.trainer.model import (
    BOTTOM,
    OUTPUT,
    TOP,
    column_owners,
    embedding_tables,
    input_groups,
    table_weights,
)

HPS_CONFIG = "hps.yaml"


def table_names(metadata: Metadata) -> dict[str, str]:
    """Owner feature → exported table name: the entity's name for an entity's ids (``user``,
    ``item``: what the API's ranking call reads), the feature's own name otherwise."""
    entities = {encoded_name(e.join_key): name for name, e in metadata.entities.items()}
    return {owner: entities.get(owner, owner) for owner in embedding_tables(metadata)}


def vocabulary_version(metadata: Metadata, owner: str) -> str | None:
    """The version of the vocabulary that assigned ``owner``'s ids; None for hashed ids,
    which no vocabulary assigns."""
    for column, entry in metadata.vocabularies.items():
        if encoded_name(column) == owner:
            return entry.version
    return None


def write_tables(out: Path, tables: dict[str, tuple[np.ndarray, str | None]],
                 model_name: str = "ranker", template: HpsConfig | None = None,
                 fit_version: str | None = None) -> Path:
    """Each table (name → [rows, dim] vectors keyed by row number, its vocabulary version)
    under ``out/tables/<name>``, and ``out/hps.yaml`` importing them, each table tagged with
    ``fit_version``; the config's path. The parameter server imports a table again when its
    files change.

    ``template``: the deployment's parameter-server settings (tiers, update streams, other
    models), kept in the written hps.yaml, where ``model_name``'s tables become these (the
    model is added when the template has none of that name)."""
    entries = []
    for name, (vectors, version) in tables.items():
        folder = (out / "tables" / name).resolve()
        write_hugectr(folder, np.arange(len(vectors), dtype=np.int64), vectors)
        entries.append({"name": name, "dim": int(vectors.shape[1]), "source": str(folder),
                        "vocabulary_version": version, "fit_version": fit_version})
    if template is None:
        settings: dict[str, Any] = {
            "models": [{"name": model_name, "cache_fraction": 0.5, "tables": entries}],
            "persistent_db": {"path": str((out / "rocksdb").resolve())}}
    else:
        settings = template.model_dump(mode="json", exclude_unset=True)
        models = settings["models"]
        model = next((m for m in models if m["name"] == model_name), None)
        if model is None:
            models.append(model := {"name": model_name})
        model["tables"] = entries
    HpsConfig.model_validate(settings)
    config = out / HPS_CONFIG
    config.write_text(yaml.safe_dump(settings, sort_keys=False))
    return config


def export(model: Any, metadata: Metadata, out: Path, model_name: str = "ranker",
           template: HpsConfig | None = None) -> Path:
    """Every embedding table of ``model``, named by :func:`table_names` and tagged with its
    vocabulary version and the output's fit (:func:`write_tables`), and its dense part
    (:func:`export_dense`)."""
    names = table_names(metadata)
    tables = {names[owner]: (table_weights(model, owner), vocabulary_version(metadata, owner))
              for owner in embedding_tables(metadata)}
    config = write_tables(out, tables, model_name, template,
                          metadata.fit.version if metadata.fit else None)
    export_dense(model, metadata, out, model_name,
                 {name: vectors for name, (vectors, _) in tables.items()})
    return config


def export_dense(model: Any, metadata: Metadata, out: Path, model_name: str = "ranker",
                 tables: dict[str, np.ndarray] | None = None) -> Path:
    """The dense part of ``model`` (``core.scoring``): per input group its kind and, per
    column, the exported table it reads; the bottom, top and output layers' weights; the
    versions of the data it was trained on; the model's version (of these weights and the
    exported ``tables``)."""
    names = table_names(metadata)
    owner_of = column_owners(embedding_tables(metadata))
    kinds = {f.name: f.kind for f in metadata.features}
    groups = []
    for name, group in input_groups(metadata).items():
        kind = kinds[group.columns[0]]
        groups.append({"name": name, "kind": kind, "width": group.width,
                       "per_column": group.width // len(group.columns),
                       "columns": [{"name": column,
                                    "table": names.get(owner_of.get(column, ""))}
                                   for column in group.columns]})
    layers = [layer.name for layer in model.layers]
    bottom = sorted((n for n in layers if n.startswith(BOTTOM)), key=lambda n: int(n[len(BOTTOM):]))
    top = sorted((n for n in layers if n.startswith(TOP)), key=lambda n: int(n[len(TOP):]))
    weights = {}
    for layer in [*bottom, *top, OUTPUT]:
        kernel, bias = model.get_layer(layer).get_weights()
        weights[f"{layer}/kernel"], weights[f"{layer}/bias"] = kernel, bias
    versions = {"dataset": metadata.dataset.version if metadata.dataset else None,
                "fit": metadata.fit.version if metadata.fit else None,
                "vocabularies": {c: v.version for c, v in metadata.vocabularies.items()}}
    return write_dense(out, {"model": model_name, "groups": groups, "bottom": bottom, "top": top,
                             "output": OUTPUT, "versions": versions}, weights, tables)
