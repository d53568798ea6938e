"""Offline scores: an ETL output's examples scored with an exported model — its dense part
(``core.scoring``, the runtime ``/v1/rank`` uses) over its exported tables — written as
Parquet beside the examples' keys and labels. The reference of the served scores, and batch scoring.
No TensorFlow."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from featureline.core.errors import ConfigError
from featureline.core.metadata import read_metadata
from featureline.core.scoring import ModelNotExportedError, TreeModel, load_rankers
from featureline.hps.config import load_hps_config
from featureline.hps.formats import read_hugectr
from featureline.trainer.export import HPS_CONFIG

SCORE = "score"
# Rows scored at a time.
BATCH_ROWS = 65_536


def _tables(model_dir: Path, model_name: str) -> dict[str, tuple[np.ndarray, float]]:
    """The exported tables of ``model_name``: name → (vectors by row, the default vector's
    value for an id without a row, as the parameter server answers it)."""
    config = load_hps_config(model_dir / HPS_CONFIG)
    model = next((m for m in config.models if m.name == model_name), None)
    if model is None:
        raise ConfigError("--model", f"{model_dir / HPS_CONFIG} holds no model {model_name!r}")
    tables = {}
    for table in model.tables:
        if table.source is None:
            raise ConfigError("--model", f"table {table.name} has no source to read")
        keys, vectors = read_hugectr(table.source, table.dim)
        rows = np.full((int(keys.max()) + 1 if len(keys) else 0, table.dim),
                       table.default_value, dtype=np.float32)
        rows[keys] = vectors
        tables[table.name] = (rows, table.default_value)
    return tables


def score(data: str | Path, model_dir: str | Path, split: str = "valid",
          name: str | None = None) -> pa.Table:
    """The keys (``metadata.keys``) of ``data``'s ``split`` examples, their label and each
    one's score by the model ``name`` exported in ``model_dir`` (default: its dense part;
    ``<name>-gbdt``: the trees)."""
    data, model_dir = Path(data), Path(model_dir)
    metadata = read_metadata(data)
    models = load_rankers(model_dir)
    if not models:
        raise ModelNotExportedError(model_dir)
    model = models.get(name) if name else next(iter(models.values()))
    if model is None:
        raise ConfigError("--model-name", f"{model_dir} holds no model {name!r}; it holds "
                          f"{', '.join(sorted(models))}")
    if isinstance(model, TreeModel):
        trees = model
        columns = list(trees.layout["columns"])

        def rank(batch: pa.RecordBatch) -> np.ndarray:
            return trees.predict({c: batch.column(c).to_numpy(zero_copy_only=False)
                                  for c in columns})
    else:
        dense = model
        tables = _tables(model_dir, dense.layout["model"])

        def lookup(table: str, ids: np.ndarray) -> np.ndarray:
            rows, default = tables[table]
            inside = ids < len(rows)
            vectors = np.full((len(ids), rows.shape[1]), default, dtype=np.float32)
            vectors[inside] = rows[ids[inside]]
            return vectors

        columns = [c["name"] for g in dense.layout["groups"] for c in g["columns"]]

        def rank(batch: pa.RecordBatch) -> np.ndarray:
            groups = {}
            for group in dense.layout["groups"]:
                blocks = [np.asarray(batch.column(c["name"]).to_pylist()
                                     ).reshape(batch.num_rows, -1) for c in group["columns"]]
                groups[group["name"]] = np.hstack(blocks)
            return dense.scores(groups, lookup)

    kept = [*metadata.keys, *([metadata.label.name] if metadata.label else [])]
    examples = ds.dataset(data / "examples", format="parquet", partitioning="hive")
    table = examples.to_table(columns=list(dict.fromkeys([*kept, *columns])),
                              filter=pc.field("split") == split)
    scores = [rank(batch) for batch in table.to_batches(BATCH_ROWS)]
    keys = table.select(kept)
    values = np.concatenate(scores) if scores else np.zeros(0, dtype=np.float32)
    return keys.append_column(SCORE, pa.array(values.astype(np.float32), pa.float32()))


def write_scores(data: str | Path, model_dir: str | Path, out: str | Path,
                 split: str = "valid", name: str | None = None) -> int:
    """:func:`score` written to ``out`` (Parquet); the rows written."""
    scored = score(data, model_dir, split, name)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(scored, out)
    return scored.num_rows
