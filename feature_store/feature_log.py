"""The feature log's format: what the API writes (``api/feature_log.py``) and what
``featureline consistency`` and ``training-set --from-log`` read (docs/ARCHITECTURE.md,
"Feature logging").

One Parquet row per entity row served. Columns: ``request_id``, ``request_time`` (UTC, µs),
``endpoint``, ``service``, ``dataset_version``, ``embedding_versions`` (JSON: table →
vocabulary version), the join keys (text; null where the row has none: ``user_id``,
``item_id``, then the aggregation groups' other key columns, e.g. ``category``), per feature
view ``<view>__timestamp`` (the served row's event timestamp: the batch snapshot's, or the
stream processor's), and per feature of the repository its value and ``<feature>__status``
(present / not_found / outside_ttl; null where the row did not ask for it) — every
aggregation group's too, as ``<group>:<feature>`` (no timestamp: each is its value at the
request time). A ``/v1/model-inputs`` or ``/v1/rank`` request's rows are its candidates:
each example feature served as ``input:<feature>`` and the request's columns as JSON
(``inputs_context``: ``context``, the candidate's ``item_context`` values, and ``served_at``:
when it was answered, Unix seconds; ``request_time`` is the time the row holds at). Files are
published whole under ``date=YYYY-MM-DD/`` folders; hidden names are files being written.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
from feast.type_map import feast_value_type_to_pa

from featureline.feature_store.errors import FeatureStoreError

KEYS = ("user_id", "item_id")
# The request's columns, first in every row (no group's key column takes one of these names).
REQUEST_COLUMNS = {"request_id": pa.string(), "request_time": pa.timestamp("us", tz="UTC"),
                   "endpoint": pa.string(), "service": pa.string(),
                   "dataset_version": pa.string(), "embedding_versions": pa.string()}
STATUS_SUFFIX = "__status"
# A served model input's column, and the request columns it was computed with.
INPUT_PREFIX = "input:"
INPUTS_CONTEXT = "inputs_context"
TIMESTAMP_SUFFIX = "__timestamp"
# The latest consistency report's metrics (Prometheus text), in the log's folder: the API
# exports them with its own.
REPORT_METRICS = "consistency.prom"


class FeatureLogError(FeatureStoreError):
    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        super().__init__(f"feature log {path}: {reason}")


def feature_types(views: Mapping[str, Any]) -> dict[str, tuple[str, pa.DataType]]:
    """Every feature of the repository's Feast views → its view and Arrow type."""
    return {field.name: (view.name, feast_value_type_to_pa(field.dtype.to_value_type()))
            for view in views.values() for field in view.features}


def logged_aggregations(group_views: Mapping[str, Any], join_keys: Callable[[str], list[str]]
                        ) -> tuple[dict[str, tuple[str, pa.DataType]], dict[str, list[str]]]:
    """The aggregations the log holds — every group's but one keyed by a column named as a
    request column (``REQUEST_COLUMNS``) — as ``<group>:<feature>`` → its group and Arrow
    type; and each such group's key columns."""
    features, keys = {}, {}
    for group, view in group_views.items():
        columns = join_keys(group)
        if any(column in REQUEST_COLUMNS for column in columns):
            continue
        keys[group] = columns
        features.update({f"{group}:{field.name}": (group, feast_value_type_to_pa(
            field.dtype.to_value_type())) for field in view.features})
    return features, keys


def input_types(features: Sequence[Mapping[str, Any]]) -> dict[str, pa.DataType]:
    """Each example feature (metadata.json's ``features``) → its Arrow type in the log: a
    multi-hot list's ids as a list."""
    types = {"int64": pa.int64(), "float32": pa.float32()}
    return {f["name"]: pa.list_(types[f["dtype"]]) if f["kind"] == "multi_hot"
            else types[f["dtype"]] for f in features}


def key_columns(group_keys: Mapping[str, Sequence[str]] | None = None) -> list[str]:
    """The log's key columns: ``KEYS``, then the groups' other key columns by name."""
    more = {column for columns in (group_keys or {}).values() for column in columns}
    return [*KEYS, *sorted(more - set(KEYS))]


def log_schema(features: Mapping[str, tuple[str, pa.DataType]],
               aggregations: Mapping[str, tuple[str, pa.DataType]] | None = None,
               group_keys: Mapping[str, Sequence[str]] | None = None,
               inputs: Mapping[str, pa.DataType] | None = None) -> pa.Schema:
    """The log's columns for the repository's features (name → its view and Arrow type),
    ``aggregations`` keyed by ``group_keys`` (those of :func:`logged_aggregations`) and the
    model's ``inputs`` (:func:`input_types`)."""
    fields = [*(pa.field(name, kind) for name, kind in REQUEST_COLUMNS.items()),
              *(pa.field(key, pa.string()) for key in key_columns(group_keys))]
    for view in dict.fromkeys(view for view, _ in features.values()):
        fields.append(pa.field(f"{view}{TIMESTAMP_SUFFIX}", pa.timestamp("s", tz="UTC")))
    for name, (_, dtype) in {**features, **(aggregations or {})}.items():
        fields += [pa.field(name, dtype), pa.field(f"{name}{STATUS_SUFFIX}", pa.string())]
    if inputs:
        fields.append(pa.field(INPUTS_CONTEXT, pa.string()))
        fields += [pa.field(f"{INPUT_PREFIX}{name}", dtype) for name, dtype in inputs.items()]
    return pa.schema(fields)


def log_files(log: str | Path) -> str:
    """A glob of the published files of a feature log folder (or the one file given)."""
    path = Path(log)
    if path.is_file():
        return str(path)
    if not path.is_dir():
        raise FeatureLogError(str(path), "no such file or folder")
    if not any(path.rglob("*.parquet")):
        raise FeatureLogError(str(path), "holds no .parquet files")
    return str(path / "**" / "*.parquet")


def quoted(name: str) -> str:
    """A column name as a SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


def literal(text: str) -> str:
    """Text as a SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


def open_log(connection: Any, log: str | Path) -> list[str]:
    """The view ``log`` over a feature log's files, in a DuckDB connection (UTC); its
    columns."""
    connection.execute("SET TimeZone = 'UTC'")
    connection.execute(f"CREATE VIEW log AS SELECT * FROM read_parquet({literal(log_files(log))}, "
                       "union_by_name = true, hive_partitioning = false)")
    return [row[0] for row in connection.execute("DESCRIBE log").fetchall()]
