"""The trained embedding tables for the parameter server: HugeCTR's sparse-model layout
(``key`` int64, ``emb_vector`` float32, rows = encoded ids) and an ``hps.yaml`` that imports
them, each table tagged with the vocabulary version whose ids key its rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import yaml

from core.metadata import encoded_name
from hps.formats import write_hugectr
from trainer.model import embedding_tables, table_weights

HPS_CONFIG = "hps.yaml"


def table_names(metadata: dict[str, Any]) -> dict[str, str]:
    """Owner feature → exported table name: the entity's name for an entity's ids (``user``,
    ``item``: what the API's ranking call reads), the feature's own name otherwise."""
    entities = {encoded_name(e["join_key"]): name for name, e in metadata["entities"].items()}
    return {owner: entities.get(owner, owner) for owner in embedding_tables(metadata)}


def vocabulary_version(metadata: dict[str, Any], owner: str) -> str | None:
    """The version of the vocabulary that assigned ``owner``'s ids; None for hashed ids,
    which no vocabulary assigns."""
    for column, entry in (metadata.get("vocabularies") or {}).items():
        if encoded_name(column) == owner:
            return entry["version"]
    return None


def export(model: Any, metadata: dict[str, Any], out: Path, model_name: str = "ranker"
           ) -> Path:
    """Every embedding table of ``model`` under ``out/tables/<name>`` and ``out/hps.yaml``;
    the config's path. The parameter server imports a table again when its files change."""
    names = table_names(metadata)
    tables = []
    for owner, spec in embedding_tables(metadata).items():
        folder = (out / "tables" / names[owner]).resolve()
        write_hugectr(folder, np.arange(spec.rows, dtype=np.int64), table_weights(model, owner))
        tables.append({"name": names[owner], "dim": spec.width, "source": str(folder),
                       "vocabulary_version": vocabulary_version(metadata, owner)})
    config = out / HPS_CONFIG
    config.write_text(yaml.safe_dump({
        "models": [{"name": model_name, "cache_fraction": 0.5, "tables": tables}],
        "persistent_db": {"path": str((out / "rocksdb").resolve())}}, sort_keys=False))
    return config
